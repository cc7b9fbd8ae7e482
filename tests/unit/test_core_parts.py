"""Each rank-0 component built alone from what its constructor asks for (issue 27 item 1): the job manager with
task execution stood in by a recording `Tasks`, and the dispatch window with a manager, a map of running tasks, a
`jobinfo` function and a send function, no Execution. The other parts are real: the sqlite journal, the scheduler
and its resource graph, the message codec (RecordingSender).
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from broker import nodes, sched
from broker.job import Job, State
from broker.jobmanager import JobManager
from broker.durable.journal import Journal
from broker.supervise import Supervisor
from broker.watchers import Watchers
from broker.window import DispatchWindow
from minicluster.config import InstanceConfig
from minicluster.proto import messages
from minicluster.testing import FakeClock, RecordingSender, flushed, jobspec, resources


class RecordingTasks:
    """The job manager's `Tasks`, recording what it was asked; `ahead` says which jobs wait ahead where."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.ahead: dict[int, int] = {}

    def kill_job(self, job: Job, sig: int) -> None:
        self.calls.append(("kill", job.id))

    def job_finished(self, job: Job) -> None:
        self.calls.append(("finished", job.id))

    def retime(self, job: Job) -> None:
        self.calls.append(("retime", job.id))

    def running_tasks(self, job: Job) -> list[int]:
        return []

    def recall_ahead(self, job: Job) -> None:
        self.calls.append(("recall", job.id))

    def ahead_rank(self, job: Job) -> int | None:
        return self.ahead.get(job.id)


class Parts(NamedTuple):
    manager: JobManager
    tasks: RecordingTasks
    wakes: list[None]


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    config = InstanceConfig(size=2, state_dir=os.fspath(tmp_path / "state"), dispatch_window=4)
    journal = Journal(config.state_dir)
    graph, _ = nodes.build_graph(config)
    assert nodes.add_rank(graph, 1, resources("cores=2,memory=4096").to_wire(), frozenset()) is None
    tasks, wakes = RecordingTasks(), []
    failures: list[BaseException] = []
    manager = JobManager(config, journal, sched.Scheduler(graph, config.policy, config.default_time_limit),
                         Watchers(), os.getuid(), next_id=1, tasks=lambda _: tasks,
                         wake_scheduler=lambda: wakes.append(None),
                         background=Supervisor(lambda name, exc: failures.append(exc)), clock=FakeClock())
    journal.start()
    try:
        yield Parts(manager, tasks, wakes)
    finally:
        await journal.close()
    assert not failures


async def submitted(manager: JobManager, **fields: Any) -> Job:
    job_id, durable = manager.submit(os.getuid(), os.getgid(), jobspec(("true",), **fields))
    await durable
    await flushed(manager.journal)
    return manager.jobs[job_id]


async def test_the_manager_alone_queues_a_job_once_durable_and_asks_its_tasks_to_end_it(parts: Parts) -> None:
    manager, tasks, wakes = parts
    job = await submitted(manager)
    assert job.state is State.SCHED and wakes, "queued once durable, and the scheduler woken"
    assert [start.job_id for start in manager.scheduler.schedule(manager.clock())] == [job.id]
    manager.post_started(job, "1")
    job.task_started(1)  # as Execution counts the task it sends
    await flushed(manager.journal)
    assert job.state is State.RUN

    manager.cancel(os.getuid(), [job.id])
    await flushed(manager.journal)
    assert ("kill", job.id) in tasks.calls and ("recall", job.id) in tasks.calls
    assert job.state is State.RUN, "its task still runs: the job ends when its result comes"


async def test_the_manager_does_not_finish_a_job_its_tasks_hold_ahead(parts: Parts) -> None:
    manager, tasks, _ = parts
    job = await submitted(manager)
    tasks.ahead[job.id] = 1  # sent ahead to rank 1: it comes back or starts there
    manager.cancel(os.getuid(), [job.id])
    await flushed(manager.journal)
    assert job.state is State.SCHED and ("recall", job.id) in tasks.calls

    del tasks.ahead[job.id]  # it came back
    manager.finish(job)
    await flushed(manager.journal)
    await flushed(manager.journal)
    assert job.state is State.INACTIVE and ("finished", job.id) in tasks.calls


class Running(NamedTuple):
    timed_from: float


async def test_the_window_alone_sends_an_element_ahead_hands_it_on_and_recalls_it(parts: Parts) -> None:
    manager = parts.manager
    sender = RecordingSender(rank=0)
    running: dict[tuple[int, int], Running] = {}
    infos: list[int] = []

    def jobinfo(job: Job, layout: list[list[int]]) -> messages.JobInfo:
        infos.append(job.id)
        assert job.spec is not None
        return messages.JobInfo(argv=list(job.spec.argv), env={}, ntasks=job.total_tasks, layout=layout,
                                uid=job.uid, gid=job.gid, array=True)

    window = DispatchWindow(manager.config, manager, sender.send, running, jobinfo)
    job = await submitted(manager, array="0-5")
    first = manager.scheduler.schedule(manager.clock())[0]
    head = (job.id, job.pending_map[first.element] if job.pending_map is not None else first.element)
    running[head] = Running(0.0)
    out: dict[int, messages.Ahead] = {}
    window.fill(job, head, 1, [0], [], out)
    assert list(out) == [1] and len(out[1].tasks) == 1 and infos == [job.id]
    entry = (out[1].tasks[0][0], out[1].tasks[0][1])
    assert entry not in running and window.ahead[entry].after == head

    handed = window.successor(head)
    assert handed is not None and handed[0] == entry and entry not in window.ahead

    running[entry] = Running(1.0)
    window.fill(job, entry, 1, [0], [], out)
    behind = next(key for key, ahead in window.ahead.items() if ahead.after == entry)
    window.recall_job(job)
    window.send_recalls()
    recall = sender.only("recall")
    assert recall.dst == 1 and [list(behind)] == recall.body["keys"]
