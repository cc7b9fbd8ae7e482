"""Kopf handlers: thin glue between events, reconciliation and status.

Handlers are attached to a given registry by `register()` instead of at
import time, so every test (and every embedding) gets its own operator with
its own dependencies.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from minicluster.operator import manifests, reconcile, status
from minicluster.operator.kube import ApiError, Kube, path_of
from minicluster.operator.metrics import Metrics
from minicluster.operator.spec import GROUP, PLURAL, VERSION, MiniCluster, problems

RESOURCE = (GROUP, VERSION, PLURAL)
logger = logging.getLogger(__name__)


@dataclass
class Deps:
    kube: Kube
    fetch_status: status.StatusFetcher
    metrics: Metrics
    poll_interval: float = 5.0
    cluster_domain: str = "cluster.local"


def register(registry: kopf.OperatorRegistry, deps: Deps) -> None:
    on_spec = dict(registry=registry)

    @kopf.on.resume(*RESOURCE, **on_spec)
    @kopf.on.create(*RESOURCE, **on_spec)
    @kopf.on.update(*RESOURCE, field="spec", **on_spec)
    async def reconcile_children(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        deps.metrics.reconciled("reconcile")
        await _reconcile(deps, body, patch)

    @kopf.timer(*RESOURCE, interval=deps.poll_interval, **on_spec)
    async def poll_status(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        deps.metrics.reconciled("status")
        try:
            await _poll(deps, body, patch)
        except Exception:
            deps.metrics.failed("status")
            raise

    @kopf.on.delete(*RESOURCE, optional=True, **on_spec)
    def forget(name: str, namespace: str, **_: Any) -> None:
        # Children go with the MiniCluster through their ownerReferences.
        deps.metrics.forget(namespace, name)


async def _reconcile(deps: Deps, body: kopf.Body, patch: kopf.Patch) -> None:
    found = problems(body)
    if found:
        _refuse(deps, body, patch, "InvalidSpec", "; ".join(found), phase="Invalid")
        return
    mc = MiniCluster.from_body(body)
    try:
        await reconcile.ensure(deps.kube, mc, deps.cluster_domain)
    except reconcile.NotOwned as exc:
        _refuse(deps, body, patch, "NotOwned", str(exc))
        return
    except ApiError as exc:
        deps.metrics.failed("reconcile")
        if exc.status in (400, 422):
            # The API server refused what we asked (e.g. an immutable field on
            # an old cluster); retrying the same request cannot help.
            _refuse(deps, body, patch, "Rejected", f"the API server refused a change: {exc.message}")
            return
        raise kopf.TemporaryError(f"reconciling children: {exc}", delay=10) from exc
    old = body.get("status") or {}
    patch.status.update(status.changed(old, {
        "size": mc.size,
        "maxSize": mc.max_size,
        "selector": manifests.selector(mc),
        "observedGeneration": mc.generation,
        "conditions": status.set_condition(
            old.get("conditions") or [], "Reconciled", True, "ChildrenUpToDate", "", _now()),
    }))


def _refuse(deps: Deps, body: kopf.Body, patch: kopf.Patch, reason: str, message: str,
            phase: str | None = None) -> None:
    """Say loudly, in status and as an event, why nothing was done."""
    deps.metrics.failed("reconcile")
    kopf.warn(body, reason=reason, message=message)
    old = body.get("status") or {}
    fields: dict[str, Any] = {
        "observedGeneration": body.get("metadata", {}).get("generation", 0),
        "conditions": status.set_condition(
            old.get("conditions") or [], "Reconciled", False, reason, message, _now()),
    }
    if phase:
        fields["phase"] = phase
        deps.metrics.set_phase(body["metadata"]["namespace"], body["metadata"]["name"], phase)
    patch.status.update(status.changed(old, fields))


async def _poll(deps: Deps, body: kopf.Body, patch: kopf.Patch) -> None:
    if problems(body):
        return  # the reconcile handler has already said why
    mc = MiniCluster.from_body(body)
    job = await deps.kube.get(path_of("Job", mc.namespace, mc.name))
    if job is None:
        # Deleted behind our back (or never created): rebuild, report next time.
        await _reconcile(deps, body, patch)
        return
    if not reconcile.is_owned(job, mc):
        return  # someone else's Job: the reconcile handler has reported it
    active = not status.job_finished(job) and not status.job_suspended(job)
    broker = await deps.fetch_status(mc) if active else None
    old = body.get("status") or {}
    fields = status.derive(mc, old, job, broker, _now())
    deps.metrics.set_phase(mc.namespace, mc.name, fields["phase"])
    changes = status.changed(old, fields)
    if changes:
        # Written here rather than via kopf's patch: a refused status write
        # must not end this object's timer (kopf does not restart it).
        try:
            await deps.kube.merge_patch(f"{path_of('MiniCluster', mc.namespace, mc.name)}/status",
                                        {"status": changes})
        except ApiError as exc:
            deps.metrics.failed("status")
            logger.warning("writing the status of %s/%s failed: %s", mc.namespace, mc.name, exc)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
