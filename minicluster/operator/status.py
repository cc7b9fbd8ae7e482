"""The MiniCluster's status: what the broker reports, merged with its Jobs and pods.

The operator polls the broker's HTTP status endpoint (see docs/operator.md,
"Why polling") through a `StatusFetcher`, an injectable async callable, so
tests can point it at a local HTTP server: by DNS name from inside the
cluster, through the API server's pod proxy from outside.  `derive()` is
pure: it turns one poll's `Observed` view into status fields and conditions.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from minicluster.operator import pods as pods_mod
from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.spec import STATUS_PORT, MiniCluster

BrokerStatus = Mapping[str, Any]
# (MiniCluster, its running rank-0 pod or None) -> the broker's /status, or None when it does not answer.
StatusFetcher = Callable[[MiniCluster, Mapping[str, Any] | None], Awaitable[BrokerStatus | None]]
UrlFor = Callable[[MiniCluster], str]

CONDITION_TYPES = ("Ready", "Suspended", "Succeeded", "Failed", "StateDurable", "Reconciled", "Reconciling", "Stalled")
# Reconciled reasons after which nothing changes until the user changes the spec (or the cluster): Stalled.
STALLING = ("InvalidSpec", "TemplateImmutable", "NotOwned", "Rejected", "UnsupportedCluster")
SETTLED_PHASES = ("Running", "Suspended", "Succeeded")


@dataclass(frozen=True)
class Observed:
    """One poll's view of a MiniCluster."""
    job: Mapping[str, Any] | None  # the Job whose end is the MiniCluster's (MiniCluster.broker_job_name)
    broker: BrokerStatus | None = None
    workers: Mapping[str, Any] | None = None  # with spec.storage: the workers' Job
    pods: Sequence[Mapping[str, Any]] = ()
    events: Sequence[Mapping[str, Any]] = ()


def broker_url(mc: MiniCluster, cluster_domain: str = "cluster.local") -> str:
    host = f"{mc.name}-0.{mc.name}.{mc.namespace}.svc.{cluster_domain}"
    return f"http://{host}:{STATUS_PORT}/status"


class HttpStatusFetcher:
    """GET the broker's /status by its DNS name (the operator runs in the cluster); None when it does not
    answer (yet)."""

    def __init__(self, url_for: UrlFor = broker_url, timeout: float = 3.0) -> None:
        self._url_for = url_for
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __call__(self, mc: MiniCluster, pod: Mapping[str, Any] | None = None) -> BrokerStatus | None:
        if self._closed:
            return None
        if self._session is None:
            # A fresh connection and name lookup per poll: a replaced broker pod has a new IP under the same
            # name, and a pooled connection or cached address would keep polling the old one until timeouts.
            connector = aiohttp.TCPConnector(force_close=True, use_dns_cache=False)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        try:
            async with self._session.get(self._url_for(mc)) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


class ProxyStatusFetcher:
    """GET the broker's /status through the API server's pod proxy: for an operator outside the cluster,
    which can resolve no pod's DNS name and may reach no pod IP (needs `get` on pods/proxy)."""

    def __init__(self, kube: Kube, timeout: float = 3.0) -> None:
        self._kube = kube
        self._timeout = timeout

    async def __call__(self, mc: MiniCluster, pod: Mapping[str, Any] | None = None) -> BrokerStatus | None:
        if pod is None:
            return None
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{mc.namespace}/pods/{name}:{STATUS_PORT}/proxy/status"
        try:
            data = await self._kube.request("GET", path, timeout=self._timeout)
        except (TimeoutError, ApiError, aiohttp.ClientError):
            return None
        return data if isinstance(data, dict) and "ranks" in data else None

    async def close(self) -> None:
        pass


def job_conditions(job: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The Job's conditions that are currently true, by type."""
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conditions if c.get("status") == "True"}


def job_finished(job: Mapping[str, Any] | None) -> bool:
    return bool({"Complete", "Failed"} & set(job_conditions(job)))


def job_suspended(job: Mapping[str, Any] | None) -> bool:
    return bool(((job or {}).get("spec") or {}).get("suspend"))


def derive(mc: MiniCluster, old: Mapping[str, Any], seen: Observed, now: str) -> dict[str, Any]:
    """New status fields (only those this poll owns) for the MiniCluster."""
    broker = seen.broker
    phase, reason, message = _phase(mc, seen)
    ready = phase == "Running" and bool(broker and broker.get("ready"))
    fields: dict[str, Any] = {"phase": phase}
    if broker is not None:
        ranks = broker.get("ranks") or {}
        fields["ranks"] = {
            "joined": int(ranks.get("up", 0)),
            "expected": int(ranks.get("expected", mc.size)),
            "unresponsive": int(ranks.get("unresponsive", 0)),
            "lost": int(ranks.get("lost", 0)),
        }
        jobs = broker.get("jobs") or {}
        fields["jobs"] = {k: int(jobs.get(k, 0)) for k in ("queued", "running", "finished", "failed")}
        if "epoch" in broker and "started" in broker:
            fields["broker"] = {"epoch": int(broker["epoch"]), "started": str(broker["started"])}
        queues = broker.get("queues")
        if isinstance(queues, Mapping):
            fields["queues"] = {name: _queue_status(q) for name, q in queues.items() if isinstance(q, Mapping)}
    wanted = {
        "Ready": (ready, "AllRanksJoined" if ready else reason, message),
        "Suspended": (phase == "Suspended", reason if phase == "Suspended" else "NotSuspended", ""),
        "Succeeded": (phase == "Succeeded", reason if phase == "Succeeded" else "NotFinished", ""),
        "Failed": (phase == "Failed", reason if phase == "Failed" else "NoFailure",
                   message if phase == "Failed" else ""),
        "StateDurable": _durability(mc, old, fields.get("broker")),
    }
    conditions: Sequence[Mapping[str, Any]] = old.get("conditions") or []
    for type_, (status, why, text) in wanted.items():
        conditions = set_condition(conditions, type_, status, why, text, now, mc.generation)
    fields["conditions"] = list(conditions)
    return fields


def _queue_status(queue: Mapping[str, Any]) -> dict[str, Any]:
    """One queue's counts and state for the CR status (docs/operator.md)."""
    state = ("enabled" if queue.get("enabled", True) else "disabled") + "," + (
        "started" if queue.get("started", True) else "stopped")
    return {"pending": int(queue.get("pending", 0)), "running": int(queue.get("running", 0)), "state": state}


def _durability(mc: MiniCluster, old: Mapping[str, Any], now_seen: Mapping[str, Any] | None) -> tuple[bool, str, str]:
    """Whether rank 0's state outlives its pod, and what happened when the broker last restarted."""
    before = old.get("broker") or {}
    restarted = bool(now_seen and before and now_seen["started"] != before.get("started"))
    if restarted and now_seen and now_seen["epoch"] <= int(before.get("epoch", 0)):
        return (False, "StateLost", f"the broker restarted at {now_seen['started']} with an empty journal: the "
                "jobs, queue and results recorded before are gone (spec.storage keeps them)")
    previous = find_condition(old.get("conditions") or [], "StateDurable")
    if previous.get("reason") in ("StateLost", "Resumed") and not restarted:
        return previous.get("status") == "True", previous["reason"], previous.get("message", "")
    if mc.storage is None:
        return (False, "EmptyDir", "rank 0's state (queue, jobs, results) is on an emptyDir and dies with the "
                "broker's pod; set spec.storage to keep it")
    if restarted and now_seen:
        return True, "Resumed", f"the broker restarted and resumed from its journal (epoch {now_seen['epoch']})"
    return True, "PersistentVolumeClaim", f"rank 0's state is on the PersistentVolumeClaim {mc.name}-state"


def _phase(mc: MiniCluster, seen: Observed) -> tuple[str, str, str]:
    """(phase, reason, message) from the Jobs' verdicts first, then the broker, then the pods."""
    true = job_conditions(seen.job)
    if "Complete" in true or "SuccessCriteriaMet" in true:
        return "Succeeded", "BrokerSucceeded", "rank 0 finished successfully"
    for conditions in (true, job_conditions(seen.workers)):
        for type_ in ("Failed", "FailureTarget"):
            if type_ in conditions:
                cond = conditions[type_]
                # The Job says that it failed (e.g. its backoff limit); the pods say why, and an image the
                # runtime cannot start in is the reason itself.
                unfit = pods_mod.cannot_start(mc, seen.pods)
                ended = unfit or pods_mod.failing(mc, seen.pods)
                message = "; ".join(filter(None, [cond.get("message", ""), ended.message if ended else ""]))
                return "Failed", unfit.reason if unfit else cond.get("reason") or "JobFailed", message
    command = (seen.broker or {}).get("command") or {}
    if command.get("state") == "exited" and command.get("status") not in (None, 0):
        return "Failed", "CommandFailed", f"the batch command exited with status {command['status']}"
    if job_suspended(seen.job):
        why = "QueuedInKueue" if mc.queue_name and not mc.suspend else "SuspendedBySpec"
        return "Suspended", why, ""
    ranks = (seen.broker or {}).get("ranks") or {}
    if seen.broker is not None and seen.broker.get("ready"):
        return "Running", "AllRanksJoined", f"{ranks.get('up', 0)}/{ranks.get('expected', mc.size)} ranks joined"
    trouble = pods_mod.problem(mc, seen.pods, seen.events)
    if trouble is not None:
        return "Pending", trouble.reason, trouble.message
    if seen.broker is None:
        return "Pending", "BrokerUnreachable", "the broker's status endpoint does not answer yet"
    return "Pending", "RanksJoining", f"{ranks.get('up', 0)}/{ranks.get('expected', mc.size)} ranks joined"


def progress(fields: Mapping[str, Any], generation: int, now: str) -> list[dict[str, Any]]:
    """`fields`' conditions with Reconciling and Stalled (kstatus, as Flux CD and Argo CD read them; True only when
    abnormal) derived from the rest of the status. Stalled: nothing progresses without a change of the spec (a
    refused spec or edit, a Job the API server refused or a cluster too old, a failed MiniCluster). Reconciling:
    the children are still being brought to the spec (a generation not yet reconciled, ranks not yet joined)."""
    conditions: Sequence[Mapping[str, Any]] = fields.get("conditions") or []
    reconciled, phase = find_condition(conditions, "Reconciled"), fields.get("phase")
    stalled: tuple[bool, str, str] = (False, "NotStalled", "")
    if reconciled.get("status") == "False" and reconciled.get("reason") in STALLING:
        stalled = (True, reconciled["reason"], reconciled.get("message", ""))
    elif phase == "Failed":
        failed = find_condition(conditions, "Failed")
        stalled = (True, failed.get("reason") or "Failed", failed.get("message", ""))
    if stalled[0]:
        reconciling = (False, "Stalled", "")
    elif int(fields.get("observedGeneration") or 0) < generation:
        reconciling = (True, "NewGeneration", f"generation {generation} is not reconciled yet")
    elif phase in SETTLED_PHASES:
        reconciling = (False, str(phase), "")
    else:
        ready = find_condition(conditions, "Ready")
        reconciling = (True, ready.get("reason") or "Pending", ready.get("message", ""))
    result = set_condition(conditions, "Reconciling", *reconciling, now, generation)
    return set_condition(result, "Stalled", *stalled, now, generation)


def find_condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any]:
    return next((c for c in conditions if c.get("type") == type_), {})


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Conditions with `type_` replaced; the transition time moves only on a flip. Each condition carries the spec
    generation it was computed from (`observedGeneration`), as the API conventions ask."""
    text = "True" if status else "False"
    result: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            result.append(dict(cond))
            continue
        found = True
        since = cond.get("lastTransitionTime", now) if cond.get("status") == text else now
        result.append(_condition(type_, text, reason, message, since, generation))
    if not found:
        result.append(_condition(type_, text, reason, message, now, generation))
    return result


def _condition(type_: str, status: str, reason: str, message: str, since: str,
               generation: int | None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "lastTransitionTime": since}
    if message:
        cond["message"] = message
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that differ, so an unchanged MiniCluster costs no write."""
    return {key: value for key, value in new.items() if old.get(key) != value}
