"""Broker restart: rebuild the job table from the journal and reattach running work (architecture.md#restart).

The rule, documented for users:
  * queued jobs are queued again, in their original order;
  * a job that was running is reattached when the workers that rejoin within `reattach_timeout` report all of
    its tasks still running (or finished: their results are kept by the workers until acknowledged);
  * otherwise a plain job ends with the exception `broker-restart`, and the tasks that survived are killed;
  * array elements that nobody reports are queued again (each element is independent);
  * a job whose ending exception (cancel, timeout, ...) was already recorded is finished, and any of its
    tasks still reported are killed.
While the reattach window is open the scheduler starts nothing, so no core is handed out twice.
"""
from __future__ import annotations

import logging
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from broker import sched
from broker.history import record_of
from broker.job import Event, Job, State
from broker.execution import Execution
from broker.jobmanager import JobManager, request_of
from broker.durable.store import JobStore, unpack
from broker.taskmap import TaskMap
from minicluster.proto import messages

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    next_id: int
    epoch: int
    active: list[Job] = field(default_factory=list)


def load(manager: JobManager) -> Recovered:
    """Read the jobs that were queued or running into `manager.jobs`, and the counts of finished ones: the
    history itself stays in the journal (broker/history.py)."""
    store = manager.store
    epoch, next_id = store.next_epoch()
    out = Recovered(next_id=next_id, epoch=epoch)
    for row in store.active_job_rows():
        job = record_of(row)
        manager.jobs[job.id] = job
        out.active.append(job)
    manager.history.load_counts()
    by_id = {j.id: j for j in out.active}
    _replay_events(store, by_id)
    _restore_results(store, by_id)
    _restore_output(store, by_id, manager.config.output_cap)
    return out


def _replay_events(store: JobStore, active: dict[int, Job]) -> None:
    """An active job's state, next sequence number and what its events carry come from its event log, not its
    row: each event is applied as it was when posted (broker/job.py). Their effects are dropped: what they did
    happened before the crash, and what is still to do the reattach window's settlement decides."""
    if not active:
        return
    rows = store.events_of(list(active))
    for job in active.values():
        job.reset_for_replay()
    for job_id, seq, ts, name, context in rows:
        active[job_id].apply(Event(name, unpack(context), seq, ts))


def _restore_results(store: JobStore, active: dict[int, Job]) -> None:
    if not active:
        return
    for job_id, task, _, rank, status, _, _, error, _, _ in store.results_of(list(active)):
        job = active[job_id]
        if job.state in (State.RUN, State.CLEANUP):
            job.ranks.add(rank)  # where it ran, for `mc jobs`: those of its tasks that still run add theirs
        # A job in CLEANUP has its counts from its `finish` event; the reason it failed for is in its results.
        counted = job.state == State.CLEANUP or job.mark_done(task)
        if counted and job.state != State.CLEANUP:
            job.record_result(status, was_running=False)
        if counted and error and job.reason is None:
            job.reason = job.failure_note(task, rank, status, error)


def _restore_output(store: JobStore, active: dict[int, Job], cap: int) -> None:
    """Output goes on from the next sequence number and counts against the cap what was already kept."""
    if not active:
        return
    for job_id, last, kept in store.output_extent(list(active)):
        active[job_id].restore_output(last + 1, kept, cap)


class Reattach:
    """Collects what rejoining workers report while the window is open, then settles every active job."""

    def __init__(self, manager: JobManager, active: list[Job]) -> None:
        self.manager = manager
        # Jobs still waiting for their dependencies are the workflow's to recover (broker/flow/recovery.py).
        self.active = [job for job in active if job.state not in (State.DEPEND, State.PRIORITY)]
        # rank -> what it runs; a rank may join several times in the window, its last report counts.
        self.by_rank: dict[int, list[list[Any]]] = {}

    @property
    def needed(self) -> bool:
        return bool(self.active)

    def report(self, rank: int, running: list[list[Any]]) -> None:
        self.by_rank[rank] = running

    def _reports(self) -> dict[int, list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]]:
        out: dict[int, list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]] = defaultdict(list)
        self.stale: list[tuple[int, int, int]] = []
        for rank, running in self.by_rank.items():
            for entry in running:
                job = self.manager.jobs.get(int(entry[0]))
                attempt = int(entry[4]) if len(entry) > 4 else 0
                if job is not None and job.flow is not None and not job.flow.current(int(entry[1]), attempt,
                                                                                     job.is_array):
                    # An attempt that was already recorded as ended (protocol.md §2.9): kill it.
                    self.stale.append((rank, job.id, int(entry[1])))
                    continue
                out[int(entry[0])].append((rank, int(entry[1]), tuple(entry[2]), tuple(entry[3])))
        return out

    def settle(self, execution: Execution, now: float) -> None:
        """Close the window: reattach what is whole, end or requeue the rest, kill strays."""
        self.reports = self._reports()
        known = {j.id for j in self.active}
        for job in self.active:
            if job.state in (State.RUN, State.SCHED):
                self._settle_job(job, execution, now)
            elif job.state == State.CLEANUP:
                self.manager.clean(job)
        strays: dict[int, list[list[int]]] = defaultdict(list)
        for job_id, entries in self.reports.items():
            if job_id not in known:
                for rank, task, _, _ in entries:
                    strays[rank].append([job_id, task])
        for rank, job_id, task in self.stale:
            strays[rank].append([job_id, task])
        for rank, keys in strays.items():
            messages.send(execution.send, rank, messages.Kill(keys, 9))

    def _settle_job(self, job: Job, execution: Execution, now: float) -> None:
        entries = [e for e in self.reports.get(job.id, []) if not job.is_done(e[1])]
        if job.ending:
            # An exception had already ended the job: finish it, and its surviving tasks with it.
            for rank, task, _, _ in entries:
                messages.send(execution.send, rank, messages.Kill([[job.id, task]], 9))
            self.manager.finish(job)
            return
        spec = job.spec
        assert spec is not None
        request = request_of(spec)
        if job.is_array:
            for rank, task, cores, gpus in entries:
                alloc = sched.Allocation({rank: sched.RankAlloc((sched.Slot(cores, gpus),))})
                # Negative element keys cannot collide with the elements of the re-queued remainder.
                execution.adopt(job, task, -1 - task, rank, alloc, now)
            left = _still_to_run(job, {e[1] for e in entries})
            if left:
                job.pending_map = left
                self.manager.enqueue(job, request, count=len(left))
            else:
                self.manager.maybe_finish(job)
            return
        if job.state == State.SCHED:
            if not entries:
                self.manager.enqueue(job, request)
                return
            # Sent ahead and started before the restart (protocol.md §2.10): started now, and reattached below.
            execution.window.started_ahead(job, entries[0][0])
        if job.tasks_left == 0:
            self.manager.maybe_finish(job)
            return
        whole = len(entries) == job.tasks_left and job.tasks_left > 0
        if whole:
            ranks = {e[0] for e in entries}
            # What the request held beyond the tasks (exclusive racks or sockets) follows from the topology.
            alloc = sched.rebuild_allocation(self.manager.scheduler.graph, request,
                                             [(e[0], e[2], e[3]) for e in sorted(entries, key=lambda e: e[1])])
            for rank, task, _, _ in entries:
                execution.adopt(job, task, 0, rank, None, now)
            self.manager.scheduler.adopt(job.id, 0, alloc, job.t_run or now, self.manager.time_limit(spec),
                                         job=self.manager.sched_job(job, request))
            log.info("job %d reattached on ranks %s", job.id, sorted(ranks))
            return
        for rank, task, _, _ in entries:
            messages.send(execution.send, rank, messages.Kill([[job.id, task]], 9))
        self.manager.raise_exception(
            job, "broker-restart",
            f"{len(entries)} of {job.tasks_left} unfinished tasks were reclaimed after a restart")


def _still_to_run(job: Job, busy: set[int]) -> TaskMap:
    """An array's tasks neither done nor running: those below the highest that ever ran, one by one, and every
    task above it as one run (built without visiting each of, say, 10^8 elements)."""
    ran = max(len((job.done_bits or b"").rstrip(b"\0")) * 8, max(busy, default=-1) + 1)
    ran = min(ran, job.total_tasks)
    below = array("I", (t for t in range(ran) if not job.is_done(t) and t not in busy))
    return TaskMap([below, range(ran, job.total_tasks)])
