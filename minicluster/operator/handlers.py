"""Kopf handlers: thin glue between events, reconciliation and status.

Handlers are attached to a given registry by `register()` instead of at
import time, so every test (and every embedding) gets its own operator with
its own dependencies.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf

from minicluster.operator import kueue, manifests, reconcile, status
from minicluster.operator import pods as pods_mod
from minicluster.operator.kube import ApiError, Kube, path_of
from minicluster.operator.metrics import Metrics
from minicluster.operator.spec import GROUP, MANAGER, NAME_LABEL, PLURAL, VERSION, MiniCluster, problems

RESOURCE = (GROUP, VERSION, PLURAL)
logger = logging.getLogger(__name__)
# With storage: how long workers may take to obey rank 0's shutdown before their Job is suspended.
STRAGGLER_GRACE = 30.0
# The operator's own pods and Jobs: watched with this selector (the API server filters, runner.configure), once
# for every MiniCluster, instead of a GET and a LIST per MiniCluster and poll.
OWN = {"app.kubernetes.io/managed-by": MANAGER}
OWN_SELECTOR = ",".join(f"{key}={value}" for key, value in OWN.items())
# How many MiniClusters one poll round works on at once (each is mostly a wait on its broker's HTTP answer).
POLL_CONCURRENCY = 32


@dataclass
class Deps:
    kube: Kube
    fetch_status: status.StatusFetcher
    metrics: Metrics
    poll_interval: float = 5.0
    cluster_domain: str = "cluster.local"
    # Off only where a stand-in supplies the Job features the API server does not know (tests/e2e on 1.20).
    check_jobs: bool = True


def register(registry: kopf.OperatorRegistry, deps: Deps) -> None:
    @kopf.on.resume(*RESOURCE, id="reconcile", registry=registry)
    @kopf.on.create(*RESOURCE, id="reconcile", registry=registry)
    @kopf.on.update(*RESOURCE, id="reconcile", field="spec", registry=registry)
    async def reconcile_children(body: kopf.Body, **_: Any) -> None:
        deps.metrics.reconciled("reconcile")
        await _reconcile(deps, body)

    # kopf keeps these in memory from one watch each and hands them to every handler by their ids.
    @kopf.index("v1", "pods", id="minicluster_pods", labels=OWN, registry=registry)
    def pods_by_minicluster(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                            **_: Any) -> dict[tuple[str | None, str], dict[str, Any]] | None:
        name = labels.get(NAME_LABEL)
        return {(namespace, name): dict(body)} if name else None

    @kopf.index("batch", "v1", "jobs", id="minicluster_jobs", labels=OWN, registry=registry)
    def jobs_by_name(namespace: str | None, name: str, body: kopf.Body,
                     **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
        return {(namespace, name): dict(body)}

    # One task polls every MiniCluster, not a kopf timer per MiniCluster: kopf puts a finalizer on every object
    # that has a timer (kopf issue #1074), with which a MiniCluster (and its CRD) can stick in Terminating.
    stopping = asyncio.Event()
    polling: list[asyncio.Task[None]] = []
    views: dict[str, Any] = {}

    @kopf.on.startup(registry=registry)
    async def find_views(**kwargs: Any) -> None:
        views.update(kwargs)

    @kopf.index(*RESOURCE, id="miniclusters", registry=registry)
    async def miniclusters_by_name(namespace: str | None, name: str, body: kopf.Body,
                                   **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
        if not polling and not stopping.is_set():
            # Started from a MiniCluster's handler, not at startup: kopf's event poster (kopf.event, kopf.warn)
            # exists only for its object handlers and the tasks they start.
            children = Children(views["minicluster_pods"], views["minicluster_jobs"])
            polling.append(asyncio.create_task(_poll_all(deps, views["miniclusters"], children, stopping)))
        return {(namespace, name): dict(body)}

    @kopf.on.cleanup(registry=registry)
    async def stop_polling(**_: Any) -> None:
        stopping.set()
        for task in polling:
            # An in-flight round may finish its status writes, briefly.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)

    @kopf.on.delete(*RESOURCE, id="forget", optional=True, registry=registry)
    def forget(name: str, namespace: str | None, **_: Any) -> None:
        # Children go with the MiniCluster through their ownerReferences.
        if namespace is not None:  # always, for a namespaced resource
            deps.metrics.forget(namespace, name)


async def _poll_all(deps: Deps, miniclusters: Mapping[Any, Any], children: Children, stopping: asyncio.Event) -> None:
    """Every watched MiniCluster's status, every poll interval, from the watches' view (one broker call each).
    A pod's change reaches its MiniCluster's status within about one interval."""
    loop = asyncio.get_running_loop()
    limit = asyncio.Semaphore(POLL_CONCURRENCY)
    started = loop.time()  # the first round one interval on: the watches' first lists have come in by then

    async def poll(body: Mapping[str, Any]) -> None:
        async with limit:
            deps.metrics.reconciled("status")
            try:
                await _poll(deps, kopf.Body(cast(kopf.RawBody, body)), children)
            except Exception:
                # The next round tries again; one MiniCluster's trouble stops no other's status.
                deps.metrics.failed("status")
                logger.exception("polling the status of %s/%s failed", body["metadata"].get("namespace"),
                                 body["metadata"].get("name"))
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), max(0.0, started + deps.poll_interval - loop.time()))
        if stopping.is_set():
            return
        started = loop.time()
        bodies = [body for store in list(miniclusters.values()) for body in store
                  if not body["metadata"].get("deletionTimestamp")]
        await asyncio.gather(*(poll(body) for body in bodies))


async def _reconcile(deps: Deps, body: kopf.Body) -> None:
    found = problems(body)
    if found:
        # A refused edit changes nothing that runs: the poller goes on reporting the children as they are.
        made = await _has_jobs(deps.kube, MiniCluster.from_body(body))
        await _refuse(deps, body, "InvalidSpec", "; ".join(found), phase=None if made else "Invalid")
        return
    mc = MiniCluster.from_body(body)
    # The body may predate the status that recorded the end (kopf hands a creation it re-processes the body of
    # its event): what the API server has now decides, or a Job deleted after the end would be made again.
    if _finished(body) or _finished(await _fresh(deps, body)):
        await _say_finished(deps, body, "its children are left as they are")
        return
    try:
        await reconcile.ensure(deps.kube, mc, deps.cluster_domain, deps.check_jobs)
    except reconcile.Unsupported as exc:
        await _refuse(deps, body, "UnsupportedCluster", str(exc), phase="Unsupported")
        return
    except reconcile.NotOwned as exc:
        await _refuse(deps, body, "NotOwned", str(exc))
        return
    except reconcile.TemplateChanged as exc:
        await _refuse(deps, body, "TemplateImmutable", str(exc), applied={"size": mc.size})
        return
    except kueue.Forbidden as exc:
        await _refuse(deps, body, "KueueForbidden", str(exc), applied={"size": mc.size})
        return
    except ApiError as exc:
        if exc.status in (400, 422):
            # The API server refused what we asked (e.g. an immutable field on
            # an old cluster); retrying the same request cannot help.
            await _refuse(deps, body, "Rejected", f"the API server refused a change: {exc.message}")
            return
        deps.metrics.failed("reconcile")
        raise kopf.TemporaryError(f"reconciling children: {exc}", delay=10) from exc

    def reconciled(old: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "size": mc.size,
            "maxSize": mc.max_size,
            "selector": manifests.selector(mc),
            "observedGeneration": mc.generation,
            "conditions": status.set_condition(
                old.get("conditions") or [], "Reconciled", True, "ChildrenUpToDate", "", _now(), mc.generation),
        }
    await _write_status(deps, body, reconciled)


async def _refuse(deps: Deps, body: kopf.Body, reason: str, message: str,
                  phase: str | None = None, applied: Mapping[str, Any] | None = None) -> None:
    """Say loudly, in status and as an event, why nothing was done."""
    deps.metrics.failed("reconcile")
    meta = body["metadata"]
    if phase:
        deps.metrics.set_phase(meta["namespace"], meta["name"], phase)
    seen: list[Mapping[str, Any]] = []
    generation = meta.get("generation", 0)

    def refused(old: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(status.find_condition(old.get("conditions") or [], "Reconciled"))
        conditions = status.set_condition(
            old.get("conditions") or [], "Reconciled", False, reason, message, _now(), generation)
        if phase:
            # A MiniCluster that cannot run is not merely waiting for its broker: Ready says why, too.
            conditions = status.set_condition(conditions, "Ready", False, reason, message, _now(), generation)
        fields: dict[str, Any] = {
            **(applied or {}),
            "observedGeneration": generation,
            "conditions": conditions,
        }
        return {**fields, "phase": phase} if phase else fields
    await _write_status(deps, body, refused)
    said = seen[-1] if seen else {}
    # One event per new problem, although the poller retries every few seconds.
    if (said.get("status"), said.get("reason"), said.get("message")) != ("False", reason, message):
        kopf.warn(body, reason=reason, message=message)


@dataclass(frozen=True)
class Children:
    """The operator's own pods (by MiniCluster) and Jobs (by name) as its watches last saw them."""
    pods: Mapping[tuple[str, str], Any]
    jobs: Mapping[tuple[str, str], Any]

    def pods_of(self, mc: MiniCluster) -> list[Any]:
        return list(self.pods.get((mc.namespace, mc.name), ()))

    async def job(self, kube: Kube, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The Job as watched; one GET where the watch has none (just made, gone, or not ours: the poll then
        acts on what the API server says, not on a watch that may lag)."""
        seen = next(iter(self.jobs.get((namespace, name), ())), None)
        return seen if seen is not None else await kube.get(path_of("Job", namespace, name))


async def _poll(deps: Deps, body: kopf.Body, children: Children) -> None:
    # With a refused edit (the reconcile handler said why) the children still run as last accepted.
    invalid = bool(problems(body))
    mc = _last_accepted(body) if invalid else MiniCluster.from_body(body)
    job = await children.job(deps.kube, mc.namespace, mc.broker_job_name)
    if job is None:
        if _finished(body) or _finished(await _fresh(deps, body)):
            # Deleted after the end (a TTL, an admin): making it again would run the batch command twice. The
            # timer's body may predate the status that said so (a loaded operator), hence the fresh read.
            await _say_finished(deps, body, "its Jobs are gone and are not made again")
        elif not invalid:
            # Deleted behind our back (or never created): rebuild, report next time.
            await _reconcile(deps, body)
        return
    if not reconcile.is_owned(job, mc):
        return  # someone else's Job: the reconcile handler has reported it
    if mc.queue_name and mc.suspend and not invalid and not status.job_suspended(job):
        # Kueue admitted a Workload it made after the suspension (and so un-suspended the Job): hold it too.
        await _reconcile(deps, body)
    mc = dataclasses.replace(mc, size=reconcile.admitted_size(mc, job))
    workers = await children.job(deps.kube, mc.namespace, mc.name) if mc.storage else None
    # Without storage both names are the same Job (and workers is None).
    if deps.check_jobs and not invalid and reconcile.lacks_fields(mc, {mc.name: workers, mc.broker_job_name: job}):
        # The reconcile handler stops the Job and says why; again here only if that has not been done yet.
        if (body.get("status") or {}).get("phase") != "Unsupported":
            await _reconcile(deps, body)
        return
    active = not status.job_finished(job) and not status.job_suspended(job)
    failed = "Failed" in status.job_conditions(job) or "Failed" in status.job_conditions(workers)
    pods = children.pods_of(mc) if active or failed else []
    events = await _refusals(deps.kube, mc) if (active or failed) and len(pods) < mc.size else []
    broker = await deps.fetch_status(mc, pods_mod.broker_pod(mc, pods)) if active else None
    if mc.min_size and not invalid and broker is not None and \
            (broker.get("ranks") or {}).get("expected", mc.size) != mc.size:
        # Kueue started the Job with another number of pods than the broker expects (partial admission).
        await _reconcile(deps, body)
    seen = status.Observed(job=job, broker=broker, workers=workers, pods=pods, events=events)
    lost: list[str] = []
    moved: list[tuple[str, str]] = []
    recorded: list[str] = []

    def polled(old: Mapping[str, Any]) -> dict[str, Any]:
        fields = status.derive(mc, old, seen, _now())
        deps.metrics.set_phase(mc.namespace, mc.name, fields["phase"])
        recorded[:] = [fields["phase"]]
        moved[:] = [_phase_change(old, fields)] if old.get("phase") != fields["phase"] else []
        before = status.find_condition(old.get("conditions") or [], "StateDurable")
        after = status.find_condition(fields["conditions"], "StateDurable")
        if after.get("reason") == "StateLost" and after.get("message") != before.get("message"):
            lost[:] = [after["message"]]
        return fields
    try:
        await _write_status(deps, body, polled, known=body)
    except ApiError as exc:
        # Logged, not raised: one MiniCluster's failed write is retried at the next round, as it is.
        deps.metrics.failed("status")
        logger.warning("writing the status of %s/%s failed: %s", mc.namespace, mc.name, exc)
        recorded.clear()
    if lost:
        kopf.warn(body, reason="StateLost", message=lost[0])
    for phase, message in moved:
        # Through kopf's event poster, as the Warnings: a failure is one, every other phase change is Normal
        # (kopf.event: kopf.info obeys posting.level, WARNING so that kopf's own handler logs are no events).
        kopf.event(body, type="Warning" if phase == "Failed" else "Normal", reason=phase, message=message)
    if workers is not None and status.job_finished(job):
        await _stop_workers(deps.kube, mc, job, workers)
    if recorded and recorded[0] in ("Succeeded", "Failed"):
        await _expire(deps.kube, mc, job, workers)


def _phase_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, str]:
    """(the new phase, the event's message) of a phase transition: from what to what, and why."""
    phase = new["phase"]
    kind = {"Succeeded": "Succeeded", "Failed": "Failed", "Suspended": "Suspended"}.get(phase, "Ready")
    why = status.find_condition(new.get("conditions") or [], kind)
    text = ": ".join(filter(None, [why.get("reason", ""), why.get("message", "")]))
    return phase, f"phase {old.get('phase') or 'none'} -> {phase}" + (f" ({text})" if text else "")


def _finished(body: Mapping[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") in ("Succeeded", "Failed")


async def _fresh(deps: Deps, body: kopf.Body) -> Mapping[str, Any]:
    """The MiniCluster as the API server has it now (empty if it is gone)."""
    meta = body["metadata"]
    return await deps.kube.get(path_of("MiniCluster", meta["namespace"], meta["name"])) or {}


async def _say_finished(deps: Deps, body: kopf.Body, what: str) -> None:
    message = f"the MiniCluster has finished: {what} (a batch command runs once)"

    def finished(old: Mapping[str, Any]) -> dict[str, Any]:
        generation = body["metadata"].get("generation", 0)
        conditions = status.set_condition(
            old.get("conditions") or [], "Reconciled", True, "Finished", message, _now(), generation)
        return {"observedGeneration": generation, "conditions": conditions}
    await _write_status(deps, body, finished)


def _last_accepted(body: kopf.Body) -> MiniCluster:
    """The MiniCluster as its children were made: the size last applied, not a refused one."""
    mc = MiniCluster.from_body(body)
    applied = (body.get("status") or {}).get("size")
    return dataclasses.replace(mc, size=int(applied)) if applied else mc


async def _has_jobs(kube: Kube, mc: MiniCluster) -> bool:
    for name in {mc.name, f"{mc.name}-broker"}:
        job = await kube.get(path_of("Job", mc.namespace, name))
        if job is not None and reconcile.is_owned(job, mc):
            return True
    return False


async def _refusals(kube: Kube, mc: MiniCluster) -> list[Any]:
    """The Jobs' FailedCreate events: pods that admission refused never exist (so asked only while pods are
    missing)."""
    events: list[Any] = []
    for name in {mc.name, mc.broker_job_name}:
        query = f"fieldSelector=involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate"
        events += (await kube.get(f"{path_of('Event', mc.namespace)}?{query}") or {}).get("items") or []
    return events


async def _expire(kube: Kube, mc: MiniCluster, *jobs: Mapping[str, Any] | None) -> None:
    """spec.ttlSecondsAfterFinished, on the finished Jobs only once the MiniCluster's end is in its status: a Job
    the TTL controller deleted before would look deleted behind the operator's back, and be made (and run) again.
    The TTL counts from the Job's end all the same."""
    ttl = mc.ttl_seconds_after_finished
    for job in jobs:
        if ttl is not None and job is not None and status.job_finished(job) and \
                (job.get("spec") or {}).get("ttlSecondsAfterFinished") != ttl:
            await kube.merge_patch(path_of("Job", mc.namespace, job["metadata"]["name"]),
                                   {"spec": {"ttlSecondsAfterFinished": ttl}})


async def _stop_workers(kube: Kube, mc: MiniCluster, job: Mapping[str, Any], workers: Mapping[str, Any]) -> None:
    """With storage, rank 0's Job ended (the workers' Job has no success policy to end with it): workers told
    to stop have done so; suspend the Job of any that remain (a rank down during the shutdown, or a failure)."""
    if status.job_finished(workers) or status.job_suspended(workers):
        return
    ended = status.job_conditions(job)
    since = str(((job.get("status") or {}).get("completionTime")) or "")
    if "Complete" in ended and since and since > _now(-STRAGGLER_GRACE):
        return
    await kube.merge_patch(path_of("Job", mc.namespace, mc.name), {"spec": {"suspend": True}})


async def _write_status(
    deps: Deps, body: kopf.Body, compute: Callable[[Mapping[str, Any]], dict[str, Any]],
    known: Mapping[str, Any] | None = None,
) -> None:
    """Read-modify-write of the status subresource, guarded by resourceVersion.

    Two writers share `status.conditions` (reconcile and the poller); a list
    is replaced whole by a merge patch, so each write starts from a fresh read
    and is refused (409) if the object changed in between, then retried.
    `known`: the MiniCluster as the watch last saw it (the poller's): a poll that would change nothing in it
    reads nothing either (most polls; one the watch is behind on is made good by the next), any other reads.
    """
    meta = body["metadata"]
    path = path_of("MiniCluster", meta["namespace"], meta["name"])
    if known is not None and not _status_changes(known, compute):
        return
    for attempt in range(3):
        current = await deps.kube.get(path)
        if current is None:
            return  # deleted meanwhile
        changes = _status_changes(current, compute)
        if not changes:
            return
        guard = {"resourceVersion": current["metadata"].get("resourceVersion")}
        try:
            await deps.kube.merge_patch(f"{path}/status", {"metadata": guard, "status": changes})
            return
        except ApiError as exc:
            if exc.status != 409 or attempt == 2:
                raise


def _status_changes(
    current: Mapping[str, Any], compute: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    old = current.get("status") or {}
    new = compute(old)
    # Reconciling and Stalled follow from the rest of the status, whichever writer changed it.
    new["conditions"] = status.progress({**old, **new}, int(current["metadata"].get("generation") or 0), _now())
    return status.changed(old, new)


def _now(offset: float = 0.0) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
