"""Job manager: submit, events, exceptions, finish and purge (protocol.md §3.3–3.7).

Owns the in-memory job table and the rule "an event is visible only once durable": every event goes to the
journal, and followers hear of it from the commit callback.  Starting, tracking and killing tasks lives in
broker/execution.py; choosing where they run lives in broker/sched/.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker import sched
from broker.durable import store
from broker.history import History
from broker.job import Effect, Event, Job, State
from broker.ports import SharingPolicy, Tasks
from broker.durable.journal import Journal, JournalRefused, Statement, when_durable
from broker.supervise import Supervisor
from broker.watchers import Watchers
from broker.flow.workflow import Workflow, WorkflowRefusal
from minicluster.config import InstanceConfig
from minicluster.model.idset import IdSet
from minicluster.model.jobspec import Jobspec

log = logging.getLogger(__name__)


# The status of a job an exception ended (protocol.md §3.6): 128 + the signal its tasks were ended with, as
# `scancel`ed srun and `flux cancel`ed jobs report it.  `abort` carries the status of the failing task instead.
EXCEPTION_STATUS = {
    "cancel": 128 + signal.SIGTERM,
    "timeout": 128 + signal.SIGTERM,
    "shutdown": 128 + signal.SIGTERM,
    "node-lost": 128 + signal.SIGKILL,
    "broker-restart": 128 + signal.SIGKILL,
    "preempt": 128 + signal.SIGTERM,
}


class JobError(Exception):
    """A client request about jobs was refused; `code` is a protocol.md §3.2 error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def request_of(spec: Jobspec) -> sched.Request:
    try:
        constraints = tuple(sched.parse_constraint(c) for c in spec.requires)
    except ValueError as exc:
        raise JobError("invalid-jobspec", f"requires: {exc}") from None
    if not spec.plain_shape:  # a resource tree, or topology options: docs/scheduling.md
        try:
            return sched.Request.from_shape(spec.shape(), constraints)
        except ValueError as exc:
            raise JobError("invalid-jobspec", f"resources: {exc}") from None
    try:
        return sched.Request(
            nnodes=spec.nnodes, nslots=spec.ntasks, cores_per_slot=spec.cores_per_task,
            gpus_per_slot=spec.gpus_per_task, mem_per_slot=spec.mem_per_task,
            slots_per_node=spec.tasks_per_node, exclusive=spec.exclusive, constraints=constraints,
        )
    except ValueError as exc:  # the jobspec's checks should have caught it; a guest still gets one line
        raise JobError("invalid-jobspec", str(exc)) from None


# The most finished jobs one purge pass forgets: one journal write of bounded size.
PURGE_BATCH = 50_000


class JobManager:
    """The job table and its events. `tasks` builds the task execution from the manager (the two call each other,
    so the manager makes it once it is whole); `wake_scheduler` is called when the queue may have work that fits;
    `background` runs the workflow's background work; `sharing` is None in an instance without queues and banks
    (unit tests)."""

    def __init__(self, config: InstanceConfig, journal: Journal, scheduler: sched.Scheduler,
                 watchers: Watchers, owner_uid: int, next_id: int, *,
                 tasks: Callable[[JobManager], Tasks], wake_scheduler: Callable[[], None],
                 background: Supervisor, sharing: SharingPolicy | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.journal = journal
        self.store = store.JobStore(journal)
        self.scheduler = scheduler
        self.watchers = watchers
        self.owner_uid = owner_uid
        self.next_id = next_id
        self.clock = clock
        self.wake_scheduler = wake_scheduler
        self.sharing = sharing
        self.jobs: dict[int, Job] = {}
        # Jobs whose submission is not durable yet: not shown to anyone until it is (or forgotten if refused).
        self.unacknowledged: set[int] = set()
        self.all_ranks_seen = False
        self._feasible: dict[sched.Request, str] = {}
        # Finished jobs: in the journal, a bounded cache of them in memory (broker/history.py).
        self.history = History(self.store, config.finished_cache)
        # Dependencies, failure and success policies, holds, updates and requeues (protocol.md §3.9).
        self.workflow = Workflow(self, background)
        # How each effect of an applied event (broker/job.py) is carried out, given the job and its write's future.
        self._actions: dict[Effect, Callable[[Job, asyncio.Future[None] | None], object]] = {
            Effect.UNQUEUE: self._unqueue,
            Effect.KILL_TASKS: lambda job, _: self.tasks.kill_job(job, signal.SIGTERM),
            Effect.POST_FINISH: lambda job, _: self.finish(job),
            Effect.POST_RELEASE: lambda job, _: self.post(job, "release"),
            Effect.TASKS_OVER: lambda job, _: self.tasks.job_finished(job),
            Effect.POST_CLEAN: lambda job, _: self.clean(job),
            Effect.STARTED: lambda job, _: self.workflow.observe(job, "start"),
            Effect.ENDED: lambda job, _: self.workflow.observe(job, "clean"),
            Effect.CLOSE: self._close_when_durable,
            Effect.WAKE_SCHEDULER: lambda job, _: self.wake_scheduler(),
        }
        self.tasks: Tasks = tasks(self)  # last: it reads the manager

    # --- submit --------------------------------------------------------------------------------------------

    def validate(self, spec: Jobspec) -> sched.Request:
        request = request_of(spec)
        if spec.policy is not None:
            try:
                sched.check_policy(spec.policy)
            except ValueError as exc:
                raise JobError("invalid-jobspec", f"policy: {exc}") from None
        if spec.nnodes > self.config.size:
            raise JobError("infeasible", f"nnodes: needs {spec.nnodes} nodes, the MiniCluster has {self.config.size}")
        if self.all_ranks_seen:
            # Feasibility depends only on which ranks exist, so an answer holds until they change.
            verdict = self._feasible.get(request)
            if verdict is None:
                try:
                    self.scheduler.graph.check_feasible(request)
                    verdict = ""
                except sched.InfeasibleRequest as exc:
                    verdict = str(exc)
                self._feasible[request] = verdict
            if verdict:
                raise JobError("infeasible", verdict)
        return request

    def ranks_changed(self) -> None:
        self._feasible.clear()

    def submit(self, uid: int, gid: int, spec: Jobspec) -> tuple[int, asyncio.Future[None]]:
        """Create the job and queue it; returns its id and a future that resolves once it is durable."""
        if self.journal.stalled is not None:
            # Nothing is acknowledged before it is durable, and nothing could be made durable now.
            raise JobError("unavailable", f"the journal cannot be written ({self.journal.stalled}); nothing was "
                                          "submitted: try again once the broker's disk has space")
        if uid != self.owner_uid and self.owner_uid != 0:
            # Tasks of other users can only run under their own uid, which needs a root instance.
            raise JobError("permission", f"this instance runs tasks as uid {self.owner_uid} only; "
                                         f"uid {uid} may watch but not submit")
        if self.sharing is not None:
            spec = self.sharing.resolve(uid, spec)
        request = self.validate(spec)
        try:
            self.workflow.check(uid, spec)
        except WorkflowRefusal as exc:
            raise JobError(exc.code, str(exc)) from None
        if self.sharing is not None:
            self.sharing.admit(uid, spec, request, len(spec.array_ids or ()) or 1)
        # Everything the submission writes is one write, refused whole if the disk cannot take it in time: a
        # submitter that hears "refused" is never left with a job that runs later.
        with self.journal.one_write(refuse_after=self.config.submit_stall_timeout):
            return self._submitted(uid, gid, spec, request)

    def _submitted(self, uid: int, gid: int, spec: Jobspec,
                   request: sched.Request) -> tuple[int, asyncio.Future[None]]:
        now = self.clock()
        job = Job(self.next_id, uid, spec, now, gid)
        self.next_id += 1
        self.jobs[job.id] = job
        self.unacknowledged.add(job.id)
        statements = store.job_submitted(job.id, uid, gid, job.state.value, store.pack(spec.to_wire()), now,
                                         self.next_id)
        submitted = ("submit", {"uid": uid, "ntasks": job.total_tasks, "array": spec.array})
        if spec.workflow:
            self.post(job, *submitted, extra=statements)
            self.workflow.admit(job)
            # Dependencies, a hold or a policy: the workflow queues it when it may run, once durable. Journal
            # writes commit in order, so this empty write is durable once all of the job's events are.
            admitted = self.journal.write([])
            admitted.add_done_callback(lambda f: self._admitted(job, None, f))
            return job.id, admitted
        self.workflow.admit(job)
        # One write: the submission is durable whole or not at all, never a job row without its events.
        fut = self.post_many(job, [submitted, ("depend", {}), ("priority", {"priority": job.urgency})],
                             extra=statements, durable=True)
        assert fut is not None
        # Queued once durable: nothing runs that a crash or a failed commit could make never submitted.
        fut.add_done_callback(lambda f: self._admitted(job, request, f))
        return job.id, fut

    def _admitted(self, job: Job, request: sched.Request | None, durable: asyncio.Future[None]) -> None:
        """The submission is durable (queue the job; a workflow job: as the workflow decides), or refused."""
        self.workflow.admitting.discard(job.id)
        self.unacknowledged.discard(job.id)
        if durable.exception() is not None:
            # Its submitter hears why: forget it; its id is not handed out again.
            if self.jobs.get(job.id) is job:
                del self.jobs[job.id]
            self.workflow.feed(self.workflow.graph.gone(job.id))
            if isinstance(durable.exception(), JournalRefused):
                # Should a failed commit have landed after all (an fsync error after the WAL frames were
                # written), what it left of the job goes once the journal takes writes again.
                self.journal.append([*store.jobs_purged([job.id]), store.next_id_kept(self.next_id)])
            return
        if request is None:
            self.workflow.try_release(job)
        elif job.state == State.SCHED and not job.ending:  # not cancelled meanwhile
            self.enqueue(job, request)

    def _unqueue(self, job: Job, _: asyncio.Future[None] | None) -> None:
        self.scheduler.cancel(job.id)
        self.tasks.recall_ahead(job)  # what was sent ahead must not start after the job ended

    def enqueue(self, job: Job, request: sched.Request, count: int | None = None, first: int = 0) -> None:
        if self.tasks.ahead_rank(job) is not None:
            return  # it is queued again when it comes back (protocol.md §2.10)
        count = count if count is not None else job.total_tasks if job.is_array else 1
        self.scheduler.enqueue(self.sched_job(job, request, count, first), now=self.clock())
        self.wake_scheduler()

    def sched_job(self, job: Job, request: sched.Request, count: int = 1, first: int = 0) -> sched.SchedJob:
        spec = job.spec
        assert spec is not None
        sharing = self.sharing.bucket_fields(job.uid, spec) if self.sharing is not None else {}
        return sched.SchedJob(job_id=job.id, urgency=job.urgency, submit_time=job.t_submit, request=request,
                              time_limit=self.time_limit(spec), policy=spec.policy, count=count,
                              first_element=first, **sharing)

    def request(self, job: Job) -> sched.Request:
        assert job.spec is not None
        return request_of(job.spec)

    def time_limit(self, spec: Jobspec) -> float:
        return spec.time_limit or self.config.default_time_limit

    # --- events --------------------------------------------------------------------------------------------

    def post(self, job: Job, name: str, context: dict[str, Any] | None = None,
             extra: Iterable[Statement] = (), durable: bool = False) -> asyncio.Future[None] | None:
        """Append an event: the job takes it now, followers hear of it once it is durable.

        The job row is not touched: an active job's state is its event log replayed (broker/recovery.py),
        which keeps runs of event inserts together for executemany.
        """
        return self.post_many(job, [(name, context or {})], extra, durable)

    def post_many(self, job: Job, events: list[tuple[str, dict[str, Any]]], extra: Iterable[Statement] = (),
                  durable: bool = False) -> asyncio.Future[None] | None:
        """Append events in one write: durable (and heard of) together, or not at all. Each is applied to the job
        now (broker/job.py), and its effects are carried out once the write is queued."""
        statements = list(extra)
        published = []
        effects: list[Effect] = []
        job_id, watchers = job.id, self.watchers
        for name, context in events:
            seq, ts = job.seq, self.clock()
            effects.extend(job.apply(Event(name, context, seq, ts)))
            statements.append(store.event(job_id, seq, ts, name, store.pack(context)))
            published.append([seq, ts, name, context])

        def publish() -> None:
            for event in published:
                watchers.event(job_id, event)

        fut = None
        if not durable:
            self.journal.append(statements, publish)
        else:
            fut = self.journal.write(statements)
            when_durable(fut, publish)
        actions = self._actions
        for effect in effects:  # what the applied events ask (broker/job.py), given the future of their write
            actions[effect](job, fut)
        return fut

    def _close_when_durable(self, job: Job, durable: asyncio.Future[None] | None) -> None:
        assert durable is not None, "a clean is posted durable"
        result = {"job": job.id, "status": job.status, "state": job.state.value, "exception": job.exception}
        when_durable(durable, lambda: self._closed(job, result))

    def raise_exception(self, job: Job, kind: str, note: str, severity: int = 0, status: int | None = None) -> None:
        """Post an exception; severity 0 ends the job, with `status` (default: by kind, EXCEPTION_STATUS)."""
        if job.state == State.INACTIVE or (job.ending and severity == 0):
            return
        if severity == 0 and job.flow is not None and self.workflow.attempts.absorbs(job, kind, note):
            return
        context: dict[str, Any] = {"type": kind, "severity": severity, "note": note}
        if severity == 0:
            context["status"] = EXCEPTION_STATUS.get(kind, 1) if status is None else status
        self.post(job, "exception", context)

    def maybe_finish(self, job: Job) -> None:
        if job.running == 0 and (job.ending or job.tasks_left == 0) and job.state in (State.RUN, State.SCHED):
            if job.flow is not None and self.workflow.attempts.before_finish(job):
                return
            self.finish(job)

    def finish(self, job: Job) -> None:
        """Post `finish`; its effects post `release` and `clean` (broker/job.py)."""
        if self.tasks.ahead_rank(job) is not None:
            return  # finished once it came back, or once its task that started after all ended
        outcome = job.outcome()
        job.t_inactive = self.clock()
        job.status = outcome["status"]  # the accounting row, written with the event, records it
        accounting = self.sharing.finished(job) if self.sharing is not None else []
        self.post(job, "finish", outcome, extra=accounting)

    def post_started(self, job: Job, ranks: str, durable: bool = False) -> asyncio.Future[None] | None:
        """A queued job's `alloc` and `start`, in one write: the one place they are posted, so its start time is
        the `start` event's (Job.apply) whoever started it. A plain job's `run` leaves once they are durable
        (`durable`); an array's first element, or a job sent ahead (protocol.md §2.10), started already on the
        rank `ranks` names. Nothing for a job no longer queued (a later element, a second report)."""
        if job.state != State.SCHED:
            return None
        return self.post_many(job, [("alloc", {"ranks": ranks}), ("start", {})], durable=durable)

    def clean(self, job: Job) -> None:
        """The last step, also taken alone for a job a restart found in CLEANUP."""
        job.t_inactive = job.t_inactive or self.clock()
        row = store.job_closed(job.id, job.seq + 1, job.status, job.exception, job.t_run, job.t_inactive,
                               store.pack(job.counts_wire()))
        self.post(job, "clean", extra=[row], durable=True)

    def _closed(self, job: Job, result: dict[str, Any]) -> None:
        job.closed = True
        if self.jobs.get(job.id) is job:
            del self.jobs[job.id]
            self.history.add(job)
        self.watchers.inactive(job.id, result)

    # --- client operations ---------------------------------------------------------------------------------

    def get(self, job_id: Any) -> Job:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise JobError("bad-request", f"job id must be an integer, got {job_id!r}")
        job = self.find(job_id)
        if job is None or job_id in self.unacknowledged:
            raise JobError("not-found", f"job {job_id} does not exist (or was purged)")
        return job

    def find(self, job_id: int) -> Job | None:
        """An active job, or a finished one (from the cache, else read from the journal)."""
        return self.jobs.get(job_id) or self.history.get(job_id)

    def cancel(self, uid: int, job_ids: list[Any]) -> tuple[list[int], dict[str, str]]:
        cancelled, errors = [], {}
        for job_id in job_ids:
            try:
                job = self.get(job_id)
            except JobError as exc:
                errors[str(job_id)] = str(exc)
                continue
            if uid not in (job.uid, self.owner_uid):
                errors[str(job_id)] = f"permission denied: job {job_id} belongs to uid {job.uid}"
            elif job.state in (State.CLEANUP, State.INACTIVE) or job.ending:
                errors[str(job_id)] = f"job {job_id} has already ended"
            else:
                self.raise_exception(job, "cancel", f"cancelled by uid {uid}")
                cancelled.append(job.id)
        return cancelled, errors

    def summary(self, job: Job, alloc: bool = False) -> dict[str, Any]:
        out = job.summary(self._estimated_start(job.id))
        if alloc:  # which racks (topology vertices) the job landed in, protocol.md §3.6
            graph = self.scheduler.graph
            ranks = set(job.ranks) or (set(IdSet.parse(job.ranks_text)) if job.ranks_text else set())
            if not job.is_array:
                ranks.update(graph.held_ranks((job.id, 0)))
            out["alloc"] = graph.placement(ranks)
        self.workflow.summary(job, out)
        if self.sharing is not None:
            out.update(self.sharing.describe(job))
        rank = self.tasks.ahead_rank(job) if job.state == State.SCHED else None
        if rank is not None:  # out of the queue, waiting on the worker behind a busy core (protocol.md §2.10)
            out["pending_reason"] = f"Dispatched: ahead on rank {rank}"
        return out

    def _estimated_start(self, job_id: int) -> float | None:
        """The blocked head job's reserved start, when a time limit the user gave sets it.

        A job submitted without -t is planned to run the whole default_time_limit; an estimate resting on that
        says nothing about when it will really end, so none is shown.
        """
        res = self.scheduler.reservation_of(job_id)
        if res is None:
            return None
        holder = self.jobs.get(res.after[0]) if isinstance(res.after, tuple) else None
        if holder is None or holder.spec is None or holder.spec.time_limit is None:
            return None
        return res.start

    def queue_counts(self) -> dict[str, int]:
        """Jobs per state: the active ones counted, the finished ones as the history keeps count of them."""
        counts = {s.value: 0 for s in State}
        for job in self.jobs.values():
            counts[job.state.value] += 1
        counts[State.INACTIVE.value] += self.history.count
        return counts

    # --- purge ---------------------------------------------------------------------------------------------

    async def purge(self) -> int:
        """Forget finished jobs beyond the configured count and age limits, oldest first (at most PURGE_BATCH
        a pass)."""
        rows = await self.store.purgeable(self.clock() - self.config.purge_max_age, self.config.purge_max_count,
                                          PURGE_BATCH)
        # A job whose `clean` commit the read saw but whose close has not run yet goes in a later pass.
        doomed = [(job_id, status) for job_id, status in rows if job_id not in self.jobs]
        if doomed:
            # Awaited: the next pass must not read (and count off) these rows again.
            await self.journal.write(store.jobs_purged(job_id for job_id, _ in doomed))
            self.history.forget(doomed)
        return len(doomed)
