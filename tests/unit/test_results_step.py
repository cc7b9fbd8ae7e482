"""How rank 0 judges a task's result (broker/results.py), table-driven: what each result is (`sort`) and what one
that ends its task means for the job (`final`); then one `done` batch of several jobs carried out by the real
Execution (tests/unit/core_rig.py), and the records of the `done` and `run` rows (minicluster/proto/rows.py).

The tables restate protocol.md §2.5, §2.9 and §2.10 independently of the code, so a change of rules is made here
too, on purpose.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker import results
from broker.flow.state import Flow
from broker.job import Job, State
from broker.results import Failure, Final, Verdict
from minicluster.proto.envelope import BadMessage
from minicluster.proto.rows import Result, TaskEntry, result_row
from minicluster.testing import job
from tests.unit import core_rig
from tests.unit.core_rig import Core

RANK = 1  # the rank every result below comes from
NOW = 2000.0


def result(task: int = 0, status: int = 0, *, error: str | None = None, attempt: int = 0, job_id: int = 7,
           ended: float | None = 1500.0) -> Result:
    exit_code, sig = (status, None) if status < 128 else (None, status - 128)
    return Result(job_id, task, status, exit_code, sig, error, 1400.0, ended, attempt)


def plain(ntasks: int = 1, state: State = State.RUN, **fields: Any) -> Job:
    record = job(7, ntasks=ntasks, **fields)
    record.state = state
    return record


def array(state: State = State.RUN, **fields: Any) -> Job:
    record = job(7, array="0-3", **fields)
    record.state = state
    return record


def recorded(record: Job, task: int = 0) -> Job:
    record.mark_done(task)
    return record


def with_flow(record: Job, attempt: int = 0, attempts: dict[int, int] | None = None) -> Job:
    """A job under a workflow (retries, success policy, requeues: broker/flow/workflow.py gives it a Flow)."""
    record.flow = Flow(record.spec)
    record.flow.attempt = attempt
    record.flow.attempts = dict(attempts or {})
    return record


def ending(record: Job) -> Job:
    record.cause_status = 143  # an event decided the job's end (cancel, failure policy, success met)
    return record


# name: (job, running rank of its task or None, strays of the reporting rank, the result, verdict)
SORT: dict[str, tuple[Callable[[], Job | None], int | None, set[tuple[int, int]], Result, Verdict]] = {
    "success of the task running there": (plain, RANK, set(), result(), Verdict.FINAL),
    "failure of the task running there": (plain, RANK, set(), result(status=2), Verdict.FINAL),
    "an array element's failure": (array, RANK, set(), result(task=3, status=1), Verdict.FINAL),
    "a result of a task rank 0 does not track (reattach)": (plain, None, set(), result(), Verdict.FINAL),
    "a job rank 0 does not have (purged)": (lambda: None, None, set(), result(), Verdict.PURGED),
    "a job that ended": (lambda: plain(state=State.INACTIVE), None, set(), result(), Verdict.PURGED),
    "a task past the job's last": (lambda: plain(2), None, set(), result(task=2), Verdict.PURGED),
    "a negative task": (plain, None, set(), result(task=-1), Verdict.PURGED),
    "late: recorded already, running nowhere (re-sent)": (lambda: recorded(plain()), None, set(), result(),
                                                          Verdict.DUPLICATE),
    "recorded already, running elsewhere": (lambda: recorded(array()), 2, set(), result(), Verdict.DUPLICATE),
    "recorded already, and run here again from the window": (lambda: recorded(array()), RANK, set(), result(),
                                                              Verdict.SECOND_RUN),
    "from the wrong rank: rank 0 runs it on another": (plain, 2, set(), result(status=1), Verdict.REPLACED),
    "wrong rank wins over a stray mark": (plain, 2, {(7, 0)}, result(), Verdict.REPLACED),
    "from a stray killed at the rank's join": (plain, None, {(7, 0)}, result(status=137), Verdict.STRAY),
    "a stray of another task of the job": (plain, None, {(7, 1)}, result(), Verdict.FINAL),
    "a stray mark does not hide a run rank 0 tracks there": (plain, RANK, {(7, 0)}, result(), Verdict.FINAL),
    "workflow array: exit 0 with nothing to judge": (lambda: with_flow(array()), RANK, set(), result(task=1),
                                                     Verdict.FINAL),
    "workflow array: a failure to judge (retry?)": (lambda: with_flow(array()), RANK, set(), result(status=1),
                                                    Verdict.JUDGE),
    "workflow array: the element's current attempt": (lambda: with_flow(array(), attempts={2: 3}), RANK, set(),
                                                      result(task=2, status=1, attempt=3), Verdict.JUDGE),
    "workflow array: an older attempt's straggler": (lambda: with_flow(array(), attempts={2: 3}), RANK, set(),
                                                     result(task=2, status=1, attempt=2), Verdict.STALE),
    "workflow plain job: every exit is judged": (lambda: with_flow(plain(2)), RANK, set(), result(), Verdict.JUDGE),
    "workflow plain job: an older attempt": (lambda: with_flow(plain(2), attempt=1), RANK, set(), result(),
                                             Verdict.STALE),
    "a stray is not judged": (lambda: with_flow(array()), None, {(7, 0)}, result(status=1), Verdict.STRAY),
}


@pytest.mark.parametrize("name", SORT)
def test_sort_says_what_each_result_is(name: str) -> None:
    make, running_rank, strays, res, verdict = SORT[name]
    record = make()
    before = None if record is None else (record.state, bytes(record.done_bits or b""), record.running)
    assert results.sort(RANK, res, record, running_rank, strays) is verdict
    assert before == (None if record is None else (record.state, bytes(record.done_bits or b""), record.running)), \
        "sort changes nothing"


def note(status: int) -> str:
    return f"task 0 on rank {RANK} exited with status {status}"


# name: (job, the result, judged (counted, cancelled), preempted, what it means)
FINAL: dict[str, tuple[Callable[[], Job], Result, tuple[int, bool] | None, bool, Final]] = {
    "success": (plain, result(), None, False, Final(0, False, False, None)),
    "failure: the job hears of it at its end time": (
        plain, result(status=2), None, False,
        Final(2, False, False, Failure((2, note(2)), 1500.0, decides=True, reason=False))),
    "failure without an end time: now": (
        plain, result(status=2, ended=None), None, False,
        Final(2, False, False, Failure((2, note(2)), NOW, decides=True, reason=False))),
    "a task that could not run: its error becomes the job's reason": (
        plain, result(status=127, error="no such file"), None, False,
        Final(127, False, False, Failure((127, f"task 0 on rank {RANK}: no such file"), 1500.0, True, True))),
    "an error when the job has a reason already": (
        lambda: _with_reason(plain()), result(status=127, error="no such file"), None, False,
        Final(127, False, False, Failure((127, f"task 0 on rank {RANK}: no such file"), 1500.0, True, False))),
    "an array element names its index": (
        array, result(task=3, status=1), None, False,
        Final(1, False, False, Failure((1, f"index 3 on rank {RANK} exited with status 1"), 1500.0, True, False))),
    "a failure while the job ends is a consequence, not news": (
        lambda: ending(plain()), result(status=143), None, False, Final(143, False, False, None)),
    "preempted: counted as cancelled, no failure": (
        array, result(status=143), None, True, Final(143, True, False, None)),
    "retry policy: cancelled as the job ends (judged)": (
        lambda: with_flow(array()), result(status=143), (143, True), False, Final(143, True, False, None)),
    "retry policy: a failure the policy lets pass counts 0, still reported": (
        lambda: with_flow(array()), result(status=3), (0, False), False,
        Final(0, False, False, Failure((3, f"index 0 on rank {RANK} exited with status 3"), 1500.0, True, False))),
    "success_task job: another task's failure does not decide": (
        lambda: plain(3, success_task=0), result(task=1, status=1), None, False,
        Final(1, False, False, Failure((1, f"task 1 on rank {RANK} exited with status 1"), 1500.0, False, False))),
    "success_task job: the success task's failure decides": (
        lambda: plain(3, success_task=0), result(status=1), None, False,
        Final(1, False, False, Failure((1, note(1)), 1500.0, True, False))),
    "a single job that started ahead before a restart (still queued)": (
        lambda: plain(state=State.SCHED), result(), None, False, Final(0, False, True, None)),
    "an array element of a queued array did not start ahead": (
        lambda: array(state=State.SCHED), result(), None, False, Final(0, False, False, None)),
}


def _with_reason(record: Job) -> Job:
    record.reason = "an earlier failure"
    return record


@pytest.mark.parametrize("name", FINAL)
def test_final_says_what_a_result_means_for_its_job(name: str) -> None:
    make, res, judged, preempted, expected = FINAL[name]
    record = make()
    assert results.final(RANK, res, record, judged or (res.status, False), preempted, NOW) == expected
    assert (record.running, record.done_bits, record.status) == (0, None, None), "final changes nothing"


# --- one batch carried out by Execution -----------------------------------------------------------------------

@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path) as rig:
        rig.add_rank(0, "cores=2,memory=1024")
        rig.add_rank(1, "cores=2,memory=1024")
        yield rig


def row(record: Job, task: int, status: int = 0, *extra: Any) -> list[Any]:
    return [record.id, task, status, status, None, None, 10.0, 12.5, *extra]


async def test_one_done_of_several_jobs_each_result_judged_after_the_ones_before(core: Core) -> None:
    first = await core.running(ntasks=2, nnodes=2)
    second = await core.running(ntasks=2, nnodes=2)
    rank = core.placed[(first.id, 0)][0]
    other = 1 - rank
    mine = [task for task in (0, 1) if core.placed[(second.id, task)][0] == rank]
    theirs = [task for task in (0, 1) if core.placed[(first.id, task)][0] == other]
    assert mine and theirs, "each job has a task on each rank"
    core.sender.take("done-ack")
    usage = {"cpu": 1.5, "rss": 2048}
    batch = [row(first, 0, 0, 0, usage),    # success, with its CPU time and memory
             row(first, 0, 0),              # the same again in the batch: a duplicate now
             row(first, theirs[0], 1),      # from the wrong rank: rank 0 runs it on the other one
             row(second, mine[0], 3),       # a failure of the other job
             [999, 0, 0, 0, None, None, 10.0, 12.5]]  # a job rank 0 never had
    core.execution.on_done(rank, batch)
    assert (first.succeeded, first.failed, first.running) == (1, 0, 1)
    assert (second.failed, second.running, second.status) == (1, 1, 3)
    assert second.first_failure == (3, f"task {mine[0]} on rank {rank} exited with status 3")
    assert core.execution.tasks_ended == 2 and core.execution.tasks_failed == 1
    assert core.sender.take("done-ack") == [], "acknowledged only once the batch is durable"
    await core.durable()
    (ack,) = core.sender.take("done-ack")
    assert ack.dst == rank and ack.body["keys"] == [r[:2] for r in batch], "every row acknowledged, in order"
    rows = core.journal.query("SELECT job, task, rank, status FROM tasks ORDER BY job, task", ())
    assert [tuple(r) for r in rows] == [(first.id, 0, rank, 0), (second.id, mine[0], rank, 3)]
    usages = core.journal.query("SELECT job, task, cpu, rss FROM task_usage", ())
    assert [tuple(r) for r in usages] == [(first.id, 0, 1.5, 2048)]


async def test_a_retried_element_frees_its_cores_and_is_not_recorded_as_the_tasks_result(core: Core) -> None:
    record = await core.running(array="0-1", retries=1)
    rank = core.placed[(record.id, 0)][0]
    core.execution.on_done(rank, [row(record, 0, 1)])
    assert not record.is_done(0) and record.retries == 1 and record.flow is not None
    assert record.flow.attempts[0] == 1, "the next attempt's number is set at once"
    assert (record.id, 0) not in core.execution.tasks and record.failed == 0
    await core.durable()
    assert core.journal.query("SELECT task FROM tasks WHERE job=?", (record.id,)) == []
    attempts = core.journal.query("SELECT task, attempt, status, outcome FROM attempts WHERE job=?", (record.id,))
    assert [tuple(r) for r in attempts] == [(0, 0, 1, "retry")]
    core.execution.on_done(rank, [row(record, 0, 1)])  # the same attempt again: a straggler, acknowledged only
    assert not record.is_done(0) and record.retries == 1


# --- the records of the rows ----------------------------------------------------------------------------------

ROWS: dict[str, tuple[list[Any], Result]] = {
    "attempt 0 left out": ([1, 2, 0, 0, None, None, 1.0, 2.0], Result(1, 2, 0, 0, None, None, 1.0, 2.0)),
    "an attempt": ([1, 2, 9, 9, None, None, 1.0, 2.0, 3], Result(1, 2, 9, 9, None, None, 1.0, 2.0, 3)),
    "usage after attempt 0": ([1, 2, 0, 0, None, None, 1.0, 2.0, 0, {"cpu": 0.5, "rss": 9}],
                              Result(1, 2, 0, 0, None, None, 1.0, 2.0, 0, {"cpu": 0.5, "rss": 9})),
    "an error": ([1, 0, 127, None, None, "no such file", None, 2.0],
                 Result(1, 0, 127, None, None, "no such file", None, 2.0)),
}


@pytest.mark.parametrize("name", ROWS)
def test_a_done_row_decodes_to_its_record_and_back_unchanged(name: str) -> None:
    wire, record = ROWS[name]
    assert Result.from_row(wire) == record == Result.of_checked(wire) and result_row(*record) == wire
    assert Result.attempt_of(wire) == record.attempt


@pytest.mark.parametrize("wire", [
    [1, 2, 0, 0, None, None, 1.0],                     # short
    [1, 2, 0, 0, None, None, 1.0, 2.0, 0, {}, "more"],  # long
    [1, "2", 0, 0, None, None, 1.0, 2.0],              # a task that is no integer
    [1, 2, True, 0, None, None, 1.0, 2.0],             # a bool is no status
    [1, 2, 0, 0, None, None, 1.0, 2.0, "1"],           # nor a string an attempt
    (1, 2, 0, 0, None, None, 1.0, 2.0),                # not a list
    None,
])
def test_a_malformed_done_row_is_refused_with_what_a_row_is(wire: Any) -> None:
    with pytest.raises(BadMessage, match=r"^done: malformed result row .*: expected \[job, task, status") as info:
        Result.from_row(wire)
    assert info.value.code == "bad-request"


def test_a_run_row_decodes_to_its_record_and_back_and_a_bad_one_is_refused() -> None:
    assert TaskEntry.from_row([4, 1, 7, [0, 1], []]) == TaskEntry(4, 1, 7, [0, 1], [], 0)
    assert TaskEntry.of_checked([4, 1, 7, [0, 1], []]) == TaskEntry(4, 1, 7, [0, 1], [], 0)
    assert TaskEntry.from_row([4, 1, 7, [0], [2], 3]).attempt == 3
    for wire in ([4, 1, 7, [0], [2]], [4, 1, 7, [0], [2], 3]):
        assert TaskEntry.from_row(wire).to_row() == wire
    for bad in ([4, 1, 7, [0]], [4, 1, 7, (0,), []], [4, 1, 7, [0], [], "1"], "4,1,7"):
        with pytest.raises(BadMessage, match=r"^run: malformed task row .*: expected \[job, task, index"):
            TaskEntry.from_row(bad)
