"""Finished jobs out of memory (issue 17 item 4; broker/history.py), on the core rig: the job manager keeps only
active jobs and a bounded cache of finished ones; the rest are read back from the journal, and the counts of
finished jobs follow submissions, restarts and purges without walking the history.
"""
from __future__ import annotations

import os

from broker.job import Job, State
from tests.unit import core_rig
from tests.unit.core_rig import Core


async def finished(core: Core, count: int, **fields) -> list[Job]:
    """`count` jobs that ran on rank 0 and ended (every other one failing), their ends durable."""
    core.add_rank(0)
    jobs = []
    for i in range(count):
        job = await core.running(**fields)
        for task in range(job.total_tasks):
            core.done(0, job, task, status=i % 2)
        jobs.append(job)
    await core.durable()
    return jobs


def full_count(core: Core) -> dict[str, int]:
    """What the counts must be: a walk of the whole journal, as the old broker walked its table."""
    rows = core.journal.query("SELECT COALESCE(status, 0) != 0, COUNT(*) FROM jobs WHERE state='INACTIVE' "
                              "GROUP BY 1")
    counts = dict(rows)
    return {"succeeded": counts.get(0, 0), "failed": counts.get(1, 0)}


def counts(core: Core) -> dict[str, int]:
    history = core.manager.history
    assert core.manager.queue_counts()["INACTIVE"] == history.count
    return {"succeeded": history.succeeded, "failed": history.failed}


async def test_finished_jobs_leave_memory_and_are_read_back_by_id(tmp_path) -> None:
    async with core_rig.started(tmp_path, finished_cache=2) as core:
        jobs = await finished(core, 5, ntasks=2, name="done")
        assert not set(core.manager.jobs) & {j.id for j in jobs}, "finished jobs left the job table"
        assert list(core.manager.history.cache) == [jobs[3].id, jobs[4].id], "the cache keeps the last two"
        first = core.manager.get(jobs[0].id)
        assert first is not jobs[0], "read back from the journal"
        assert (first.state, first.status, first.name, first.total_tasks, first.closed) == \
            (State.INACTIVE, 0, "done", 2, True)
        assert first.summary()["counts"] == jobs[0].summary()["counts"]
        second = core.manager.get(jobs[1].id)
        assert (second.status, second.failed, second.reason) == (1, 2, jobs[1].reason)
        assert list(core.manager.history.cache) == [jobs[0].id, jobs[1].id], "bounded, most recently used kept"
        assert core.manager.get(jobs[1].id) is second, "a hit is served from the cache"


async def test_a_restart_reads_active_jobs_and_counts_not_the_history(tmp_path) -> None:
    async with core_rig.started(tmp_path) as core:
        done = await finished(core, 4)
        queued = core.submit(ntasks=64)  # more than the rank has: stays queued
        await core.durable()
        async with core_rig.restarted(core) as second:
            assert set(second.manager.jobs) == {queued.id}, "only the active job is loaded"
            assert not second.manager.history.cache
            assert counts(second) == full_count(second) == {"succeeded": 2, "failed": 2}
            again = second.manager.get(done[1].id)
            assert (again.state, again.status, again.t_inactive) == (State.INACTIVE, 1, done[1].t_inactive)
            assert second.manager.get(queued.id).state is State.SCHED


async def test_counts_match_a_full_count_after_jobs_end_and_after_a_purge(tmp_path) -> None:
    async with core_rig.started(tmp_path, purge_max_count=3, finished_cache=1) as core:
        await finished(core, 6)
        assert counts(core) == full_count(core) == {"succeeded": 3, "failed": 3}
        assert await core.manager.purge() == 3
        assert counts(core) == full_count(core)
        assert core.manager.history.count == 3
        cancelled = core.submit(ntasks=64)
        await core.durable()
        core.manager.cancel(os.getuid(), [cancelled.id])
        await core.durable()
        assert counts(core) == full_count(core) and core.manager.history.count == 4
        async with core_rig.restarted(core) as second:
            assert counts(second) == full_count(second)
            assert await second.manager.purge() == 1
            assert counts(second) == full_count(second) and second.manager.history.count == 3
