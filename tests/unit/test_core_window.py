"""Rank 0's side of the dispatch window without sockets (tests/unit/core_rig.py, protocol.md §2.10): chains sent
ahead, the next element taking over a core, and what cancel, a lost rank, a drain and back-pressure do with the
elements that wait."""
from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from broker.job import Job, State
from tests.unit import core_rig
from tests.unit.core_rig import Core

TERM = 128 + signal.SIGTERM


# The rig's tasks run 1 s each: a window measured in time would hold one element per core. These tests look at
# chains of 2 (`dispatch_window`), so the time bound is lifted, but for the last test.
WINDOW = {"dispatch_window": 2, "dispatch_window_seconds": 1e9}


@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path, **WINDOW) as rig:
        rig.add_rank(0, "cores=1,memory=1024")
        rig.add_rank(1, "cores=1,memory=1024")
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
    kinds = core.sender.kinds()
    assert kinds.index("recall") < kinds.index("kill")
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


async def test_a_drained_rank_gives_its_window_back_and_gets_no_more(core: Core) -> None:
    record = await core.running(array="0-9")
    aheads(core)
    drained = rank_of(core, record, 1)
    core.graph.drain(drained, "maintenance")
    core.execution.window.recall_rank(drained)
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


async def test_nothing_goes_ahead_while_another_job_waits(core: Core) -> None:
    record = core.submit(array="0-9")
    other = core.submit(ntasks=2)
    await core.durable()
    core.schedule()
    await core.durable()
    assert aheads(core) == {}, "the other job would be overtaken"
    await drive(core, record)
    assert record.succeeded == 10 and other.state is State.RUN


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
