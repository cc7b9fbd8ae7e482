"""One state machine for live posting and restart replay: a job rebuilt from its eventlog after a restart
(broker/recovery.py, applying each event with `Job.apply`) is the job the live broker had built by posting those
events (broker/jobmanager.py), caught at the crash, before the reattach window settles anything."""
from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from broker.job import Job, State
from tests.unit import core_rig
from tests.unit.core_rig import Core

# What events and results put on a job record (not what only execution tracks: running tasks, ranks).
FIELDS = ("state", "seq", "t_run", "exception", "cause_status", "ending", "reason", "truncated", "status",
          "succeeded", "failed", "cancelled", "tasks_left", "output_bytes", "oseq")


def record_of(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in FIELDS}


async def running_two(core: Core) -> Job:
    return await core.running(ntasks=2, nnodes=2)


async def cancelled_while_running(core: Core) -> Job:
    record = await running_two(core)
    core.manager.cancel(record.uid, [record.id])
    return record


async def one_task_failed_with_an_error(core: Core) -> Job:
    record = await running_two(core)
    core.done(1, record, 1, 127, error="no such file: nothing")
    return record


async def array_success_met(core: Core) -> Job:
    record = await core.running(array="0-3", success_count=1)
    core.done(0, record, 0)
    assert record.ending and record.running == 3, "its other elements are being ended"
    return record


async def output_cut_at_the_cap(core: Core) -> Job:
    record = await running_two(core)
    core.execution.on_output([[record.id, 0, 1, b"line\n" * 10]])
    return record


async def timed_out(core: Core) -> Job:
    record = await running_two(core)
    core.clock.advance(3600.0)
    core.execution.check_deadlines(core.clock())
    return record


async def retried(core: Core) -> Job:
    """Its second attempt runs: the job's run time is that attempt's start."""
    record = await core.running(retries=1)
    core.done(0, record, 0, 1)
    core.clock.advance(30.0)
    assert record.state is State.SCHED and core.schedule()
    return record


SCENARIOS: list[Callable[[Core], Awaitable[Job]]] = [
    running_two, cancelled_while_running, one_task_failed_with_an_error, array_success_met, output_cut_at_the_cap,
    timed_out, retried,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_a_replayed_job_is_the_job_live_posting_built(tmp_path, scenario) -> None:
    async with core_rig.started(tmp_path, output_cap=32, default_time_limit=60.0) as core:
        core.add_rank(0)
        core.add_rank(1)
        record = await scenario(core)
        await core.durable()
        live = record_of(record)
        assert live["state"] in (State.RUN, State.SCHED), "caught while active"
        async with core_rig.restarted(core) as second:
            assert record_of(second.manager.jobs[record.id]) == live


async def test_ending_exception_status_and_note_come_back_as_posted(tmp_path) -> None:
    async with core_rig.started(tmp_path) as core:
        core.add_rank(0)
        core.add_rank(1)
        record = await cancelled_while_running(core)
        await core.durable()
        async with core_rig.restarted(core) as second:
            job = second.manager.jobs[record.id]
            assert job.ending and job.cause_status == 128 + signal.SIGTERM
            assert job.reason == f"cancelled by uid {record.uid}"


async def test_a_job_found_in_cleanup_keeps_the_reason_it_failed_for(tmp_path) -> None:
    """Replaying `finish` records its status and counts, and leaves the reason the job already had alone."""
    async with core_rig.started(tmp_path) as core:
        core.add_rank(0)
        record = await core.running()
        core.crash_at("clean")
        core.done(0, record, 0, 127, error="no such file: nothing")
        assert record.reason == "task 0 on rank 0: no such file: nothing"
        async with core_rig.restarted(core) as second:
            job = second.manager.jobs[record.id]
            assert job.state is State.CLEANUP
            second.settle({})
            await second.durable()
            assert job.state is State.INACTIVE and (job.status, job.failed) == (127, 1)
            assert job.summary()["reason"] == record.reason
