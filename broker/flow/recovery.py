"""Workflows across a broker restart (architecture.md#restart, protocol.md §3.9).

`recover` runs right after broker/recovery.py loaded the journal: it rebuilds the dependency graph and each
job's workflow state (attempt numbers, retries, holds, delays, aftercorr progress) from the jobspecs, the
`attempts` table and the workflow events, without posting anything. `settled` runs once the reattach window
closed: it applies what the rebuilt state decides (dependencies whose targets ended meanwhile, holds, retries
still waiting out their delay) and posts the events.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from broker.flow.depgraph import BEGIN, SINGLETON, Verdict
from broker.flow.state import Corr, Flow
from broker.job import Job, State
from broker.durable.journal import Journal
from broker.durable.store import JobStore, unpack
from broker.taskmap import TaskMap
from broker.flow.workflow import Workflow, index_outcomes, target_state

log = logging.getLogger(__name__)

_FLOW_EVENTS = ("dependency-remove", "hold", "release", "retry", "requeue", "success")


class Recovered:
    """What `settled` still has to do."""

    def __init__(self) -> None:
        self.verdicts: list[Verdict] = []
        self.delayed: dict[int, list[tuple[int, float]]] = {}     # job -> [(task or -1, due)]
        self.jobs: list[Job] = []


def recover(workflow: Workflow, journal: Journal, active: list[Job]) -> Recovered:
    out = Recovered()
    store = JobStore(journal)
    if not active:
        return out
    workflow.recovering = True
    workflow.attempts.recovering_ids = {job.id for job in active if job.state not in (State.DEPEND,
                                                                                      State.PRIORITY)}
    by_id = {job.id: job for job in active}
    events = _workflow_events(store, list(by_id))
    attempts = _attempt_rows(store, list(by_id))
    now = workflow.manager.clock()
    for job in sorted(active, key=lambda j: j.id):
        seen = events.get(job.id, {})
        rows = attempts.get(job.id, [])
        spec = job.spec
        assert spec is not None
        if spec.workflow or seen or rows:
            job.flow = Flow(spec)
            _restore_counts(job, seen, rows, now, out)
            out.jobs.append(job)
        deps, singleton, begin = _dependencies_left(workflow, job, seen.get("removed", set()), out)
        _, decided = workflow.graph.add(job.id, deps, workflow.lookup, key=(job.uid, job.name),
                                        singleton=singleton, begin_time=begin, now=now)
        out.verdicts.extend(decided)
        corr = next((t for kind, t in deps if kind == "aftercorr"), None)
        if corr is not None:
            _restore_corr(workflow, store, job, corr, out)
    _restore_results(store, [j for j in out.jobs if j.flow.policy or j.flow.success or not j.is_array])
    return out


def _dependencies_left(workflow: Workflow, job: Job, removed: set[str],
                       out: Recovered) -> tuple[list[tuple[str, int]], bool, float | None]:
    """A recovered job's dependencies still in force: (type, target) pairs, singleton, begin time.

    Those its `dependency-remove` events removed are gone; a job past DEPEND/PRIORITY keeps only its aftercorr
    targets (which indexes it may run); one on a purged job can never be satisfied (its verdict goes to out).
    """
    spec = job.spec
    assert spec is not None
    deps = [(dep.type, t) for dep in spec.dependencies for t in dep.jobs if f"{dep.type}:{t}" not in removed]
    singleton = any(d.type == SINGLETON for d in spec.dependencies) and SINGLETON not in removed
    begin = spec.begin_time
    if begin is not None and f"{BEGIN}={begin!r}" in removed:
        begin = None
    if job.state not in (State.DEPEND, State.PRIORITY):
        deps = [d for d in deps if d[0] == "aftercorr"]
        singleton, begin = False, None
    deps = [d for d in deps if workflow.manager.find(d[1]) is not None or _lost(out, job, d)]
    return deps, singleton, begin


def _lost(out: Recovered, job: Job, dep: tuple[str, int]) -> bool:
    out.verdicts.append(Verdict(job.id, f"{dep[0]}:{dep[1]}", False,
                                f"{dep[0]}:{dep[1]} can never be satisfied: job {dep[1]} was purged"))
    return False


def _workflow_events(store: JobStore, ids: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = defaultdict(lambda: {"removed": set(), "retry": 0, "requeue": 0})
    for job_id, _, _, name, blob in store.events_of(ids, _FLOW_EVENTS):
        seen = out[job_id]
        context = unpack(blob)
        if name == "dependency-remove":
            seen["removed"].add(context.get("description"))
        elif name == "hold":
            seen["held"] = True
        elif name == "release" and "uid" in context:
            seen["held"] = False
        elif name in ("retry", "requeue") and "attempt" in context:
            seen[name] += 1
        elif name == "success":
            seen["success"] = True
    return dict(out)


def _attempt_rows(store: JobStore, ids: list[int]) -> dict[int, list[tuple[Any, ...]]]:
    out: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in store.attempts_of(ids):
        out[row[0]].append(row[1:])
    return out


def _restore_counts(job: Job, seen: dict[str, Any], rows: list[tuple[Any, ...]], now: float,
                    out: Recovered) -> None:
    flow = job.flow
    flow.held = bool(seen.get("held"))
    if seen.get("success"):
        # The replayed `success` ended the job (broker/job.py); the results restored after it counted raw statuses.
        flow.succeeded_early = True
        job.status = 0
    if not job.is_array:
        flow.attempt = seen.get("retry", 0) + seen.get("requeue", 0)
        job.count_retry(seen.get("retry", 0))  # a recovered active job has counted none yet
        last = max((r for r in rows if r[1] == flow.attempt - 1), key=lambda r: r[3] or 0, default=None)
        if last is not None and last[3] and last[3] > now and job.state == State.SCHED:
            out.delayed.setdefault(job.id, []).append((-1, last[3]))
        return
    for task, attempt, outcome, _ in rows:
        flow.attempts[task] = max(flow.attempts.get(task, 0), attempt + 1)
        if outcome == "retry":
            flow.retried[task] = flow.retried.get(task, 0) + 1
            job.count_retry()
    latest = {task: (attempt, nb) for task, attempt, _, nb in rows}
    for task, (_, not_before) in latest.items():
        if not_before and not_before > now and not job.is_done(task):
            out.delayed.setdefault(job.id, []).append((task, not_before))


def _restore_results(store: JobStore, jobs: list[Job]) -> None:
    """Judge the recorded final results again: ignored failures count as success, failed-for-good indexes and
    the success policy's progress are counted, a plain job's task actions are known."""
    if not jobs:
        return
    by_id = {job.id: job for job in jobs}
    statuses: dict[int, int] = {}
    for job_id, task, idx, _, status, code, sig, *_ in store.results_of(list(by_id)):
        counted = _judge_again(by_id[job_id], task, idx, status, code, sig)
        statuses[job_id] = max(statuses.get(job_id, 0), counted)
    for job_id, status in statuses.items():
        job = by_id[job_id]
        if not job.flow.succeeded_early:
            job.status = status
        job.flow.end_past_max_failed()


def _judge_again(job: Job, task: int, idx: int, status: int, code: int | None, sig: int | None) -> int:
    """One recorded final result judged again, as Attempts judged it: the status it counts (0: success or ignored)."""
    flow = job.flow
    action = flow.policy.action(status, code, sig) if flow.policy else ("success" if status == 0 else "fail")
    counted = 0 if action in ("success", "ignore") else (status or 1)
    if status and not counted:
        job.count_as_success()
    if not job.is_array:
        flow.actions.append(action)
        assert job.spec is not None, "a recovered plain job with results is active"
        if task == job.spec.success_task:
            flow.decider = (action, status)
            flow.cut = True
    elif counted:
        flow.failed_for_good += 1
    elif flow.success is not None and flow.success.succeeded(idx):
        flow.end = flow.end or ("success", "success policy met", 0)
    return counted


def _restore_corr(workflow: Workflow, store: JobStore, job: Job, target_id: int, out: Recovered) -> None:
    """Which indexes of `job` its aftercorr target already released, or can never release."""
    flow = job.flow
    corr = flow.corr = Corr(target_id)
    target = workflow.manager.find(target_id)
    assert target is not None, "a purged target's dependency was lost above"
    if target.state != State.INACTIVE:
        if target.flow is None:
            target.flow = Flow(target.spec)
        target.flow.corr_watch = target.flow.judge_all = True
    rows = store.index_results(target_id)
    assert job.array is not None
    for idx, ok in index_outcomes(rows):
        if idx not in job.array:
            continue
        task = job.array.ordinal(idx)
        if ok:
            corr.released.add(task)
        elif not job.is_done(task):
            # Counted as it was before the restart; its event is in the log already.
            corr.cancelled.add(task)
            job.cancel_never_run([task])
    if job.state in (State.DEPEND, State.PRIORITY):
        corr.ready = sorted(t for t in corr.released if not job.is_done(t))
    if target.state == State.INACTIVE:
        out.verdicts.extend(workflow.graph.ended(target_id, target_state(target)))


def settled(workflow: Workflow, out: Recovered) -> None:
    """The reattach window closed (broker/recovery.py settled every job): apply the rebuilt workflow state."""
    manager = workflow.manager
    attempts = workflow.attempts
    workflow.recovering = False
    attempts.recovering_ids = set()
    window, attempts.window_delays = attempts.window_delays, {}
    for job_id, entries in window.items():
        out.delayed.setdefault(job_id, []).extend(entries)
    for job in [j for j in manager.jobs.values() if j.flow is not None]:
        if job.state == State.INACTIVE or job.ending or job.state not in (State.SCHED, State.RUN):
            continue
        delayed = dict(out.delayed.get(job.id, []))
        if job.is_array:
            _requeue_elements(workflow, job, delayed)
        else:
            _requeue_plain(workflow, job, delayed)
    workflow.feed(out.verdicts)
    _queue_cut_short(workflow)
    for job in out.jobs:
        if job.flow is not None and job.flow.end is not None:
            attempts.after_results(job)
            manager.maybe_finish(job)
    workflow.arm_timer()
    log.info("workflows recovered: %d jobs with workflow state, %d dependency verdicts", len(out.jobs),
             len(out.verdicts))


def _requeue_plain(workflow: Workflow, job: Job, delayed: dict[int, float]) -> None:
    """Queue a plain job once, whatever happened in the window (a retry decided while settling is not queued yet):
    at once, or when its retry's delay is over."""
    if job.state != State.SCHED:
        return
    manager = workflow.manager
    manager.scheduler.cancel(job.id)
    if -1 in delayed:
        workflow.attempts.delay_retry(job, -1, job.flow.attempt, delayed[-1] - manager.clock())
    else:
        workflow.attempts.queue_plain(job)


def _requeue_elements(workflow: Workflow, job: Job, delayed: dict[int, float]) -> None:
    """Take an array's queued elements back and queue them again as its workflow state says: those released by
    its aftercorr target only, those waiting out a retry's delay when it is over, none while it is held."""
    flow = job.flow
    if not (flow.held or delayed or flow.corr is not None):
        return
    manager, attempts = workflow.manager, workflow.attempts
    remaining = manager.scheduler.cancel(job.id)
    tasks = job.pending_map.tail(len(job.pending_map) - remaining) if remaining and job.pending_map else []
    job.pending_map = job.pending_map.head(len(job.pending_map) - remaining) if job.pending_map else None
    if flow.corr is not None:
        tasks = [t for t in tasks if t in flow.corr.released]
    now_tasks = [t for t in tasks if t not in delayed]
    for task in tasks:
        if task in delayed:
            attempts.delay_retry(job, task, flow.attempts.get(task, 0), delayed[task] - manager.clock())
    if flow.held:
        if job.pending_map is None:
            job.pending_map = TaskMap()
        flow.held_from = len(job.pending_map)
    attempts.queue_tasks(job, now_tasks)


def _queue_cut_short(workflow: Workflow) -> None:
    """Queue the jobs whose submission the crash cut short (no `depend`/`priority` event yet)."""
    manager = workflow.manager
    for job in [j for j in manager.jobs.values() if j.state in (State.DEPEND, State.PRIORITY)]:
        flow = workflow.flow_of(job)
        if job.state == State.PRIORITY and not flow.held:
            manager.post(job, "priority", {"priority": job.urgency})
            workflow.queue_first(job)
        elif job.state == State.DEPEND:
            workflow.try_release(job)
