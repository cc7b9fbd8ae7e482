"""Workflows in the broker (protocol.md §3.9): dependencies and the DEPEND state, holds, updates, requeues.

The JobManager hands every submission to `admit`, every `start` and `clean` event to `observe`, and asks
`absorbs`/`before_finish` before ending a job. Decisions come from the pure dependency graph
(broker/flow/depgraph.py) and policy (broker/flow/retry.py); this module turns them into events and queue changes.
Verdicts are applied from a queue, not recursively, so a chain of 1,000 jobs failing one after the other does
not nest 1,000 calls deep.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import signal
from collections import deque
from typing import Any

from broker.durable import store
from broker.flow.attempts import Attempts
from broker.flow.depgraph import BEGIN, SINGLETON, DependencyError, DepGraph, TargetState, Verdict
from broker.flow.state import Corr, Flow
from broker.history import stored_spec
from broker.job import Job, State
from broker.flow.retry import IGNORE, SUCCESS, Policy
from broker.supervise import Supervisor
from broker.taskmap import TaskMap
from broker.flow.jobtable import JobTable
from minicluster.model import jobspec as jobspec_model
from minicluster.model.idset import IdSet
from minicluster.model.jobspec import Jobspec

log = logging.getLogger(__name__)

PENDING_STATES = (State.DEPEND, State.PRIORITY, State.SCHED)
UPDATABLE = ("urgency", "time_limit", "name")


# The reason of the requeue of preempted work (protocol.md §3.10).
PREEMPTED = "preempted"

class WorkflowRefusal(Exception):
    """A request refused; `code` is a protocol.md §3.2 error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Workflow:
    def __init__(self, manager: JobTable, background: Supervisor) -> None:
        self.manager = manager
        # Where background work runs, supervised (broker/supervise.py).
        self.background = background
        self.graph = DepGraph()
        self.attempts = Attempts(manager, element_final=self._element_final,
                                 queue_blocked=lambda job: job.flow is not None and job.flow.held, tick=self._tick)
        self._verdicts: deque[Verdict] = deque()
        self._applying = False
        # True from a restart until the reattach window closed: verdicts wait (broker/flow/recovery.py).
        self.recovering = False
        # Indexes of aftercorr dependants that can never run, per job, noted in one event per batch.
        self._never: dict[int, list[int]] = {}
        # Jobs whose submission is not durable yet: nothing releases them to the queue before it is.
        self.admitting: set[int] = set()

    # --- submission ----------------------------------------------------------------------------------------

    def check(self, uid: int, spec: Jobspec) -> None:
        """Refuse dependencies on unknown jobs, on other users' jobs, and malformed aftercorr (before the job
        gets an id)."""
        targets = [t for dep in spec.dependencies for t in dep.jobs]
        if not targets:
            return
        try:
            self.graph.check(self.manager.next_id, targets, self.lookup)
        except DependencyError as exc:
            raise WorkflowRefusal("invalid-jobspec", f"dependencies: {exc}") from None
        for target in targets:
            owner = self._target(target).uid
            if uid not in (owner, self.manager.owner_uid):
                raise WorkflowRefusal("permission", f"dependencies: job {target} belongs to uid {owner}; "
                                                    "depend only on your own jobs")
        corr = [t for dep in spec.dependencies if dep.type == "aftercorr" for t in dep.jobs]
        if len(corr) > 1:
            raise WorkflowRefusal("invalid-jobspec", "dependencies: aftercorr takes one array job")
        if corr:
            corr_target = self._target(corr[0])
            mine = spec.array_ids
            assert mine is not None
            if corr_target.array is None:
                raise WorkflowRefusal("invalid-jobspec", f"dependencies: aftercorr:{corr_target.id} is not an array")
            missing = [i for i in mine if i not in corr_target.array]
            if missing:
                raise WorkflowRefusal("invalid-jobspec", f"dependencies: indexes {IdSet.from_ints(missing[:1000])} "
                                                         f"have no counterpart in job {corr_target.id} "
                                                         f"({corr_target.array})")

    def admit(self, job: Job) -> bool:
        """Register a new job; True when it is a workflow job whose queueing this module took over."""
        spec = job.spec
        assert spec is not None
        key = (job.uid, job.name)
        if not spec.workflow:
            self.graph.track(job.id, key)
            return False
        job.flow = flow = Flow(spec)
        self.admitting.add(job.id)
        deps = [(dep.type, t) for dep in spec.dependencies for t in dep.jobs]
        singleton = any(dep.type == SINGLETON for dep in spec.dependencies)
        added, decided = self.graph.add(job.id, deps, self.lookup, key=key, singleton=singleton,
                                        begin_time=spec.begin_time, now=self.manager.clock())
        for description in added:
            self.manager.post(job, "dependency-add", {"description": description})
        if spec.begin_time is not None:
            self.arm_timer()
        corr = next((t for kind, t in deps if kind == "aftercorr"), None)
        if corr is not None:
            flow.corr = Corr(corr)
            self._attach_corr(job, self._target(corr))
        if spec.hold:
            flow.held = True
            self.manager.post(job, "hold", {"uid": job.uid})
        self.feed(decided)
        self.try_release(job)
        return True

    def lookup(self, job_id: int) -> TargetState | None:
        job = self.manager.find(job_id)
        return None if job is None else target_state(job)

    def _target(self, job_id: int) -> Job:
        """A dependency's target, which the dependency graph found (active, or finished in the journal)."""
        job = self.manager.find(job_id)
        assert job is not None, f"job {job_id} was checked to exist"
        return job

    # --- verdicts ------------------------------------------------------------------------------------------

    def observe(self, job: Job, name: str) -> None:
        """A job's event was posted: a start satisfies afterstart, an end decides everything on the job."""
        if name == "start":
            if self.graph.has_dependants(job.id):
                self.feed(self.graph.started(job.id))
        elif name == "clean":
            verdicts = self.graph.gone(job.id)
            if self.graph.has_dependants(job.id):
                verdicts = self.graph.ended(job.id, target_state(job)) + verdicts
            if verdicts:
                self.feed(verdicts)

    def feed(self, verdicts: list[Verdict]) -> None:
        self._verdicts.extend(verdicts)
        if self._applying or self.recovering:
            return
        self._applying = True
        try:
            while self._verdicts:
                self._apply(self._verdicts.popleft())
        finally:
            self._applying = False

    def _apply(self, verdict: Verdict) -> None:
        job = self.manager.jobs.get(verdict.job)
        if job is None or job.state == State.INACTIVE or job.ending:
            return
        if not verdict.satisfied:
            self.manager.raise_exception(job, "dependency", verdict.reason)
            return
        if verdict.description.startswith("aftercorr:"):
            corr = job.flow.corr
            if corr is not None and corr.loading:
                corr.deferred = verdict
                return
            self._corr_target_ended(job)
        self.manager.post(job, "dependency-remove", {"description": verdict.description})
        if self.graph.remove(verdict):
            self.try_release(job)

    def try_release(self, job: Job) -> None:
        """DEPEND -> queued, once nothing blocks the job and no hold is in place."""
        flow = job.flow
        if (job.state != State.DEPEND or job.ending or flow.held or self.graph.blocked(job.id)
                or job.id in self.admitting):
            return
        self.manager.post(job, "depend")
        self.manager.post(job, "priority", {"priority": job.urgency})
        self.queue_first(job)

    def queue_first(self, job: Job) -> None:
        corr = job.flow.corr
        if corr is None:
            self.manager.enqueue(job, self.manager.request(job))
            return
        job.pending_map = TaskMap()
        ready, corr.ready = corr.ready, []
        self.attempts.queue_tasks(job, ready)
        self.manager.maybe_finish(job)

    # --- aftercorr -----------------------------------------------------------------------------------------

    def _attach_corr(self, job: Job, target: Job) -> None:
        """Route the target's index results to `job`; results it already has are read from the journal."""
        if target.state != State.INACTIVE:
            if target.flow is None:
                target.flow = Flow(target.spec)
            target.flow.corr_watch = target.flow.judge_all = True
        if target.state != State.INACTIVE and target.tasks_left == target.total_tasks:
            return
        job.flow.corr.loading = True
        self.background.spawn(self._load_corr(job, target.id), f"loading job {target.id}'s results for job {job.id}")

    async def _load_corr(self, job: Job, target_id: int) -> None:
        # Everything the broker counted before now is committed once this empty write is.
        await self.manager.journal.write([])
        rows = await self.manager.store.index_results_now(target_id)
        corr = job.flow.corr if job.flow is not None else None
        if corr is None:
            return
        corr.loading = False
        for idx, ok in index_outcomes(rows):
            self._corr_index(job, idx, ok)
        self._flush_never()
        deferred, corr.deferred = corr.deferred, None
        target = self.manager.find(target_id)
        if deferred is not None:
            self.feed([deferred])
        elif target is not None and target.state == State.INACTIVE:
            self.feed(self.graph.ended(target_id, target_state(target)))

    def _element_final(self, target: Job, task: int, ok: bool) -> None:
        index = target.index_of(task)
        for job_id in self.graph.corr_dependants(target.id):
            job = self.manager.jobs.get(job_id)
            if job is not None and job.flow is not None and job.flow.corr is not None:
                self._corr_index(job, index, ok)
        self._flush_never()

    def _corr_index(self, job: Job, index: int, ok: bool) -> None:
        corr = job.flow.corr
        assert job.array is not None
        if index not in job.array or job.ending or job.state == State.INACTIVE:
            return
        task = job.array.ordinal(index)
        if task in corr.released or task in corr.cancelled or job.is_done(task):
            return
        if ok:
            corr.released.add(task)
            if job.state in (State.DEPEND, State.PRIORITY):
                corr.ready.append(task)
            else:
                self.attempts.queue_tasks(job, [task])
        else:
            corr.cancelled.add(task)
            self._never.setdefault(job.id, []).append(task)

    def _corr_target_ended(self, job: Job) -> None:
        """The target ended: indexes not released by now can never run."""
        corr = job.flow.corr
        assert job.array is not None
        never = [t for t in range(job.total_tasks)
                 if t not in corr.released and t not in corr.cancelled and not job.is_done(t)]
        corr.cancelled.update(never)
        if never:
            self._never.setdefault(job.id, []).extend(never)
        self._flush_never()

    def _flush_never(self) -> None:
        """End the aftercorr indexes that can never run: counted cancelled, one event per job."""
        never, self._never = self._never, {}
        for job_id, tasks in never.items():
            job = self.manager.jobs[job_id]
            job.cancel_never_run(tasks)
            target = job.flow.corr.target
            indexes = IdSet.from_ints(job.index_of(t) for t in tasks)
            self.manager.post(job, "exception", {
                "type": "dependency", "severity": 1,
                "note": f"indexes {indexes} can never run: their counterparts in job {target} did not succeed"})
            if job.state in (State.SCHED, State.RUN):
                self.manager.maybe_finish(job)

    # --- begin times ---------------------------------------------------------------------------------------

    def arm_timer(self) -> None:
        self.attempts.arm(self.graph.next_due())

    def _tick(self, now: float) -> None:
        self.feed(self.graph.due(now))
        self.arm_timer()

    # --- holds ---------------------------------------------------------------------------------------------

    def hold(self, job: Job, uid: int) -> None:
        self._may_touch(job, uid)
        flow = self.flow_of(job)
        if flow.held:
            raise WorkflowRefusal("bad-state", f"job {job.id} is already held")
        if job.state == State.RUN and (not job.is_array or job.pending() == 0):
            raise WorkflowRefusal("bad-state", f"job {job.id} has nothing left to start; "
                                               "`mc requeue` puts a running job back in the queue")
        if job.state not in (*PENDING_STATES, State.RUN):
            raise WorkflowRefusal("bad-state", f"job {job.id} has already ended")
        flow.held = True
        remaining = self.manager.scheduler.cancel(job.id)
        self.manager.tasks.recall_ahead(job)  # what comes back is queued behind the hold
        if job.is_array and job.state != State.DEPEND:
            # Unstarted elements are the last `remaining`; those queued while held come after them.
            flow.held_from = self._elements(job) - remaining
        self.manager.post(job, "hold", {"uid": uid})

    def release(self, job: Job, uid: int) -> None:
        self._may_touch(job, uid)
        flow = job.flow
        if flow is None or not flow.held:
            raise WorkflowRefusal("bad-state", f"job {job.id} is not held")
        flow.held = False
        self.manager.post(job, "release", {"uid": uid})
        if job.state == State.DEPEND:
            self.try_release(job)
        elif not job.is_array:
            if not flow.delayed:
                self.attempts.queue_plain(job)
        else:
            start = flow.held_from if flow.held_from is not None else self._elements(job)
            flow.held_from = None
            count = self._elements(job) - start
            if count > 0:
                self.manager.enqueue(job, self.manager.request(job), count=count, first=start)

    @staticmethod
    def _elements(job: Job) -> int:
        """How many element numbers an array has used so far (see Attempts.queue_tasks)."""
        return len(job.pending_map) if job.pending_map is not None else job.total_tasks

    # --- updates -------------------------------------------------------------------------------------------

    def update(self, job: Job, uid: int, changes: dict[str, Any]) -> dict[str, Any]:
        """Change urgency, time limit or name, all or nothing (protocol.md §3.9.4)."""
        self._may_touch(job, uid)
        new = self._updated_spec(job, changes)
        self._may_update_now(job, uid, changes, new)
        job.spec = new
        job.urgency = new.urgency
        job.name = new.name
        row = store.spec_updated(job.id, _packed(new))
        self.manager.post(job, "update", {"uid": uid, **changes}, extra=[row])
        if "urgency" in changes or "time_limit" in changes:
            self._requeue_entry(job)
        if "time_limit" in changes:
            self.manager.tasks.retime(job)
        if "name" in changes:
            self.feed(self.graph.rename(job.id, (job.uid, job.name)))
        return changes

    @staticmethod
    def _updated_spec(job: Job, changes: dict[str, Any]) -> Jobspec:
        """The active job's jobspec with the changes, which must be updatable fields with valid values."""
        spec = job.spec
        if job.state == State.INACTIVE or job.ending or spec is None:
            raise WorkflowRefusal("bad-state", f"job {job.id} has already ended")
        unknown = sorted(set(changes) - set(UPDATABLE))
        if unknown or not changes:
            raise WorkflowRefusal("bad-request", f"update: {', '.join(unknown) or 'nothing'} cannot be updated; "
                                                 f"fields: {', '.join(UPDATABLE)}")
        if changes.get("name") == "":  # at submit an empty name means the command's; here it would erase it
            raise WorkflowRefusal("invalid-jobspec", "name: a job's name cannot be empty")
        try:
            return jobspec_model.from_wire({**spec.to_wire(), **changes})
        except jobspec_model.InvalidJobspec as exc:
            raise WorkflowRefusal("invalid-jobspec", str(exc)) from None

    def _may_update_now(self, job: Job, uid: int, changes: dict[str, Any], new: Jobspec) -> None:
        """Refuse what the job's progress rules out: urgency once nothing is left to start, and a higher time
        limit of a running job but by the instance owner."""
        queued = job.state in PENDING_STATES or (job.is_array and job.pending() > 0)
        if "urgency" in changes and not queued:
            raise WorkflowRefusal("bad-state", f"job {job.id} is running: urgency orders only work not yet started")
        assert job.spec is not None, "an active job has its jobspec (_updated_spec checked)"
        if ("time_limit" in changes and job.running and uid != self.manager.owner_uid
                and self.manager.time_limit(new) > self.manager.time_limit(job.spec)):
            raise WorkflowRefusal("permission", f"only the instance owner may raise the time limit of running "
                                                f"job {job.id}")

    def _requeue_entry(self, job: Job) -> None:
        """Queue the job's unstarted elements again, so a new urgency or time limit applies to them."""
        self.manager.tasks.recall_ahead(job)  # those sent ahead come back to the queue (protocol.md §2.10)
        remaining = self.manager.scheduler.cancel(job.id)
        if remaining:
            first = self._elements(job) - remaining if job.is_array else 0
            self.manager.enqueue(job, self.manager.request(job), count=remaining if job.is_array else None,
                                 first=first)

    # --- requeue -------------------------------------------------------------------------------------------

    def requeue(self, job: Job, uid: int) -> asyncio.Future[None]:
        """Kill a running job's tasks and queue them again; resolves once the requeue event is durable."""
        self._may_touch(job, uid)
        if job.state != State.RUN or job.ending or not job.running:
            raise WorkflowRefusal("bad-state", f"job {job.id} is not running")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.flow_of(job).waiters.append(waiter)
        self.interrupt(job, f"requested by uid {uid}")
        return waiter

    def interrupt(self, job: Job, reason: str) -> None:
        """End the running tasks of a job that is not ending; it (a plain job) or they (array elements) go back to
        the queue with `reason`, not as a retry. Tasks already being requeued are left alone."""
        flow = self.flow_of(job)
        if job.is_array:
            fresh = [t for t in self.manager.tasks.running_tasks(job) if t not in flow.requeue_tasks]
            if not fresh:
                return
            flow.judge_all = True
            for task in fresh:
                flow.requeue_tasks[task] = reason
        elif flow.requeue is not None:
            return
        else:
            flow.requeue = reason
        self.manager.tasks.kill_job(job, signal.SIGTERM)

    def requeue_preempted(self, job: Job, task: int | None) -> None:
        """The scheduler preempted the job, or one of its array elements (`task`), from a queue whose
        preempt_mode is requeue (broker/share/preemption.py): its tasks are ended by the caller and the job or
        element is queued again with the reason `preempted`; like any requeue, not a retry (protocol.md §3.10)."""
        flow = self.flow_of(job)
        if task is None:
            flow.requeue = flow.requeue or PREEMPTED
        else:
            flow.judge_all = True
            flow.requeue_tasks.setdefault(task, PREEMPTED)

    # --- shared --------------------------------------------------------------------------------------------

    def _may_touch(self, job: Job, uid: int) -> None:
        if uid not in (job.uid, self.manager.owner_uid):
            raise WorkflowRefusal("permission", f"permission denied: job {job.id} belongs to uid {job.uid}")
        if job.id in self.attempts.recovering_ids:
            raise WorkflowRefusal("bad-state", f"job {job.id} is being reattached after a broker restart; "
                                               "try again in a few seconds")

    @staticmethod
    def flow_of(job: Job) -> Flow:
        if job.flow is None:
            job.flow = Flow(job.spec)
        return job.flow

    def summary(self, job: Job, out: dict[str, Any]) -> None:
        """Add `waiting`, `held` and `retries` to a job summary (protocol.md §3.6)."""
        flow = job.flow
        if flow is None or job.state == State.INACTIVE:
            out.update(waiting=[], held=False, retries=job.retries)
            return
        waiting = [_describe(d, job, flow) for d in self.graph.waiting(job.id)]
        if flow.delayed:
            due = min((t[0] for t in self.attempts.due_times() if t[1] == job.id), default=None)
            if due is not None:
                waiting.append(f"retry in {max(0.0, due - self.manager.clock()):.0f}s")
        out.update(waiting=waiting, held=flow.held, retries=job.retries)


def target_state(job: Job) -> TargetState:
    ended = job.state == State.INACTIVE
    ok = ended and job.status == 0 and job.exception is None
    if not ended:
        how = ""
    elif job.exception == "cancel":
        how = "was cancelled"
    elif job.exception:
        how = f"ended with the exception {job.exception}"
    elif ok:
        how = "succeeded"
    else:
        how = f"failed (status {job.status})"
    return TargetState(started=job.t_run is not None, ended=ended, ok=ok, how=how)


def _describe(description: str, job: Job, flow: Flow) -> str:
    if description.startswith(BEGIN):
        when = float(description.partition("=")[2])
        return f"begin-time {datetime.datetime.fromtimestamp(when).isoformat(timespec='seconds')}"
    if description.startswith("aftercorr:") and flow.corr is not None:
        return f"{description} ({len(flow.corr.released)} of {job.total_tasks} indexes released)"
    return description


def index_outcomes(rows: list[tuple[Any, ...]]) -> list[tuple[int, bool]]:
    """(index, succeeded) of an array's final results `(idx, status, exit_code, signal, spec blob)`: success is
    exit 0 or a failure the array's own rules ignore."""
    if not rows:
        return []
    spec = stored_spec(rows[0][4])
    policy = Policy.of(spec) if spec.failure_policy else None
    if policy is None:
        return [(idx, status == 0) for idx, status, *_ in rows]
    return [(idx, policy.action(status, code, sig) in (SUCCESS, IGNORE)) for idx, status, code, sig, _ in rows]


def _packed(spec: Jobspec) -> bytes:
    return store.pack(spec.to_wire())
