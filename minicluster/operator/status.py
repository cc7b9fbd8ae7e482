"""The MiniCluster's status: what the broker reports, merged with its Job.

The operator polls the broker's HTTP status endpoint (see docs/operator.md,
"Why polling") through a `StatusFetcher`, an injectable async callable, so
tests can point it at a local HTTP server.  `derive()` is pure: it turns the
broker's report and the Job into status fields and conditions.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from minicluster.operator.spec import STATUS_PORT, MiniCluster

BrokerStatus = Mapping[str, Any]
StatusFetcher = Callable[[MiniCluster], Awaitable[BrokerStatus | None]]
UrlFor = Callable[[MiniCluster], str]

CONDITION_TYPES = ("Ready", "Suspended", "Succeeded", "Failed")


def broker_url(mc: MiniCluster, cluster_domain: str = "cluster.local") -> str:
    host = f"{mc.name}-0.{mc.name}.{mc.namespace}.svc.{cluster_domain}"
    return f"http://{host}:{STATUS_PORT}/status"


class HttpStatusFetcher:
    """GET the broker's /status; None when it is not (yet) reachable."""

    def __init__(self, url_for: UrlFor = broker_url, timeout: float = 3.0) -> None:
        self._url_for = url_for
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __call__(self, mc: MiniCluster) -> BrokerStatus | None:
        if self._closed:
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(self._url_for(mc)) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


def job_conditions(job: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The Job's conditions that are currently true, by type."""
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conditions if c.get("status") == "True"}


def job_finished(job: Mapping[str, Any] | None) -> bool:
    return bool({"Complete", "Failed"} & set(job_conditions(job)))


def job_suspended(job: Mapping[str, Any] | None) -> bool:
    return bool(((job or {}).get("spec") or {}).get("suspend"))


def derive(
    mc: MiniCluster,
    old: Mapping[str, Any],
    job: Mapping[str, Any] | None,
    broker: BrokerStatus | None,
    now: str,
) -> dict[str, Any]:
    """New status fields (only those this poll owns) for the MiniCluster."""
    phase, reason, message = _phase(mc, job, broker)
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
    wanted = {
        "Ready": (ready, "AllRanksJoined" if ready else reason, message),
        "Suspended": (phase == "Suspended", reason if phase == "Suspended" else "NotSuspended", ""),
        "Succeeded": (phase == "Succeeded", reason if phase == "Succeeded" else "NotFinished", ""),
        "Failed": (phase == "Failed", reason if phase == "Failed" else "NoFailure",
                   message if phase == "Failed" else ""),
    }
    conditions: Sequence[Mapping[str, Any]] = old.get("conditions") or []
    for type_, (status, why, text) in wanted.items():
        conditions = set_condition(conditions, type_, status, why, text, now)
    fields["conditions"] = list(conditions)
    return fields


def _phase(
    mc: MiniCluster, job: Mapping[str, Any] | None, broker: BrokerStatus | None,
) -> tuple[str, str, str]:
    """(phase, reason, message) from the Job's verdict first, then the broker."""
    true = job_conditions(job)
    if "Complete" in true or "SuccessCriteriaMet" in true:
        return "Succeeded", "BrokerSucceeded", "rank 0 finished successfully"
    for type_ in ("Failed", "FailureTarget"):
        if type_ in true:
            cond = true[type_]
            return "Failed", cond.get("reason") or "JobFailed", cond.get("message", "")
    command = (broker or {}).get("command") or {}
    if command.get("state") == "exited" and command.get("status") not in (None, 0):
        return "Failed", "CommandFailed", f"the batch command exited with status {command['status']}"
    if job_suspended(job):
        why = "QueuedInKueue" if mc.queue_name and not mc.suspend else "SuspendedBySpec"
        return "Suspended", why, ""
    if broker is None:
        return "Pending", "BrokerUnreachable", "the broker's status endpoint does not answer yet"
    ranks = broker.get("ranks") or {}
    if broker.get("ready"):
        return "Running", "AllRanksJoined", f"{ranks.get('up', 0)}/{ranks.get('expected', mc.size)} ranks joined"
    return "Pending", "RanksJoining", f"{ranks.get('up', 0)}/{ranks.get('expected', mc.size)} ranks joined"


def find_condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any]:
    return next((c for c in conditions if c.get("type") == type_), {})


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> list[dict[str, Any]]:
    """Conditions with `type_` replaced; the transition time moves only on a flip."""
    text = "True" if status else "False"
    result: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            result.append(dict(cond))
            continue
        found = True
        since = cond.get("lastTransitionTime", now) if cond.get("status") == text else now
        result.append(_condition(type_, text, reason, message, since))
    if not found:
        result.append(_condition(type_, text, reason, message, now))
    return result


def _condition(type_: str, status: str, reason: str, message: str, since: str) -> dict[str, Any]:
    cond = {"type": type_, "status": status, "reason": reason, "lastTransitionTime": since}
    if message:
        cond["message"] = message
    return cond


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that differ, so an unchanged MiniCluster costs no write."""
    return {key: value for key, value in new.items() if old.get(key) != value}
