"""Tier (c) for the Jobs' failure limits and TTL and the status conventions (issue 28 items 5 and 7): what the
real 1.20 API server keeps, prunes, refuses and prints.

Its own control plane, with the TTL-after-finished controller on (alpha in 1.20, on by default from 1.21), so a
finished Job is deleted by Kubernetes itself. The operator runs with the admin token: these tests are about what
the API server does with the operator's objects, not about its RBAC (test_operator_apiserver.py checks that).
"""
from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest
import yaml

from k8s_control_plane import ADMIN_TOKEN, Cluster, binaries_or_skip, crd_established
from minicluster.operator.kube import ApiError, Kube
from test_operator_apiserver import (
    MC_PATH, REPO, REPORTS, _Broker, _finish_the_broker, _phase, _when, admin_apply, body, condition, login_as,
    running_operator, until,
)

pytestmark = pytest.mark.apiserver

TTL_GATE = "--feature-gates=TTLAfterFinished=true"
MC = MC_PATH.format(ns="default")
JOBS = "/apis/batch/v1/namespaces/default/jobs"


class TtlCluster(Cluster):
    """1.20 with the TTL-after-finished gate on in the API server (which keeps the field) and the controller
    manager (which runs the controller)."""

    def _spawn(self, name: str, args: list[str]) -> None:
        super()._spawn(name, [*args, TTL_GATE] if name == "kube-controller-manager" else args)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    control_plane = TtlCluster(tmp_path_factory.mktemp("k8s"), binaries_or_skip(), apiserver_args=(TTL_GATE,))
    control_plane.start()
    yield control_plane
    control_plane.stop()


@pytest.fixture(scope="module")
def crd_installed(cluster: Cluster) -> None:
    asyncio.run(_install(cluster))


async def _install(cluster: Cluster) -> None:
    await admin_apply(cluster, yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text()))
    kube = Kube(login_as(cluster, ADMIN_TOKEN))
    try:
        await until(lambda: crd_established(kube))
    finally:
        await kube.close()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, crd_installed: None) -> Iterator[None]:
    """The operator of namespace default, playing a Job controller with the features 1.20 lacks (check_jobs off,
    as test_operator_apiserver.py's), with REPORTS for brokers."""
    broker = ThreadingHTTPServer(("127.0.0.1", 0), _Broker)
    threading.Thread(target=broker.serve_forever, daemon=True).start()
    try:
        with running_operator(cluster, ADMIN_TOKEN, broker.server_address[1], "default", check_jobs=False):
            yield
    finally:
        broker.shutdown()
        broker.server_close()


@pytest.fixture
async def admin(cluster: Cluster, crd_installed: None) -> AsyncIterator[Kube]:
    kube = Kube(login_as(cluster, ADMIN_TOKEN))
    yield kube
    await kube.close()


@pytest.mark.parametrize("spec, field", [
    ({"failurePolicy": {"backoffLimitPerRank": -1}}, "spec.failurePolicy.backoffLimitPerRank"),
    ({"failurePolicy": {"backoffLimitPerRank": 101}}, "spec.failurePolicy.backoffLimitPerRank"),
    ({"failurePolicy": {"backoffLimit": -1}}, "spec.failurePolicy.backoffLimit"),
    ({"failurePolicy": {"backoffLimit": "ten"}}, "spec.failurePolicy.backoffLimit"),
    ({"ttlSecondsAfterFinished": -5}, "spec.ttlSecondsAfterFinished"),
])
async def test_failure_limits_are_checked_at_the_api_server(admin: Kube, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as refused:
        await admin.create(MC, body("limits", **spec))
    assert refused.value.status == 422 and field in refused.value.message


async def test_the_failure_limits_survive_pruning_and_bound_a_job_without_per_rank_budgets(
    operator: None, admin: Kube,
) -> None:
    # 1.20 drops backoffLimitPerIndex (1.29+) and maxFailedIndexes with the rest: the ranks share one budget,
    # the user's backoffLimit here, never the unlimited one that goes with per-rank budgets.
    given = {"failurePolicy": {"backoffLimitPerRank": 2, "backoffLimit": 4}, "ttlSecondsAfterFinished": 30}
    created = await admin.create(MC, body("budget", **given))
    assert {key: created["spec"][key] for key in given} == given
    job = await until(lambda: _when(lambda: admin.get(f"{JOBS}/budget"),
                                    lambda j: j is not None and j["spec"]["backoffLimit"] == 4))
    assert "backoffLimitPerIndex" not in job["spec"] and "maxFailedIndexes" not in job["spec"]
    assert "ttlSecondsAfterFinished" not in job["spec"]  # not while it runs
    await admin.create(MC, body("budget-default"))
    await until(lambda: _when(lambda: admin.get(f"{JOBS}/budget-default"),
                              lambda j: j is not None and j["spec"]["backoffLimit"] == 10))


async def test_a_job_its_ttl_deleted_is_not_made_again(operator: None, admin: Kube) -> None:
    await admin.create(MC, body("ttl", size=1, command=["true"], ttlSecondsAfterFinished=0))
    path, job_path = f"{MC}/ttl", f"{JOBS}/ttl"
    job = await until(lambda: admin.get(job_path))
    await _finish_the_broker(admin, "ttl")
    await until(lambda: _phase(admin, path, "Succeeded"))

    async def deleted_by_kubernetes() -> bool:
        again = await admin.get(job_path)
        assert again is None or again["metadata"]["uid"] == job["metadata"]["uid"], "the Job was made again"
        return again is None
    await until(deleted_by_kubernetes)
    await until(lambda: _when(lambda: _cond(admin, path, "Reconciled"), lambda c: c.get("reason") == "Finished"))
    await asyncio.sleep(2)  # several more polls
    assert await admin.get(job_path) is None
    assert (await admin.get(path))["status"]["phase"] == "Succeeded"


async def _cond(admin: Kube, path: str, type_: str) -> dict[str, Any]:
    return condition(await admin.get(path) or {}, type_)


async def _table(cluster: Cluster, path: str) -> dict[str, Any]:
    """`kubectl get`'s view: the API server's Table, with the CRD's printer columns evaluated."""
    context = ssl.create_default_context(cafile=str(cluster.ca_path))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    async with aiohttp.ClientSession() as session, session.get(
            cluster.server + path, headers=headers, ssl=context) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def test_conditions_carry_their_generation_and_kstatus_and_reason_is_printed(
    operator: None, admin: Kube, cluster: Cluster,
) -> None:
    REPORTS["default/kstat"] = {"ready": True, "ranks": {"up": 2, "expected": 2}, "jobs": {}}
    await admin.create(MC, body("kstat"))
    path = f"{MC}/kstat"
    running = await until(lambda: _phase(admin, path, "Running"))
    # The API server keeps each condition's observedGeneration (an undeclared field would be pruned).
    kinds = ("Reconciled", "Reconciling", "Stalled", "Ready", "Suspended", "Succeeded", "Failed", "StateDurable")
    assert {c["type"]: c.get("observedGeneration") for c in running["status"]["conditions"]} == dict.fromkeys(
        kinds, 1)
    assert condition(running, "Reconciling")["status"] == condition(running, "Stalled")["status"] == "False"
    table = await _table(cluster, path)
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert dict(zip(columns, table["rows"][0]["cells"], strict=True))["Reason"] == "AllRanksJoined"

    # An edit the operator refuses (a CEL rule 1.20 ignores): stalled until the user changes the spec again.
    await admin.merge_patch(path, {"spec": {"size": 5}})
    stalled = await until(lambda: _when(lambda: _cond(admin, path, "Stalled"), lambda c: c.get("status") == "True"))
    assert stalled["reason"] == "InvalidSpec" and stalled["observedGeneration"] == 2
    events = await admin.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=kstat")
    assert ("Normal", "Running") in [(e["type"], e["reason"]) for e in events["items"]]
