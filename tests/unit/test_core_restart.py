"""Restart settlement without sockets: each case of docs/architecture.md#restart, by replaying the journal one life
of rank 0 left into a fresh JobManager (broker/recovery.py load, Reattach, broker/flow/recovery.py) and closing
the reattach window with what the workers report in their `join`."""
from __future__ import annotations

import signal

import pytest

from broker.job import State
from tests.unit import core_rig
from tests.unit.core_rig import Core

RESTART_STATUS = 128 + signal.SIGKILL


@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path) as rig:
        rig.add_rank(0)
        rig.add_rank(1)
        yield rig


def rejoin(core: Core, cores: str = "cores=2,memory=4096") -> None:
    """The workers of ranks 0 and 1 rejoin the new rank 0 with the resources they had."""
    core.add_rank(0, cores)
    core.add_rank(1, cores)


async def test_queued_jobs_are_queued_again_in_their_original_order(core: Core) -> None:
    # Too big for the nodes there are now; the middle one is the most urgent, so the queue reads 2, 1, 3.
    ids = [core.submit(cores_per_task=4, urgency=urgency).id for urgency in (16, 20, 16)]
    await core.durable()
    async with core_rig.restarted(core) as second:
        assert second.epoch == 1 and second.manager.next_id == 4
        assert [second.manager.jobs[i].state for i in ids] == [State.SCHED] * 3
        second.settle({})
        second.add_rank(0, "cores=4,memory=4096")
        started = []
        for _ in ids:
            (start,) = second.schedule()
            started.append(start.job_id)
            second.done(0, second.manager.jobs[start.job_id], 0)
        assert started == [ids[1], ids[0], ids[2]]
        assert second.submit().id == 4


async def test_a_running_job_every_task_of_which_is_reported_is_reattached(core: Core) -> None:
    record = await core.running(ntasks=2, nnodes=2)
    async with core_rig.restarted(core) as second:
        rejoin(second)
        second.settle(second.reports((record, [0, 1])))
        job = second.manager.jobs[record.id]
        assert job.state is State.RUN and not job.ending and job.running == 2
        assert second.kills() == []
        assert sorted(second.graph.held_ranks((job.id, 0))) == [0, 1], "its allocation is held again"
        second.submit(nnodes=2, ntasks=2, cores_per_task=2)
        assert second.schedule() == [], "a job needing the whole of both nodes waits for it"
        second.done(0, job, 0)
        second.done(1, job, 1)
        assert job.state is State.INACTIVE and job.status == 0
        await second.durable()
        assert second.event_names(job)[-4:] == ["start", "finish", "release", "clean"]


@pytest.mark.parametrize("reported", [[0], []], ids=["one-of-two", "none"])
async def test_a_running_job_not_wholly_reported_ends_with_broker_restart(core: Core, reported: list[int]) -> None:
    record = await core.running(ntasks=2, nnodes=2)
    async with core_rig.restarted(core) as second:
        rejoin(second)
        second.settle(second.reports((record, reported)))
        job = second.manager.jobs[record.id]
        assert job.state is State.INACTIVE and job.exception == "broker-restart" and job.status == RESTART_STATUS
        assert job.reason == f"{len(reported)} of 2 unfinished tasks were reclaimed after a restart"
        survivors = [(second.placed[(job.id, t)][0], [[job.id, t]], signal.SIGKILL) for t in reported]
        assert second.kills() == survivors, "survivors are killed"
        assert second.graph.held_ranks((job.id, 0)) == []


async def test_a_job_with_a_failure_policy_is_requeued_instead(core: Core) -> None:
    record = await core.running(ntasks=2, nnodes=2, retries=1)
    async with core_rig.restarted(core) as second:
        rejoin(second)
        second.settle(second.reports((record, [1])))
        job = second.manager.jobs[record.id]
        assert job.state is State.SCHED and job.exception is None
        assert second.kills() == [(1, [[job.id, 1]], signal.SIGKILL)]
        await second.durable()
        events = second.events(job)
        assert ("exception", {"type": "broker-restart", "severity": 1,
                              "note": "1 of 2 unfinished tasks were reclaimed after a restart"}) in events
        assert events[-1][0] == "requeue"


async def test_array_elements_nobody_reports_are_queued_again(core: Core) -> None:
    record = await core.running(array="0-3")
    async with core_rig.restarted(core) as second:
        rejoin(second)
        second.settle(second.reports((record, [0, 2])))
        job = second.manager.jobs[record.id]
        assert job.state is State.RUN and job.exception is None and second.kills() == []
        assert list(job.pending_map or ()) == [1, 3] and job.running == 2
        second.schedule()
        await second.durable()
        assert sorted(entry[1] for _, entries in second.runs() for entry in entries) == [1, 3]
        for task in range(4):  # each from the rank it runs on
            second.done(second.execution.tasks[(job.id, task)].rank, job, task)
        assert job.state is State.INACTIVE and job.succeeded == 4


async def test_a_job_whose_ending_exception_was_recorded_is_finished_and_its_survivors_killed(core: Core) -> None:
    record = await core.running(ntasks=2, nnodes=2)
    core.manager.cancel(record.uid, [record.id])
    await core.durable()
    async with core_rig.restarted(core) as second:
        job = second.manager.jobs[record.id]
        assert job.state is State.RUN and job.ending
        rejoin(second)
        second.settle(second.reports((record, [0, 1])))
        assert job.state is State.INACTIVE and job.exception == "cancel" and job.status == 128 + signal.SIGTERM
        assert sorted(second.kills()) == [(0, [[job.id, 0]], signal.SIGKILL), (1, [[job.id, 1]], signal.SIGKILL)]


async def test_a_job_found_in_cleanup_is_cleaned_with_the_status_it_had(core: Core) -> None:
    record = await core.running()
    core.crash_at("clean")
    core.done(0, record, 0, 5)
    async with core_rig.restarted(core) as second:
        job = second.manager.jobs[record.id]
        assert job.state is State.CLEANUP
        second.settle({})
        await second.durable()
        assert job.state is State.INACTIVE and job.closed and (job.status, job.failed) == (5, 1)
        assert second.event_names(job)[-3:] == ["finish", "release", "clean"]


async def test_results_held_while_rank0_was_away_settle_the_job_in_the_window(core: Core) -> None:
    record = await core.running(ntasks=2, nnodes=2)
    async with core_rig.restarted(core) as second:
        rejoin(second)
        job = second.manager.jobs[record.id]
        second.done(0, job, 0)  # carried in rank 0's join
        second.done(1, job, 1, 2)
        second.settle({})
        assert job.state is State.INACTIVE and job.exception is None and job.status == 2
        assert (job.succeeded, job.failed) == (1, 1) and second.kills() == []
        assert not second.manager.scheduler.holds(job.id, 0), "an ended job keeps no cores"


async def test_results_re_sent_after_a_restart_count_once(core: Core) -> None:
    record = await core.running(ntasks=2, nnodes=2)
    core.done(0, record, 0)
    await core.durable()
    async with core_rig.restarted(core) as second:
        job = second.manager.jobs[record.id]
        assert (job.succeeded, job.tasks_left) == (1, 1), "the recorded result is restored"
        rejoin(second)
        second.settle(second.reports((record, [1])))
        assert job.state is State.RUN and job.running == 1, "the job is whole: one task left, one reported"
        second.done(0, job, 0)  # re-sent: its ack was lost with the old rank 0
        assert (job.succeeded, job.tasks_left) == (1, 1)
        second.done(1, job, 1)
        assert job.state is State.INACTIVE and job.succeeded == 2 and job.status == 0


async def test_tasks_of_jobs_rank0_does_not_run_are_killed(core: Core) -> None:
    record = await core.running()
    core.done(0, record, 0)
    await core.durable()
    async with core_rig.restarted(core) as second:
        rejoin(second)
        second.settle({0: [[record.id, 0, [0], []]], 1: [[77, 3, [1], []]]})
        assert sorted(second.kills()) == [(0, [[record.id, 0]], signal.SIGKILL), (1, [[77, 3]], signal.SIGKILL)]


async def test_dependencies_whose_target_ended_meanwhile_are_judged_once_the_window_closed(core: Core) -> None:
    target = await core.running(array="0")  # (a plain target meets the bug of the test above)
    waiting = core.submit(dependencies=[{"type": "afterok", "jobs": [target.id]}])
    failing = core.submit(dependencies=[{"type": "afternotok", "jobs": [target.id]}])
    await core.durable()
    async with core_rig.restarted(core) as second:
        rejoin(second)
        ended = second.manager.jobs[target.id]
        second.done(0, ended, 0)  # it ended while rank 0 was away
        assert second.manager.jobs[waiting.id].state is State.DEPEND, "nothing is judged in the window"
        second.settle({})
        assert ended.state is State.INACTIVE
        assert second.manager.jobs[waiting.id].state is State.SCHED
        never = second.manager.jobs[failing.id]
        assert never.state is State.INACTIVE and never.exception == "dependency"


async def test_a_straggler_of_an_attempt_already_recorded_is_killed_not_adopted(core: Core) -> None:
    record = await core.running(retries=1)
    core.done(0, record, 0, 1)  # attempt 0 failed: retried
    assert record.state is State.SCHED and core.schedule()
    await core.durable()
    assert [entry for _, entries in core.runs() for entry in entries] == [[record.id, 0, 0, [0], [], 1]]
    async with core_rig.restarted(core) as second:
        rejoin(second)
        # Rank 0 still runs attempt 0's process (it has not died yet) next to attempt 1 (protocol.md §2.9).
        second.settle({0: [[record.id, 0, [1], [], 0], [record.id, 0, [0], [], 1]]})
        job = second.manager.jobs[record.id]
        assert second.kills() == [(0, [[record.id, 0]], signal.SIGKILL)]
        assert job.state is State.RUN and job.running == 1 and not job.ending, "attempt 1 is adopted"
        second.done(0, job, 0, 1, attempt=0)
        assert job.state is State.RUN and job.running == 1, "the straggler's result is acknowledged only"
        second.done(0, job, 0, 0, attempt=1)
        assert job.state is State.INACTIVE and job.status == 0 and job.retries == 1
