"""Tier (b): queued MiniClusters under Kueue's admission rules, with the whole kopf operator on kmock.

Kueue itself cannot run here (no image registry, no Go module proxy, and the real API server tier is 1.20,
which drops the Job's `suspend`), so `kueue_emulator.EmulatedKueue` applies its batch/Job rules: one Workload
per Job, admission within a small quota (in pods), un-suspending an admitted Job (again, when someone else
suspended it), eviction of an inactive Workload, and a resized Job treated as a new job (stopped, its Workload
replaced). Its docstring lists each rule and what is left out.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmocklib
import pytest

from kueue_emulator import WORKLOADS, EmulatedKueue, admitted, controller_name, install
import test_operator_kmock as kmock_tier
from test_operator_kmock import JOB, MC, Kmock, Make, condition, create, eventually, exists, obj, patch

# The kmock tier's fixtures: the operator in a thread of its own against kmock, and the broker's status endpoint.
operator, broker = kmock_tier.operator, kmock_tier.broker
# Its warning filters too.
pytestmark = kmock_tier.pytestmark



@pytest.fixture
async def kueue(kmock: Kmock) -> AsyncIterator[EmulatedKueue]:
    install(kmock)
    emulated = EmulatedKueue(kmock, quota_pods=6, priorities={"low": 10, "high": 1000})
    task = asyncio.create_task(emulated.run())
    yield emulated
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def workloads(kmock: Kmock, job: str) -> list[dict[str, Any]]:
    """The Workloads Kueue keeps for the Job `job`."""
    return [o.raw for (resource, _, _), o in kmock.objects.items()
            if getattr(resource, "plural", None) == "workloads" and not o.deleted and controller_name(o.raw) == job]


async def rounds(kueue: EmulatedKueue, count: int) -> None:
    """Let the emulated Kueue apply its rules `count` more times (what it would undo, it has undone by then)."""
    until = kueue.rounds + count
    await eventually(lambda: kueue.rounds >= until, timeout=30)


async def started(kmock: Kmock, kueue: EmulatedKueue, name: str = "demo") -> dict[str, Any]:
    """The Job once Kueue admitted its one Workload and un-suspended it."""
    await eventually(lambda: obj(kmock, JOB, name)["spec"]["suspend"] is False)
    [workload] = workloads(kmock, name)
    assert admitted(workload)
    return workload


async def test_suspend_of_an_admitted_minicluster_sticks_and_resume_readmits(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue,
) -> None:
    await create(kmock, make_body(queueName="team-a"))
    first = await started(kmock, kueue)
    await patch(kmock, "demo", {"spec": {"suspend": True}})
    # Kueue un-suspends the Job of an admitted, active Workload: the suspension goes through the Workload.
    await eventually(lambda: [w["spec"]["active"] for w in workloads(kmock, "demo")] == [False])
    await rounds(kueue, 20)
    assert obj(kmock, JOB, "demo")["spec"]["suspend"] is True
    [held] = workloads(kmock, "demo")
    assert not admitted(held) and held["metadata"]["name"] == first["metadata"]["name"]
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Suspended")["reason"] == "SuspendedBySpec")
    assert obj(kmock, MC, "demo")["status"]["phase"] == "Suspended"

    await patch(kmock, "demo", {"spec": {"suspend": False}})
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is False)
    [again] = workloads(kmock, "demo")
    assert again["spec"]["active"] is True and admitted(again)
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Pending")
    assert kueue.did("deleted") == [] and len(kueue.did("created")) == 1


async def test_a_minicluster_created_suspended_stays_suspended_once_kueue_admits_it(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue,
) -> None:
    # Kueue makes the Workload after the operator made the Job, active, and admits it: the poll holds it.
    await create(kmock, make_body(queueName="team-a", suspend=True))
    await eventually(lambda: [w["spec"]["active"] for w in workloads(kmock, "demo")] == [False])
    await rounds(kueue, 20)
    assert obj(kmock, JOB, "demo")["spec"]["suspend"] is True
    assert not admitted(workloads(kmock, "demo")[0])


async def test_resizing_an_admitted_minicluster_is_refused_and_it_keeps_running(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue, broker: dict[str, Any],
) -> None:
    await create(kmock, make_body(queueName="team-a", size=4, maxSize=8))
    first = await started(kmock, kueue)
    await patch(kmock, "demo", {"spec": {"size": 5}})
    refused = await eventually(lambda: (c := condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
                               ["status"] == "False" and c)
    assert refused["reason"] == "InvalidSpec" and "fixed at 4" in refused["message"]
    await rounds(kueue, 20)
    job = obj(kmock, JOB, "demo")
    assert (job["spec"]["parallelism"], job["spec"]["suspend"]) == (4, False)
    assert [w["metadata"]["name"] for w in workloads(kmock, "demo")] == [first["metadata"]["name"]]
    assert kueue.did("stopped") == [] and kueue.did("deleted") == []
    # Still observed and reported as it is.
    broker["ranks"]["up"], broker["ready"] = 4, True
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Running")
    assert obj(kmock, MC, "demo")["status"]["size"] == 4


async def test_storage_with_a_queue_is_refused_not_admitted_as_two_workloads(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue,
) -> None:
    # With storage rank 0 runs in a Job of its own, which Kueue would admit apart from the other ranks.
    await create(kmock, make_body(queueName="team-a", storage={"size": "1Gi"}))
    refused = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert refused["reason"] == "InvalidSpec" and "spec.storage cannot be combined with spec.queueName" \
        in refused["message"]
    await rounds(kueue, 20)
    assert not exists(kmock, JOB, "demo") and not exists(kmock, JOB, "demo-broker")
    assert kueue.did("created") == []


async def test_the_priority_class_decides_which_minicluster_kueue_admits_first(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue,
) -> None:
    kueue.quota_pods = 0
    await create(kmock, make_body(name="low", queueName="team-a", queuePriorityClass="low"))
    await create(kmock, make_body(name="high", queueName="team-a", queuePriorityClass="high"))
    await eventually(lambda: workloads(kmock, "low") and workloads(kmock, "high"))
    assert obj(kmock, JOB, "high")["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert workloads(kmock, "high")[0]["spec"]["priorityClassName"] == "high"
    kueue.quota_pods = 4  # room for one of them
    await started(kmock, kueue, "high")
    await rounds(kueue, 20)
    assert obj(kmock, JOB, "low")["spec"]["suspend"] is True and not admitted(workloads(kmock, "low")[0])


async def test_without_kueue_installed_a_queued_minicluster_still_suspends(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    # No Workload kind on the API server: the operator suspends the Job itself, and reports no trouble.
    await create(kmock, make_body(queueName="team-a"))
    await eventually(lambda: obj(kmock, JOB, "demo"))
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo", json={"spec": {"suspend": False}}) as r:
        assert r.status < 300
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Pending")
    await patch(kmock, "demo", {"spec": {"suspend": True}})
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is True)
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Suspended")
    assert condition(obj(kmock, MC, "demo")["status"], "Reconciled")["status"] == "True"


async def test_without_the_rights_to_workloads_a_queued_minicluster_says_so(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    # An operator bound to an older role: Kueue is there, but the Workloads are forbidden to it.
    install(kmock)
    kmock[kmocklib.resource(WORKLOADS)] << 403
    await create(kmock, make_body(queueName="team-a", suspend=True))
    refused = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert refused["reason"] == "KueueForbidden" and "deploy/operator/rbac.yaml" in refused["message"]
    assert obj(kmock, JOB, "demo")["spec"]["suspend"] is True  # what the operator can do, it did


async def test_with_a_minimum_size_kueue_admits_what_fits_and_the_ranks_run_at_that_size(
    operator: None, kmock: Kmock, make_body: Make, kueue: EmulatedKueue, broker: dict[str, Any],
) -> None:
    # 8 ranks asked, at least 4, room for 6: Kueue starts the Job with 6 pods (partial admission).
    await create(kmock, make_body(queueName="team-a", size=8, maxSize=8, minSize=4))
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is False)
    job = obj(kmock, JOB, "demo")
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (6, 6)
    # The broker expects the ranks that run, and the operator keeps the Job at the size Kueue admitted.
    await eventually(lambda: "size = 6\n" in obj(kmock, "v1/configmaps", "demo-config")["data"]["config.toml"])
    broker["ranks"]["expected"] = 6
    await rounds(kueue, 20)
    assert obj(kmock, JOB, "demo")["spec"]["parallelism"] == 6
    assert kueue.did("stopped") == [] and kueue.did("deleted") == [] and len(kueue.did("created")) == 1
    mc = obj(kmock, MC, "demo")
    assert condition(mc["status"], "Reconciled")["reason"] == "ChildrenUpToDate" and mc["status"]["size"] == 8
