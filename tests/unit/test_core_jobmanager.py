"""JobManager without sockets (tests/unit/core_rig.py): submit, cancel in each state, duplicate results, time limits.

What a client would see is read where it would read it: the reply of `cancel`, and the durable eventlog.
"""
from __future__ import annotations

import os
import signal

import pytest

from broker.job import Job, State
from broker.jobmanager import JobError
from tests.unit import core_rig
from tests.unit.core_rig import Core

CANCEL_STATUS = 128 + signal.SIGTERM
QUEUED = ["submit", "depend", "priority"]
ENDED = ["finish", "release", "clean"]


@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path) as rig:
        yield rig


async def running(core: Core, **fields) -> Job:
    """A job whose `run` went out to rank 0."""
    core.add_rank(0)
    return await core.running(**fields)


# --- submit ----------------------------------------------------------------------------------------------------


async def test_submit_queues_the_job_in_sched_once_durable(core: Core) -> None:
    record = core.submit(ntasks=2, name="two")
    assert record.id == 1 and core.manager.next_id == 2
    assert core.scheduler.pending_job(record.id) is None, "not queued before its submission is durable"
    await core.durable()
    assert record.state is State.SCHED and core.scheduler.pending_job(record.id) is not None
    events = core.events(record)
    assert [name for name, _ in events] == QUEUED
    assert events[0][1] == {"uid": os.getuid(), "ntasks": 2, "array": None}
    assert events[2][1] == {"priority": 16}


async def test_submit_refuses_a_job_larger_than_the_instance_and_records_nothing(core: Core) -> None:
    with pytest.raises(JobError) as refused:
        core.submit(nnodes=3, ntasks=3)
    assert refused.value.code == "infeasible"
    assert core.manager.jobs == {} and core.manager.next_id == 1


async def test_submit_never_leaves_a_job_in_new(core: Core) -> None:
    """NEW lasts only inside submit: neither a cancel nor a restart can meet it (so neither has to handle it)."""
    first = core.submit()
    held = core.submit(hold=True)
    dependant = core.submit(dependencies=[{"type": "afterok", "jobs": [first.id]}])
    assert [j.state for j in (first, held, dependant)] == [State.SCHED, State.DEPEND, State.DEPEND]
    await core.durable()
    assert core.event_names(held)[0] == core.event_names(dependant)[0] == "submit"


# --- cancel in each state --------------------------------------------------------------------------------------


async def test_cancel_of_a_job_waiting_for_a_dependency_ends_it_at_once(core: Core) -> None:
    target = core.submit()
    record = core.submit(dependencies=[{"type": "afterok", "jobs": [target.id]}])
    await core.durable()  # a submission not yet durable is not there to cancel
    assert record.state is State.DEPEND
    assert core.manager.cancel(os.getuid(), [record.id]) == ([record.id], {})
    assert record.state is State.INACTIVE and record.status == CANCEL_STATUS and record.exception == "cancel"
    await core.durable()
    assert core.event_names(record) == ["submit", "dependency-add", "exception", *ENDED]
    assert target.state is State.SCHED, "the job it waited for is not touched"


async def test_cancel_of_a_held_job_ends_it_at_once(core: Core) -> None:
    record = core.submit(hold=True)
    await core.durable()
    assert core.manager.cancel(os.getuid(), [record.id]) == ([record.id], {})
    await core.durable()
    assert record.state is State.INACTIVE and record.closed
    assert core.event_names(record) == ["submit", "hold", "exception", *ENDED]


async def test_cancel_of_a_queued_job_takes_it_off_the_queue(core: Core) -> None:
    record = core.submit()
    await core.durable()
    assert core.manager.cancel(os.getuid(), [record.id]) == ([record.id], {})
    assert core.scheduler.pending_job(record.id) is None
    await core.durable()
    events = core.events(record)
    assert [name for name, _ in events] == [*QUEUED, "exception", *ENDED]
    assert events[3][1] == {"type": "cancel", "severity": 0, "note": f"cancelled by uid {os.getuid()}",
                            "status": CANCEL_STATUS}
    assert events[4][1] == {"status": CANCEL_STATUS, "counts": {"succeeded": 0, "failed": 0, "cancelled": 1}}
    core.add_rank(0)
    assert core.schedule() == [], "nothing of a cancelled job starts"


async def test_cancel_of_a_running_job_kills_its_tasks_and_ends_it_when_they_end(core: Core) -> None:
    record = await running(core, ntasks=2)
    assert core.manager.cancel(os.getuid(), [record.id]) == ([record.id], {})
    assert core.kills() == [(0, [[record.id, 0], [record.id, 1]], signal.SIGTERM)]
    assert record.state is State.RUN and record.ending, "it ends when its tasks do"
    assert core.manager.cancel(os.getuid(), [record.id]) == ([], {str(record.id): f"job {record.id} has already ended"})
    core.done(0, record, 0, CANCEL_STATUS)
    core.done(0, record, 1, CANCEL_STATUS)
    assert record.state is State.INACTIVE and record.status == CANCEL_STATUS
    assert (record.succeeded, record.failed, record.cancelled) == (0, 0, 2)
    await core.durable()
    assert core.event_names(record) == [*QUEUED, "alloc", "start", "exception", *ENDED]


async def test_cancel_before_the_alloc_is_durable_sends_no_run(core: Core) -> None:
    core.add_rank(0)
    record = core.submit()
    await core.durable()
    assert core.schedule()
    assert core.manager.cancel(os.getuid(), [record.id]) == ([record.id], {})
    assert record.state is State.INACTIVE and record.status == CANCEL_STATUS
    await core.durable()
    assert core.runs() == [] and core.kills() == [], "the worker never heard of it"
    assert core.event_names(record) == [*QUEUED, "alloc", "start", "exception", *ENDED]


async def test_cancel_of_an_inactive_job_is_refused_and_records_nothing(core: Core) -> None:
    record = await running(core)
    core.done(0, record, 0)
    await core.durable()
    before = core.event_names(record)
    assert core.manager.cancel(os.getuid(), [record.id]) == ([], {str(record.id): f"job {record.id} has already ended"})
    await core.durable()
    assert core.event_names(record) == before and record.status == 0


async def test_cancel_of_a_job_found_in_cleanup_after_a_restart_is_refused(core: Core) -> None:
    """The finish of a job was durable and its clean not (the writer commits them apart) when rank 0 stopped; a
    client asks to cancel it while the reattach window is open."""
    record = await running(core)
    core.crash_at("clean")
    core.done(0, record, 0)
    async with core_rig.restarted(core) as second:
        found = second.manager.jobs[record.id]
        assert found.state is State.CLEANUP
        reply = second.manager.cancel(os.getuid(), [record.id])
        assert reply == ([], {str(record.id): f"job {record.id} has already ended"})
        second.settle({})
        await second.durable()
        assert found.state is State.INACTIVE and (found.status, found.exception) == (0, None)
        assert second.event_names(found) == [*QUEUED, "alloc", "start", *ENDED]


async def test_cancel_reports_unknown_and_foreign_jobs_per_id(core: Core) -> None:
    record = core.submit()
    await core.durable()
    other = os.getuid() + 1
    assert core.manager.cancel(other, [record.id, 99, "x"]) == ([], {
        str(record.id): f"permission denied: job {record.id} belongs to uid {os.getuid()}",
        "99": "job 99 does not exist (or was purged)",
        "x": "job id must be an integer, got 'x'",
    })
    assert record.state is State.SCHED


# --- duplicate results -----------------------------------------------------------------------------------------


async def test_a_result_reported_twice_counts_once_and_is_acknowledged_twice(core: Core) -> None:
    record = await running(core, ntasks=2)
    core.done(0, record, 0)
    core.done(0, record, 0)
    assert (record.succeeded, record.tasks_left, record.state) == (1, 1, State.RUN)
    core.done(0, record, 1, 3)
    assert record.state is State.INACTIVE and (record.succeeded, record.failed) == (1, 1) and record.status == 3
    core.done(0, record, 1, 0)  # after the job ended: acknowledged only
    await core.durable()
    acks = [m.body["keys"] for m in core.sender.take("done-ack")]
    assert acks == [[[record.id, 0]], [[record.id, 0]], [[record.id, 1]], [[record.id, 1]]]
    assert core.events(record)[-3] == ("finish", {"status": 3, "counts": {"succeeded": 1, "failed": 1,
                                                                          "cancelled": 0}})


async def test_duplicates_inside_one_done_message_count_once(core: Core) -> None:
    record = await running(core, array="0-2")
    result = [record.id, 1, 0, 0, None, None, 999.0, 1000.0]
    core.execution.on_done(0, [result, list(result)])
    assert (record.succeeded, record.tasks_left) == (1, 2)


# --- time limits -----------------------------------------------------------------------------------------------


async def test_a_time_limit_fires_at_its_second_and_not_before(core: Core) -> None:
    record = await running(core, time_limit=10.0)
    core.clock.advance(9.5)
    core.execution.check_deadlines(core.clock())
    assert core.kills() == [] and not record.ending
    core.clock.advance(0.5)
    core.execution.check_deadlines(core.clock())
    assert core.kills() == [(0, [[record.id, 0]], signal.SIGTERM)]
    assert record.exception == "timeout" and record.reason == "time limit of 10s reached"
    core.done(0, record, 0, CANCEL_STATUS)
    assert record.state is State.INACTIVE and record.status == 128 + signal.SIGTERM
    await core.durable()
    exception = dict(core.events(record))["exception"]
    assert exception["type"] == "timeout" and exception["severity"] == 0


async def test_a_job_without_a_limit_gets_the_configured_default(tmp_path) -> None:
    async with core_rig.started(tmp_path, default_time_limit=60.0) as core:
        record = await running(core)
        core.clock.advance(59.0)
        core.execution.check_deadlines(core.clock())
        assert not record.ending
        core.clock.advance(1.0)
        core.execution.check_deadlines(core.clock())
        assert record.exception == "timeout" and core.kills() == [(0, [[record.id, 0]], signal.SIGTERM)]


async def test_an_array_element_over_its_limit_is_ended_alone(core: Core) -> None:
    record = await running(core, array="0-1", time_limit=10.0)
    core.clock.advance(10.0)
    core.execution.check_deadlines(core.clock())
    assert sorted(core.kills()) == [(0, [[record.id, 0]], signal.SIGTERM), (0, [[record.id, 1]], signal.SIGTERM)]
    assert not record.ending and record.exception is None, "an element's limit does not end the array"
    core.done(0, record, 0, CANCEL_STATUS)
    assert record.state is State.RUN
    core.done(0, record, 1, 0)
    assert record.state is State.INACTIVE and (record.failed, record.succeeded) == (1, 1)


async def test_a_time_limit_raised_while_running_moves_the_deadline(core: Core) -> None:
    record = await running(core, time_limit=10.0)
    core.clock.advance(5.0)
    core.manager.workflow.update(record, record.uid, {"time_limit": 30.0})
    core.clock.advance(5.0)
    core.execution.check_deadlines(core.clock())
    assert core.kills() == [] and not record.ending, "the old deadline no longer holds"
    core.clock.advance(20.0)
    core.execution.check_deadlines(core.clock())
    assert record.exception == "timeout" and record.reason == "time limit of 30s reached"


async def test_a_time_limit_lowered_below_the_time_run_fires_at_the_next_check(core: Core) -> None:
    record = await running(core, time_limit=100.0)
    core.clock.advance(20.0)
    core.manager.workflow.update(record, record.uid, {"time_limit": 10.0})
    core.execution.check_deadlines(core.clock())
    assert core.kills() == [(0, [[record.id, 0]], signal.SIGTERM)] and record.exception == "timeout"


# --- purge -----------------------------------------------------------------------------------------------------


async def test_purge_forgets_inactive_jobs_once_older_than_the_configured_age(tmp_path) -> None:
    async with core_rig.started(tmp_path, purge_max_age=100.0) as core:
        old, young, live = core.submit(), core.submit(), core.submit()
        await core.durable()
        core.manager.cancel(old.uid, [old.id])
        core.clock.advance(60.0)
        core.manager.cancel(young.uid, [young.id])
        await core.durable()
        core.clock.advance(40.0)
        assert await core.manager.purge() == 0, "exactly the age is not older"
        core.clock.advance(1.0)
        assert await core.manager.purge() == 1
        assert core.manager.find(old.id) is None and core.manager.find(young.id) is young
        assert core.manager.find(live.id) is live
        assert core.manager.queue_counts()["INACTIVE"] == 1
        await core.durable()
        assert core.events(old) == [], "its journal rows go too"
        with pytest.raises(JobError, match="does not exist"):
            core.manager.get(old.id)


async def test_purge_keeps_at_most_the_configured_count_oldest_first(tmp_path) -> None:
    async with core_rig.started(tmp_path, purge_max_count=2) as core:
        ids = [core.submit().id for _ in range(4)]
        await core.durable()
        core.manager.cancel(os.getuid(), ids)
        await core.durable()  # a purge reads only committed rows: a job is purged once its end is durable
        assert await core.manager.purge() == 2
        assert [core.manager.find(i) is not None for i in ids] == [False, False, True, True]
        assert core.manager.queue_counts()["INACTIVE"] == 2
