"""Suspending a MiniCluster that Kueue admitted: through its Workloads, the way Kueue itself stops a job.

Kueue's job reconciler un-suspends the Job of an admitted Workload again, so `spec.suspend: true` on the Job
alone would restart every rank. A Workload with `spec.active: false` is evicted by Kueue instead: it suspends
the Job and keeps the Workload out of admission until it is active again, when it is queued and admitted anew.
Kueue names its Workloads itself; they are found by the Job's uid label and their controller reference.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minicluster.operator.kube import ApiError, Kube

WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads"
# Set by Kueue on the Workload it makes for a Job (its jobframework's JobUIDLabel).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


class Forbidden(Exception):
    """The operator may not read or change Workloads (its RBAC predates them): Kueue may undo a suspension."""


async def hold(kube: Kube, job: Mapping[str, Any], active: bool) -> None:
    """Make the Workloads Kueue keeps for `job` active or not. Nothing happens where Kueue is not installed
    (the API server knows no Workloads) or has not made the Workload yet (the Job is then still suspended)."""
    meta = job["metadata"]
    base = WORKLOADS.format(namespace=meta["namespace"])
    query = f"?labelSelector={JOB_UID_LABEL}%3D{meta['uid']}" if meta.get("uid") else ""
    try:
        found = await kube.get(base + query)  # None (404) where the API server knows no Workloads
        for workload in (found or {}).get("items") or []:
            if _belongs(workload, meta) and (workload.get("spec") or {}).get("active", True) != active:
                await kube.merge_patch(f"{base}/{workload['metadata']['name']}", {"spec": {"active": active}})
    except ApiError as exc:
        if exc.status != 403:
            raise
        raise Forbidden(
            f"the operator may not list and patch workloads.kueue.x-k8s.io ({exc.message}), so Kueue un-suspends "
            f"an admitted Job: apply the operator's RBAC of this version (deploy/operator/rbac.yaml)") from exc


def _belongs(workload: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    refs = (workload.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("kind") == "Job" and ref.get("name") == job["name"]
               and ref.get("uid") == job.get("uid") for ref in refs)
