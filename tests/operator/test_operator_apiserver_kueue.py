"""Tier (c): suspending a queued MiniCluster through its Kueue Workload on the real API server (1.20), with the
operator on its own ServiceAccount token and the shipped RBAC.

Kueue itself does not run here (see test_operator_kueue.py, which plays its rules on kmock; 1.20 drops the Job's
`suspend` that Kueue works through). What this tier shows is what only a real API server can: the operator
finds the Workload Kueue would have made (by the Job's uid label, which the API server filters on, and its
controller reference to the Job) and patches its `spec.active` with the rights deploy/operator/rbac.yaml gives;
and where no Workload kind is installed, a queued MiniCluster reconciles as before.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import test_operator_apiserver as apiserver_tier
from minicluster.operator.kube import Kube
from test_operator_apiserver import MC_PATH, body, condition, until

pytestmark = pytest.mark.apiserver

# The tier's fixtures: the control plane's install (CRD, RBAC, the operator's token), its broker endpoint, the
# operator of namespace default, an admin client.
installed, broker_port, operator, admin = (apiserver_tier.installed, apiserver_tier.broker_port,
                                           apiserver_tier.operator, apiserver_tier.admin)

WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Kueue's Workload kind, as far as these tests use it (Kueue's own CRD has the full schema).
WORKLOAD_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "workloads.kueue.x-k8s.io"},
    "spec": {
        "group": "kueue.x-k8s.io", "scope": "Namespaced",
        "names": {"plural": "workloads", "singular": "workload", "kind": "Workload", "listKind": "WorkloadList"},
        "versions": [{"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


async def _reconciled(admin: Kube, path: str) -> dict[str, Any] | None:
    mc = await admin.get(path) or {}
    done = condition(mc, "Reconciled")
    generation = mc.get("metadata", {}).get("generation")
    return mc if done.get("status") == "True" and done.get("observedGeneration") == generation else None


async def _field(admin: Kube, path: str, pick: Callable[[dict[str, Any]], Any], wanted: Any) -> bool:
    return pick(await admin.get(path) or {}) == wanted


def _active(workload: dict[str, Any]) -> Any:
    return (workload.get("spec") or {}).get("active")


async def test_without_kueue_a_queued_minicluster_suspends_and_reconciles(operator: None, admin: Kube) -> None:
    # Runs before the Workload kind is installed: the operator's LIST of Workloads gets a 404 and does nothing.
    await admin.create(MC_PATH.format(ns="default"), body("lone", queueName="team-a"))
    path = f"{MC_PATH.format(ns='default')}/lone"
    await until(lambda: _reconciled(admin, path))
    await admin.merge_patch(path, {"spec": {"suspend": True}})
    mc = await until(lambda: _reconciled(admin, path))
    assert condition(mc, "Reconciled")["reason"] == "ChildrenUpToDate"


async def test_suspend_and_resume_reach_the_workload_of_the_job(operator: None, admin: Kube) -> None:
    await admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WORKLOAD_CRD)
    await until(lambda: admin.get(WORKLOADS))
    await admin.create(MC_PATH.format(ns="default"), body("queued", queueName="team-a"))
    path = f"{MC_PATH.format(ns='default')}/queued"
    job = await until(lambda: admin.get("/apis/batch/v1/namespaces/default/jobs/queued"))
    uid = job["metadata"]["uid"]
    # The Workload as Kueue makes it for the Job, and one of another Job's (which the label selector leaves out).
    ours = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": "job-queued-1a2b3", "labels": {JOB_UID_LABEL: uid},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "queued", "uid": uid,
                                              "controller": True}]},
            "spec": {"active": True, "queueName": "team-a", "podSets": [{"name": "main", "count": 2}]}}
    other = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
             "metadata": {"name": "job-other-4c5d6", "labels": {JOB_UID_LABEL: "another-jobs-uid"}},
             "spec": {"active": True, "queueName": "team-a", "podSets": [{"name": "main", "count": 1}]}}
    for workload in (ours, other):
        await admin.create(WORKLOADS, workload)
    await until(lambda: _reconciled(admin, path))

    await admin.merge_patch(path, {"spec": {"suspend": True}})
    await until(lambda: _field(admin, f"{WORKLOADS}/job-queued-1a2b3", _active, False))
    await until(lambda: _reconciled(admin, path))
    assert _active(await admin.get(f"{WORKLOADS}/job-other-4c5d6") or {}) is True

    await admin.merge_patch(path, {"spec": {"suspend": False}})
    await until(lambda: _field(admin, f"{WORKLOADS}/job-queued-1a2b3", _active, True))
    assert _active(await admin.get(f"{WORKLOADS}/job-other-4c5d6") or {}) is True
