"""Rank 0's side of the dispatch window without sockets (tests/unit/core_rig.py, protocol.md §2.10): chains sent
ahead, the next element taking over a core, and what cancel, a lost rank, a drain and back-pressure do with the
elements that wait."""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.job import Job, State
from tests.unit import core_rig
from tests.unit.core_rig import Core

TERM = 128 + signal.SIGTERM


# The rig's tasks run 1 s each: a window measured in time would hold one element per core. These tests look at
# chains of 2 (`dispatch_window`), so the time bound is lifted, but for the last test.
WINDOW = {"dispatch_window": 2, "dispatch_window_seconds": 1e9}


@contextlib.asynccontextmanager
async def two_one_core_ranks(tmp_path: Any, **config: Any) -> AsyncIterator[Core]:
    async with core_rig.started(tmp_path, **config) as rig:
        rig.add_rank(0, "cores=1,memory=1024")
        rig.add_rank(1, "cores=1,memory=1024")
        yield rig


@pytest.fixture
async def core(tmp_path):
    async with two_one_core_ranks(tmp_path, **WINDOW) as rig:
        yield rig


def aheads(core: Core) -> dict[int, list[tuple[int, int]]]:
    """rank -> (task, after) of every `ahead` entry sent since the last look."""
    out: dict[int, list[tuple[int, int]]] = {}
    for m in core.sender.take("ahead"):
        out.setdefault(m.dst, []).extend((entry[1], entry[6]) for entry in m.body["tasks"])
    return out


def rank_of(core: Core, job: Job, task: int) -> int:
    return core.execution.tasks[(job.id, task)].rank


def running(core: Core, job: Job) -> list[int]:
    return sorted(task for job_id, task in core.execution.tasks if job_id == job.id)


async def recorded(core: Core, job: Job) -> list[int]:
    await core.durable()
    return sorted(task for (task,) in core.journal.query("SELECT task FROM tasks WHERE job=?", (job.id,)))


async def test_each_busy_core_gets_a_chain_and_the_next_element_takes_over_its_core(core: Core) -> None:
    record = await core.running(array="0-9")
    sent = aheads(core)
    first = rank_of(core, record, 0)
    assert sent == {first: [(2, 0)], 1 - first: [(3, 1)]}, "one behind each core until results say how long"
    assert running(core, record) == [0, 1], "an element sent ahead is not running yet"
    core.done(first, record, 0)
    assert running(core, record) == [1, 2] and rank_of(core, record, 2) == first
    scheduler = core.manager.scheduler
    assert scheduler.holds(record.id, 2) and not scheduler.holds(record.id, 0), "the core went on to element 2"
    assert aheads(core) == {first: [(4, 2), (5, 4)]}, "the chain is topped up to the window"
    assert core.schedule() == [], "no core was freed"
    core.done(first, record, 2)
    assert rank_of(core, record, 4) == first
    assert aheads(core) == {first: [(6, 5)]}, "again, behind the chain's last entry"


async def test_cancel_recalls_the_window_before_the_kill_and_ends_every_element(core: Core) -> None:
    record = await core.running(array="0-9")
    aheads(core)
    core.manager.cancel(os.getuid(), [record.id])
    await core.turn()
    kinds = core.sender.kinds()
    assert kinds.index("recall") < kinds.index("kill")
    await core.turn()
    recalls = {m.dst: sorted(k[1] for k in m.body["keys"]) for m in core.sender.take("recall")}
    first = rank_of(core, record, 0)
    assert recalls == {first: [2], 1 - first: [3]}
    # Rank `first` ran 0 to its end before the recall came: 2 started there; the other rank returns 3.
    core.done(first, record, 0)
    assert rank_of(core, record, 2) == first
    assert (first, [[record.id, 2]], signal.SIGTERM) in core.kills(), "started behind a cancelled job: killed"
    assert aheads(core) == {}, "nothing more goes ahead for a job that ends"
    core.execution.on_returned(1 - first, [[record.id, 3]])
    core.done(1 - first, record, 1, TERM)
    assert record.state is State.RUN, "task 2 still runs"
    core.done(first, record, 2, TERM)
    assert record.state is State.INACTIVE and record.exception == "cancel"
    assert (record.succeeded, record.succeeded + record.failed + record.cancelled) == (1, 10)
    assert await recorded(core, record) == [0, 1, 2]
    assert not core.execution.window.ahead and core.manager.scheduler.pending_job(record.id) is None


async def drive(core: Core, record: Job) -> None:
    """Play the workers: every running element ends, until the job is over."""
    for _ in range(100):
        if record.state is State.INACTIVE:
            return
        for task in running(core, record):
            core.done(rank_of(core, record, task), record, task)
        core.schedule()
        await core.durable()
    raise AssertionError("the array did not end")


async def test_a_lost_rank_returns_its_window_to_the_queue_and_each_element_runs_once(core: Core) -> None:
    record = await core.running(array="0-5")
    sent = aheads(core)
    lost = rank_of(core, record, 1)
    assert sent[lost] == [(3, 1)]
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    assert record.failed == 1 and not core.execution.window.by_rank.get(lost)
    await drive(core, record)
    assert (record.succeeded, record.failed) == (5, 1)
    assert core.execution.tasks_started == 6, "no element started twice"
    assert await recorded(core, record) == [0, 1, 2, 3, 4, 5]


async def lost_with_element_3_queued_again(core: Core, last: int) -> tuple[Job, int]:
    """Array 0-`last` with element 3 sent ahead behind element 1 on a rank that is then lost: 1 ends node-lost,
    3 goes back to the queue. Returns the job and the lost rank."""
    record = await core.running(array=f"0-{last}")
    lost = rank_of(core, record, 1)
    assert aheads(core)[lost] == [(3, 1)]
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    await core.durable()
    assert core.manager.scheduler.pending_job(record.id) is not None, "3 is queued again"
    return record, lost


async def test_a_rank_that_comes_back_running_an_element_queued_again_keeps_it_and_it_is_recorded_once(
        core: Core) -> None:
    """Found by the chaos test: the rank came back running an element rank 0 had queued again. The run is adopted
    where it is; the element queued again is dropped at its turn (a kill, as an unknown stray, made the
    element's end that kill's 137; and when the element was sent to the same rank again, the worker took the new
    `run` for a repeat of the one it was killing, and the kill's 137 was recorded as the element's end)."""
    record, lost = await lost_with_element_3_queued_again(core, 3)
    core.graph.set_up(lost)
    core.execution.reconcile(lost, [[record.id, 3, [0], []]])  # the worker started 3 the moment 1 ended
    assert core.kills() == [], "not a stray: adopted"
    assert rank_of(core, record, 3) == lost and core.execution.tasks_started == 3, "0, 1, and 3 where it runs"
    core.runs(), aheads(core)
    other = 1 - lost
    core.done(other, record, 0)  # 2 takes over that core; the copy of 3 the window takes from the queue is dropped
    core.done(lost, record, 3)
    await drive(core, record)
    sent = [entry[1] for _rank, entries in core.runs() for entry in entries] + [
        task for entries in aheads(core).values() for task, _after in entries]
    assert 3 not in sent and core.execution.tasks_started == 4, "3 is not run again"
    assert (record.succeeded, record.failed) == (3, 1), "only element 1, lost with its rank, failed"
    assert await recorded(core, record) == [0, 1, 2, 3], "each element recorded once"
    assert not core.execution.tasks and core.manager.scheduler.graph.cluster.free_cores == 2, "no core held"


async def test_a_stray_of_an_element_that_ran_elsewhere_meanwhile_is_killed_and_its_end_does_not_count(
        core: Core) -> None:
    record, lost = await lost_with_element_3_queued_again(core, 3)
    other = 1 - lost
    core.done(other, record, 0)  # 2 takes over the core, and 3 goes ahead behind it
    core.done(other, record, 2)  # 3 starts there
    assert rank_of(core, record, 3) == other
    core.graph.set_up(lost)
    core.execution.reconcile(lost, [[record.id, 3, [0], []]])
    assert core.kills() == [(lost, [[record.id, 3]], signal.SIGKILL)], "a stray: it runs elsewhere"
    core.done(lost, record, 3, status=128 + signal.SIGKILL)  # what the kill made of it
    assert rank_of(core, record, 3) == other, "the run rank 0 knows of goes on"
    core.done(other, record, 3)
    await core.durable()
    assert record.state is State.INACTIVE and (record.succeeded, record.failed) == (3, 1)
    assert await recorded(core, record) == [0, 1, 2, 3]


async def test_the_result_of_an_element_queued_again_counts_and_the_queued_element_is_dropped_at_its_turn(
        core: Core) -> None:
    """Found by the chaos test: the rank came back with the result of an element rank 0 had queued again (it ran
    there while cut off). That result is the element's; when the queued element's turn comes, nothing starts and
    its core goes back."""
    record, lost = await lost_with_element_3_queued_again(core, 3)
    core.done(lost, record, 3)  # carried by its join, before rank 0 reads what it runs
    core.graph.set_up(lost)
    core.execution.reconcile(lost, [])
    assert await recorded(core, record) == [1, 3]
    core.runs()
    starts = core.schedule()
    assert [(start.job_id, record.pending_map[start.element]) for start in starts] == [(record.id, 3)]
    assert core.runs() == [], "a recorded element is not run again"
    assert not any(core.manager.scheduler.holds(record.id, start.element) for start in starts), "its core is free"
    await drive(core, record)
    assert (record.succeeded, record.failed) == (3, 1)
    assert await recorded(core, record) == [0, 1, 2, 3], "each element recorded once"


async def test_an_array_whose_last_result_came_from_a_run_rank_0_took_back_ends_and_leaves_nothing_queued(
        core: Core) -> None:
    """The chaos test's hang: such a result was the array's last while its element was still queued. The job
    ended, the scheduler later started the element of a job that was gone, and the pass died halfway, leaving
    another job's element allocated and never sent."""
    record, lost = await lost_with_element_3_queued_again(core, 3)
    scheduler = core.manager.scheduler
    queue = scheduler.pending_job(record.id).queue
    scheduler.stop_queue(queue)  # 3 waits in the queue while the rest ends
    other = 1 - lost
    core.done(other, record, 0)  # 2, sent ahead behind 0, starts in its place
    assert running(core, record) == [2]
    core.done(other, record, 2)
    core.done(lost, record, 3)  # the lost rank's run of 3, the last element
    await core.durable()
    assert record.state is State.INACTIVE and (record.succeeded, record.failed) == (3, 1)
    assert scheduler.pending_job(record.id) is None, "nothing of it stays queued"
    scheduler.start_queue(queue)
    follower = await core.running()  # the next job gets a free core, and its pass goes through
    assert running(core, follower) == [0]
    assert await recorded(core, record) == [0, 1, 2, 3]


async def test_an_element_taken_ahead_after_its_result_came_from_a_run_rank_0_took_back_is_dropped(
        core: Core) -> None:
    record, lost = await lost_with_element_3_queued_again(core, 3)
    core.done(lost, record, 3)  # carried by the lost rank's join: 3 is recorded while queued
    other = 1 - lost
    core.done(other, record, 0)  # 2 takes over the core; the window takes 3 from the queue, and drops it
    assert running(core, record) == [2] and aheads(core) == {}
    assert core.schedule() == [], "nothing of it is left to start"
    core.done(other, record, 2)
    await core.durable()
    assert record.state is State.INACTIVE and (record.succeeded, record.failed) == (3, 1)
    assert core.execution.tasks_started == 3, "0, 1 and 2: rank 0 never started 3 again"
    assert await recorded(core, record) == [0, 1, 2, 3]


async def test_a_drained_rank_gives_its_window_back_and_gets_no_more(core: Core) -> None:
    record = await core.running(array="0-9")
    aheads(core)
    drained = rank_of(core, record, 1)
    core.graph.drain(drained, "maintenance")
    core.execution.window.recall_rank(drained)
    await core.turn()
    (recall,) = core.sender.take("recall")
    assert recall.dst == drained and recall.body["keys"] == [[record.id, 3]]
    core.execution.on_returned(drained, recall.body["keys"])
    core.done(drained, record, 1)
    assert aheads(core) == {} and running(core, record) == [0], "the drained rank's core is not reused"
    await drive(core, record)
    assert record.succeeded == 10 and core.execution.tasks_started == 10
    assert await recorded(core, record) == list(range(10))


async def test_a_worker_that_returns_entries_unasked_gets_half_as_many_until_it_joins_again(tmp_path: Any) -> None:
    async with core_rig.started(tmp_path, **WINDOW) as core:
        core.add_rank(0, "cores=4,memory=1024")
        record = await core.running(array="0-39")
        assert sum(len(entries) for entries in aheads(core).values()) == 4, "one behind each of 4 cores"
        window = core.execution.window
        # More than the worker holds: 2 of its 4 come back unasked; 2 still wait, so at most 1 may from now on.
        core.execution.on_returned(0, [[record.id, 5], [record.id, 7]])
        assert window.limit == {0: 1} and sorted(window.by_rank[0]) == [(record.id, 4), (record.id, 6)]
        core.done(0, record, 0)
        core.done(0, record, 1)
        assert running(core, record) == [2, 3, 4] and aheads(core) == {}, "no top-up above the limit"
        core.done(0, record, 2)
        assert [len(entries) for entries in aheads(core).values()] == [1], "below the limit: one more waits"
        core.execution.reconcile(0, [[record.id, task, [0], []] for task in running(core, record)])
        assert window.limit == {} and not window.ahead, "a join starts over; what waited is queued again"
        await drive(core, record)
        assert record.succeeded == 40 and core.execution.tasks_started == 40
        assert await recorded(core, record) == list(range(40))


async def test_only_the_head_of_the_queue_sends_elements_ahead(core: Core) -> None:
    record = await core.running(array="0-19")
    aheads(core)
    behind = core.submit(ntasks=2)  # same urgency, later: it waits for the array's elements anyway
    await core.durable()
    core.schedule()
    core.done(rank_of(core, record, 0), record, 0)
    assert len(aheads(core)) == 1, "a job queued behind the array leaves its window alone"
    first = core.submit(ntasks=2, urgency=31)
    await core.durable()
    core.schedule()
    core.done(rank_of(core, record, 1), record, 1)
    assert aheads(core) == {}, "a job that comes first would be overtaken"
    assert first.state is State.SCHED and behind.state is State.SCHED


async def test_elements_that_take_long_wait_one_behind_each_core(tmp_path: Any) -> None:
    async with core_rig.started(tmp_path, dispatch_window=8, dispatch_window_seconds=0.05) as rig:
        rig.add_rank(0, "cores=1,memory=1024")
        record = await rig.running(array="0-9")
        assert aheads(rig) == {0: [(1, 0)]}
        rig.done(0, record, 0)  # 1 s: one element is more than 0.05 s of work
        assert aheads(rig) == {0: [(2, 1)]} and rig.execution.window.depth_of(record) == 1


async def test_the_window_is_off_with_dispatch_window_0(tmp_path: Any) -> None:
    async with core_rig.started(tmp_path, dispatch_window=0) as rig:
        rig.add_rank(0, "cores=1,memory=1024")
        await rig.running(array="0-9")
        assert rig.sender.take("ahead") == []


async def test_a_hold_takes_the_window_back_and_a_release_runs_it(core: Core) -> None:
    record = await core.running(array="0-9")
    aheads(core)
    core.manager.workflow.hold(record, os.getuid())
    await core.turn()
    recalls = core.sender.take("recall")
    assert sorted(k[1] for m in recalls for k in m.body["keys"]) == [2, 3]
    for m in recalls:
        core.execution.on_returned(m.dst, m.body["keys"])
    core.done(rank_of(core, record, 0), record, 0)
    core.done(rank_of(core, record, 1), record, 1)
    core.schedule()
    assert running(core, record) == [] and aheads(core) == {}, "held: nothing more starts"
    core.manager.workflow.release(record, os.getuid())
    await drive(core, record)
    assert record.succeeded == 10 and core.execution.tasks_started == 10
    assert await recorded(core, record) == list(range(10))


async def test_an_element_sent_ahead_is_timed_from_when_it_starts_not_from_when_it_was_sent(core: Core) -> None:
    record = await core.running(array="0-9", time_limit=10.0)
    first = rank_of(core, record, 0)
    assert aheads(core)[first] == [(2, 0)]
    core.clock.advance(8.0)
    core.done(first, record, 0)  # element 2 starts now, 8 s after it was sent
    core.clock.advance(9.0)
    core.execution.check_deadlines(core.clock())
    assert [keys for _, keys, _ in core.kills()] == [[[record.id, 1]]], "only element 1 is past its 10 s"
    core.clock.advance(1.5)
    core.execution.check_deadlines(core.clock())
    assert core.kills() == [(first, [[record.id, 2]], signal.SIGTERM)]


# --- single jobs sent ahead (protocol.md §2.10) ------------------------------------------------------------------

def job_aheads(core: Core) -> dict[int, list[tuple[int, int]]]:
    """rank -> (job, the job it follows) of every single job sent ahead since the last look."""
    out: dict[int, list[tuple[int, int]]] = {}
    for m in core.sender.take("ahead"):
        for entry in m.body["tasks"]:
            assert len(entry) == 8 and entry[1] == 0 and entry[6] == 0, "a whole job follows another job's task 0"
            out.setdefault(m.dst, []).append((entry[0], entry[7]))
    return out


async def queued_jobs(core: Core, count: int, **fields: Any) -> list[Job]:
    """`count` one-core jobs with a time limit (so the window knows them as small), the first two started."""
    jobs = [core.submit(time_limit=5.0, **fields) for _ in range(count)]
    await core.durable()
    core.schedule()
    await core.durable()
    for rank, entries in core.runs():
        for job_id, task, _index, cores, *_ in entries:
            core.placed[(job_id, task)] = (rank, cores)
    return jobs


def single_rank(core: Core, job: Job) -> int:
    return core.execution.tasks[(job.id, 0)].rank


async def drive_jobs(core: Core, jobs: list[Job]) -> None:
    """Play the workers: every running task of these jobs ends, until all of them are over."""
    ids = {job.id for job in jobs}
    for _ in range(100):
        if all(job.state is State.INACTIVE for job in jobs):
            return
        for job_id, task in [key for key in core.execution.tasks if key[0] in ids]:
            core.done(core.execution.tasks[(job_id, task)].rank, core.manager.jobs[job_id], task)
        core.schedule()
        await core.durable()
    raise AssertionError("the jobs did not end")


async def recorded_jobs(core: Core, jobs: list[Job]) -> list[int]:
    await core.durable()
    rows = core.journal.query(f"SELECT job FROM tasks WHERE job IN ({','.join(str(j.id) for j in jobs)})")
    return sorted(job_id for (job_id,) in rows)


async def test_small_single_jobs_wait_in_chains_and_take_over_the_core_of_the_one_before(core: Core) -> None:
    jobs = await queued_jobs(core, 8)
    first, second = jobs[0], jobs[1]
    assert first.state is State.RUN and second.state is State.RUN
    sent = job_aheads(core)
    ids = [j.id for j in jobs]
    assert sorted(sent.values()) == sorted([[(ids[2], first.id), (ids[3], ids[2])],
                                            [(ids[4], second.id), (ids[5], ids[4])]]), "two behind each core"
    assert jobs[2].state is State.SCHED and not core.execution.tasks.get((ids[2], 0)), "sent ahead is not running"
    rank = single_rank(core, first)
    follower = next(job for job in jobs if sent[rank][0][0] == job.id)
    core.done(rank, first, 0)
    assert follower.state is State.RUN and single_rank(core, follower) == rank, "it started on the freed core"
    assert core.scheduler.holds(follower.id, 0) and not core.scheduler.holds(first.id, 0), "the hold moved"
    assert [(m.dst, len(m.body["tasks"])) for m in core.sender.take("ahead")] == [(rank, 1)], "topped up"
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 8 and all(job.succeeded == 1 for job in jobs)
    assert await recorded_jobs(core, jobs) == ids, "each job recorded once"
    assert core.event_names(follower)[-5:-2] == ["alloc", "start", "finish"]


async def test_a_job_whose_run_time_is_unknown_is_not_sent_ahead(core: Core) -> None:
    jobs = [core.submit() for _ in range(4)]  # no time limit, no runs of its shape yet: not known to be small
    await core.durable()
    core.schedule()
    await core.durable()
    assert core.sender.take("ahead") == []
    core.done(single_rank(core, jobs[0]), jobs[0], 0)  # a run of 1 s: the shape is known now
    await drive_jobs(core, jobs)
    more = [core.submit() for _ in range(4)]
    await core.durable()
    core.schedule()
    await core.durable()
    assert sum(map(len, job_aheads(core).values())) == 2, "its shape ran: small"
    await drive_jobs(core, more)


async def cancel_the_first_waiting(core: Core, count: int) -> tuple[list[Job], dict[int, Any], int, Job]:
    """`count` small jobs queued; the first that waits behind jobs[0] is cancelled: (jobs, what was sent ahead,
    its rank, it)."""
    jobs = await queued_jobs(core, count)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    waiting = core.manager.jobs[sent[rank][0][0]]
    core.manager.cancel(os.getuid(), [waiting.id])
    await core.turn()
    return jobs, sent, rank, waiting


async def test_cancelling_a_job_waiting_ahead_recalls_it_and_it_ends_once_it_is_back(core: Core) -> None:
    jobs, sent, rank, waiting = await cancel_the_first_waiting(core, 6)
    (recall,) = core.sender.take("recall")
    assert recall.dst == rank and recall.body["keys"] == [[waiting.id, 0]]
    await core.durable()
    assert waiting.state is State.SCHED, "it finishes only once the worker gave it back"
    core.execution.on_returned(rank, recall.body["keys"])
    await core.durable()
    assert waiting.state is State.INACTIVE and waiting.exception == "cancel"
    core.done(rank, jobs[0], 0)
    assert single_rank(core, core.manager.jobs[sent[rank][1][0]]) == rank, "the next one followed its predecessor"
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 5
    assert await recorded_jobs(core, jobs) == sorted(j.id for j in jobs if j is not waiting)


async def test_cancelling_many_jobs_waiting_ahead_sends_one_recall_per_rank(tmp_path: Any) -> None:
    async with two_one_core_ranks(tmp_path, dispatch_window=8, dispatch_window_seconds=1e9) as core:
        jobs = await queued_jobs(core, 18)
        sent = job_aheads(core)
        waiting = [job_id for entries in sent.values() for job_id, _ in entries]
        assert len(waiting) == 16, "8 wait behind each running job"
        core.manager.cancel(os.getuid(), waiting)
        await core.turn()
        recalls = core.sender.take("recall")
        assert sorted(m.dst for m in recalls) == [0, 1], "one recall per rank, not one per job"
        for m in recalls:
            assert sorted(k[0] for k in m.body["keys"]) == sorted(job_id for job_id, _ in sent[m.dst])
            core.execution.on_returned(m.dst, m.body["keys"])
        await core.durable()
        cancelled = [job for job in jobs if job.id in waiting]
        assert all(job.state is State.INACTIVE and job.exception == "cancel" for job in cancelled)
        await drive_jobs(core, jobs[:2])
        assert core.execution.tasks_started == 2


async def test_cancelling_all_jobs_sends_each_rank_one_recall_before_its_kill(tmp_path: Any) -> None:
    async with two_one_core_ranks(tmp_path, dispatch_window=8, dispatch_window_seconds=1e9) as core:
        jobs = await queued_jobs(core, 18)
        sent = job_aheads(core)
        core.manager.cancel(os.getuid(), [job.id for job in jobs])
        await core.turn()
        for rank in (0, 1):
            to_rank = [m for m in core.sender.sent if m.dst == rank and m.kind in ("recall", "kill")]
            assert [m.kind for m in to_rank] == ["recall", "kill"], "the chain is recalled before its head is killed"
            assert sorted(k[0] for k in to_rank[0].body["keys"]) == sorted(job_id for job_id, _ in sent[rank])


async def test_a_cancelled_job_that_started_before_the_recall_arrived_is_killed_and_recorded_once(core: Core) -> None:
    jobs, _, rank, waiting = await cancel_the_first_waiting(core, 4)
    core.sender.take("recall")
    core.done(rank, jobs[0], 0)  # the worker started it before the recall came: nothing is returned
    assert core.kills() == [(rank, [[waiting.id, 0]], signal.SIGTERM)]
    core.done(rank, waiting, 0, status=TERM)
    await core.durable()
    assert waiting.state is State.INACTIVE and waiting.exception == "cancel"
    assert await recorded_jobs(core, [waiting]) == [waiting.id]


async def test_a_held_job_comes_back_from_the_window_and_runs_once_released(core: Core) -> None:
    jobs = await queued_jobs(core, 4)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    held = core.manager.jobs[sent[rank][0][0]]
    core.manager.workflow.hold(held, os.getuid())
    await core.turn()
    (recall,) = core.sender.take("recall")
    core.manager.workflow.release(held, os.getuid())  # before it came back: it is queued once it is back
    assert core.scheduler.pending_job(held.id) is None
    core.execution.on_returned(rank, recall.body["keys"])
    assert core.scheduler.pending_job(held.id) is not None
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 4 and await recorded_jobs(core, jobs) == sorted(j.id for j in jobs)


async def test_a_higher_priority_job_that_cannot_start_recalls_the_jobs_sent_ahead(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    job_aheads(core)
    urgent = core.submit(urgency=31)
    await core.durable()
    core.schedule()
    await core.turn()
    recalls = core.sender.take("recall")
    assert sorted(k[0] for m in recalls for k in m.body["keys"]) == [j.id for j in jobs[2:6]]
    for m in recalls:
        core.execution.on_returned(m.dst, m.body["keys"])
    core.done(single_rank(core, jobs[0]), jobs[0], 0)
    core.schedule()
    await core.durable()
    assert urgent.state is State.RUN, "it took the first core that freed"
    later = core.submit(time_limit=5.0)  # the same priority, later: it comes after the jobs sent ahead
    await core.durable()
    core.schedule()
    await core.turn()
    assert core.sender.take("recall") == []
    await drive_jobs(core, [*jobs, urgent, later])
    assert core.execution.tasks_started == 8


async def test_a_drained_rank_gives_its_single_jobs_back(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    sent = job_aheads(core)
    drained = single_rank(core, jobs[0])
    core.graph.drain(drained, "maintenance")
    core.execution.window.recall_rank(drained)
    await core.turn()
    (recall,) = core.sender.take("recall")
    assert sorted(k[0] for k in recall.body["keys"]) == sorted(job_id for job_id, _ in sent[drained])
    core.execution.on_returned(drained, recall.body["keys"])
    core.done(drained, jobs[0], 0)
    assert job_aheads(core) == {}, "the drained rank gets no more"
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 6
    assert all(core.execution.tasks_started and j.succeeded == 1 for j in jobs)


async def test_a_lost_rank_queues_its_single_jobs_again_and_each_runs_once(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    lost = single_rank(core, jobs[1])
    assert job_aheads(core)[lost], "two wait behind its core"
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    await core.durable()
    assert jobs[1].exception == "node-lost" and not core.execution.window.by_rank.get(lost)
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 6, "none of the returned jobs started twice"
    assert await recorded_jobs(core, jobs) == [j.id for j in jobs]


async def test_a_late_result_from_a_lost_rank_leaves_the_run_that_replaced_it_alone(core: Core) -> None:
    """The lost worker started a job from its window unreported; rank 0 ran it again elsewhere. When the lost
    worker's result comes after all, the run rank 0 knows of keeps its cores and is the one recorded."""
    jobs = await queued_jobs(core, 6)
    lost = single_rank(core, jobs[1])
    returned = core.manager.jobs[job_aheads(core)[lost][0][0]]
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    await core.durable()
    other = 1 - lost
    for _ in range(10):  # the other rank works through its queue until the returned job runs there
        if returned.state is State.RUN:
            break
        job_id, task = next(key for key in core.execution.tasks if core.execution.tasks[key].rank == other)
        core.done(other, core.manager.jobs[job_id], task)
        core.schedule()
        await core.durable()
    assert single_rank(core, returned) == other
    core.done(lost, returned, 0, status=3)  # the lost worker's run, reported as it comes back
    await core.durable()
    assert returned.state is State.RUN and single_rank(core, returned) == other, "still running where it runs"
    assert core.scheduler.holds(returned.id, 0), "its core is not given to another job"
    core.done(other, returned, 0)
    await core.durable()
    assert returned.succeeded == 1 and await recorded_jobs(core, [returned]) == [returned.id], "recorded once"


async def test_a_single_job_recorded_from_a_lost_rank_while_it_waits_ahead_elsewhere_ends_once(core: Core) -> None:
    """The lost worker ran a job from its window; rank 0 had queued it again and sent it ahead on the other rank.
    The lost worker's result counts: the job is recorded once, the entry waiting elsewhere is recalled, and if it
    started before the recall came, that second run gives its core back and is not recorded."""
    jobs = await queued_jobs(core, 6)
    lost = single_rank(core, jobs[0])
    other = 1 - lost
    sent = job_aheads(core)
    taken_back = core.manager.jobs[sent[lost][0][0]]
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    await core.durable()
    core.done(other, jobs[1], 0)  # the other rank's chain moves on and takes the returned job from the queue
    core.done(other, core.manager.jobs[sent[other][0][0]], 0)
    assert core.execution.window.ahead_rank(taken_back) == other, "sent ahead again, on the other rank"
    core.done(lost, taken_back, 0)  # the lost worker's run, reported as it comes back
    await core.turn()
    (recall,) = core.sender.take("recall")
    assert recall.dst == other and recall.body["keys"] == [[taken_back.id, 0]]
    # It had started there before the recall came: it runs to its end and gives its core back.
    while (taken_back.id, 0) not in core.execution.tasks:
        key = next(key for key, run in core.execution.tasks.items() if run.rank == other)
        core.done(other, core.manager.jobs[key[0]], key[1])
    core.done(other, taken_back, 0, status=1)
    await drive_jobs(core, jobs)
    assert taken_back.succeeded == 1 and taken_back.failed == 0, "the run that counted is the lost worker's"
    assert await recorded_jobs(core, jobs) == sorted(job.id for job in jobs), "each recorded once"
    assert not core.execution.tasks and not core.scheduler.holds(taken_back.id, 0)


async def test_a_rank_that_comes_back_running_a_single_job_queued_again_keeps_it(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    lost = single_rank(core, jobs[0])
    sent = job_aheads(core)
    taken_back = core.manager.jobs[sent[lost][0][0]]
    core.graph.set_down(lost)
    core.execution.rank_lost(lost)
    await core.durable()
    assert taken_back.state is State.SCHED and core.manager.scheduler.pending_job(taken_back.id) is not None
    core.kills()  # the lost job's
    core.graph.set_up(lost)
    core.execution.reconcile(lost, [[taken_back.id, 0, [0], []]])
    assert core.kills() == [] and single_rank(core, taken_back) == lost, "adopted where it runs"
    assert taken_back.state is State.RUN and core.manager.scheduler.pending_job(taken_back.id) is None
    await drive_jobs(core, jobs)
    assert taken_back.succeeded == 1 and core.execution.tasks_started == 6, "each job started once"
    assert await recorded_jobs(core, jobs) == sorted(job.id for job in jobs), "each recorded once"


async def test_a_single_job_sent_ahead_is_timed_from_its_start(core: Core) -> None:
    jobs = await queued_jobs(core, 4)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    follower = core.manager.jobs[sent[rank][0][0]]
    core.clock.advance(4.0)
    core.done(rank, jobs[0], 0)  # it starts now, 4 s after it was sent; its limit is 5 s
    core.clock.advance(4.5)
    core.execution.check_deadlines(core.clock())
    assert follower.exception is None, "not past its 5 s"
    core.clock.advance(1.0)
    core.execution.check_deadlines(core.clock())
    assert follower.exception == "timeout"


async def test_after_a_restart_a_single_job_that_started_ahead_is_reattached_or_recorded_once(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    ran, runs = (core.manager.jobs[job_id] for job_id, _ in sent[rank])
    # The worker ran jobs[0] and `ran`, and runs `runs` now; rank 0 dies before it hears of any of it.
    core.crashed = True
    async with core_rig.restarted(core) as life:
        life.add_rank(0, "cores=1,memory=1024")
        life.add_rank(1, "cores=1,memory=1024")
        assert life.manager.jobs[ran.id].state is State.SCHED
        finished = [[jobs[0].id, 0, 0, 0, None, None, 1.0, 2.0], [ran.id, 0, 0, 0, None, None, 2.0, 3.0]]
        life.execution.on_done(rank, finished)
        core_cores = core.placed[(jobs[0].id, 0)][1]
        life.settle({rank: [[runs.id, 0, core_cores, []]],
                     1 - rank: [[jobs[1].id, 0, core.placed[(jobs[1].id, 0)][1], []]]})
        await life.durable()
        assert life.manager.jobs.get(ran.id) is None, "recorded and finished"
        again = life.manager.jobs[runs.id]
        assert again.state is State.RUN and life.scheduler.pending_job(runs.id) is None, "reattached, not queued"
        assert life.event_names(again)[-2:] == ["alloc", "start"]
        rest = [life.manager.jobs[j.id] for j in jobs if j.id in life.manager.jobs]
        await drive_jobs(life, rest)
        assert await recorded_jobs(life, jobs) == [j.id for j in jobs], "each job recorded exactly once"


async def test_a_rank_that_joins_after_the_reattach_window_keeps_the_element_it_runs(core: Core) -> None:
    """After a restart, the rank running element 1 joins only once the reattach window closed, which queued 1
    again: that run goes on where it is (it used to be killed as a stray) and 1 is recorded once."""
    record = await core.running(array="0-3")
    late = rank_of(core, record, 1)
    core.crashed = True
    async with core_rig.restarted(core) as life:
        life.add_rank(0, "cores=1,memory=1024")
        life.add_rank(1, "cores=1,memory=1024")
        again = life.manager.jobs[record.id]
        life.settle({1 - late: [[record.id, 0, core.placed[(record.id, 0)][1], []]]})
        await life.durable()
        assert (record.id, 1) not in life.execution.tasks, "queued again: its rank did not report in time"
        life.execution.reconcile(late, [[record.id, 1, core.placed[(record.id, 1)][1], []]])
        assert life.kills() == [] and life.execution.tasks[(record.id, 1)].rank == late, "adopted"
        await drive(life, again)
        assert (again.succeeded, again.failed) == (4, 0)
        assert await recorded(life, again) == [0, 1, 2, 3], "each element recorded once"
        assert life.execution.tasks_started == 4, "0 and 1 where they ran, 2 and 3: none twice"


async def test_an_urgency_change_takes_a_job_back_from_the_window_and_queues_it_anew(core: Core) -> None:
    jobs = await queued_jobs(core, 4)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    moved = core.manager.jobs[sent[rank][1][0]]
    core.manager.workflow.update(moved, os.getuid(), {"urgency": 20})
    await core.turn()
    (recall,) = core.sender.take("recall")
    assert recall.body["keys"] == [[moved.id, 0]] and core.scheduler.pending_job(moved.id) is None
    core.execution.on_returned(rank, recall.body["keys"])
    queued = core.scheduler.pending_job(moved.id)
    assert queued is not None and queued.urgency == 20
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 4


async def test_ending_a_jobs_tasks_recalls_the_single_jobs_behind_it(core: Core) -> None:
    jobs = await queued_jobs(core, 6)
    sent = job_aheads(core)
    rank = single_rank(core, jobs[0])
    core.manager.tasks.kill_job(jobs[0], signal.SIGTERM)  # as a preemption does: its cores are wanted
    assert [kind for kind in core.sender.kinds() if kind in ("recall", "kill")] == ["recall", "kill"]
    await core.turn()
    (recall,) = core.sender.take("recall")
    assert recall.dst == rank and sorted(k[0] for k in recall.body["keys"]) == sorted(j for j, _ in sent[rank])
    assert core.kills() == [(rank, [[jobs[0].id, 0]], signal.SIGTERM)]


async def test_no_single_job_goes_ahead_while_the_journal_lags(core: Core) -> None:
    core.execution.window.unrecorded = 10**6
    jobs = await queued_jobs(core, 6)
    assert core.sender.take("ahead") == []
    core.execution.window.unrecorded = 0
    core.done(single_rank(core, jobs[0]), jobs[0], 0)
    core.schedule()
    await core.durable()
    assert sum(map(len, job_aheads(core).values())) == 2, "the journal caught up: the next start fills a chain"


async def test_no_chain_waits_behind_a_job_that_may_run_long(core: Core) -> None:
    long = core.submit(argv=("sleep", "100"))  # no time limit and no runs of its shape: it may run for hours
    jobs = [core.submit(time_limit=5.0) for _ in range(4)]
    await core.durable()
    core.schedule()
    await core.durable()
    sent = job_aheads(core)
    assert list(sent) == [single_rank(core, jobs[0])] and single_rank(core, long) not in sent


async def recalled_once_overdue(core: Core, grace: float) -> dict[int, list[int]]:
    """The chains sent behind jobs expected to take 5 s: none is recalled half a second before the grace is over,
    each half a second after; rank -> recalled job ids."""
    sent = job_aheads(core)
    core.clock.advance(5.0 + grace - 0.5)
    core.execution.window.recall_overdue(core.clock())
    await core.turn()
    assert core.sender.take("recall") == [], "within its expected time and the grace"
    core.clock.advance(1.0)
    core.execution.window.recall_overdue(core.clock())
    await core.turn()
    recalled = {m.dst: sorted(k[0] for k in m.body["keys"]) for m in core.sender.take("recall")}
    assert recalled == {rank: sorted(job_id for job_id, _ in chain) for rank, chain in sent.items()}
    return recalled


async def test_a_chain_behind_a_job_that_runs_longer_than_expected_goes_back_to_the_queue(core: Core) -> None:
    jobs = await queued_jobs(core, 6)  # expected 5 s each (their time limit)
    recalled = await recalled_once_overdue(core, grace=1.0)
    for rank, keys in recalled.items():
        core.execution.on_returned(rank, [[job_id, 0] for job_id in keys])
    assert all(core.scheduler.pending_job(job.id) is not None for job in jobs[2:]), "queued again"
    await drive_jobs(core, jobs)
    assert core.execution.tasks_started == 6


async def test_dispatch_window_grace_sets_how_long_a_chain_waits_behind_a_job_that_overruns(tmp_path: Any) -> None:
    async with two_one_core_ranks(tmp_path, dispatch_window_grace=5.0, **WINDOW) as core:
        await queued_jobs(core, 6)  # expected 5 s each (their time limit)
        await recalled_once_overdue(core, grace=5.0)


async def test_a_job_whose_result_comes_before_its_predecessors_ends_and_the_next_takes_over_the_core(
        core: Core) -> None:
    """The worker started a job sent ahead at once (the job it follows had ended there: protocol.md §2.10), and
    its result reached rank 0 before its predecessor's (control-plane benchmark, rank 0's own worker): it ends,
    and the predecessor's result hands the core to the job behind it, not to it again."""
    jobs = await queued_jobs(core, 6)
    rank = single_rank(core, jobs[0])
    (follower, _), (behind, _) = job_aheads(core)[rank]
    follower_job, behind_job = core.manager.jobs[follower], core.manager.jobs[behind]
    core.done(rank, follower_job, 0)
    await core.durable()
    assert follower_job.state is State.INACTIVE and follower_job.succeeded == 1, "it ended with its result"
    core.done(rank, jobs[0], 0)
    assert single_rank(core, behind_job) == rank and behind_job.state is State.RUN, "the next took over the core"
    await drive_jobs(core, jobs)
    assert core.event_names(follower_job)[-5:] == ["alloc", "start", "finish", "release", "clean"]
    assert await recorded_jobs(core, jobs) == sorted(j.id for j in jobs)


async def test_nothing_is_sent_ahead_behind_an_entry_that_is_being_recalled(core: Core) -> None:
    """The worker may have dropped a recalled entry already: one sent behind it would start there at once, on the
    cores of a task still running, and end before its predecessor as rank 0 knows it (protocol.md §2.10)."""
    jobs = await queued_jobs(core, 8)
    rank = single_rank(core, jobs[0])
    (first, _), (last, _) = job_aheads(core)[rank]
    core.execution.window.recall([(last, 0)])
    await core.turn()
    assert [m.body["keys"] for m in core.sender.take("recall")] == [[[last, 0]]]
    core.done(rank, jobs[0], 0)  # the first entry starts: its chain is topped up, but not behind the recalled one
    assert single_rank(core, core.manager.jobs[first]) == rank
    assert all(after != last for entries in job_aheads(core).values() for _, after in entries)
    core.execution.on_returned(rank, [[last, 0]])
    await drive_jobs(core, jobs)
    assert await recorded_jobs(core, jobs) == sorted(j.id for j in jobs)
