"""The Indexed-Job stand-in (indexed.py) against the real 1.20 control plane: kube-apiserver calls the webhook,
and kube-controller-manager's own Job controller creates the pods (which stay Pending: no node here).  Without
the stand-in, 1.20 gives these pods no index, never completes a Job on index 0 and never fails one on FailJob."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from minicluster.operator import manifests
from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.spec import INDEX_KEY, MiniCluster
from tests.e2e import endpoints
from tests.e2e.jobs import JobRules, by_job, index_of, phase
from tests.e2e.podsecurity import ENFORCE_LABEL
from tests.e2e.polling import until
from tests.operator.k8s_control_plane import (ADMIN_TOKEN, Cluster, binaries_or_skip, crd_established,
                                             serving_certificate)
from tests.realnode import indexed

# The real-node tier's stand-in, tested in that tier's step (`pytest -m realnode`), against the API server alone.
pytestmark = [pytest.mark.realnode, pytest.mark.apiserver, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MC_API = "/apis/minicluster.dev/v1alpha1"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
HOLD = "realnode.minicluster.dev/test-hold"  # a finalizer: keeps a deleted pod terminating (no kubelet here)
SIGKILLED = 137  # a failure that is not the program's (not a FailJob exit code)


NODE = "nowhere"  # bindings name it; no node exists, and none needs to for the API server to record one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    control_plane = Cluster(tmp_path_factory.mktemp("k8s"), binaries_or_skip())
    control_plane.start()
    try:
        asyncio.run(_install_crd(control_plane))
        yield control_plane
    finally:
        control_plane.stop()


def _kube(cluster: Cluster) -> Kube:
    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.server, ca_path=str(cluster.ca_path), token=ADMIN_TOKEN)
    return Kube(login)


async def _install_crd(cluster: Cluster) -> None:
    kube = _kube(cluster)
    try:
        crd = yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text())
        await kube.create(CRD, crd)
        await until(lambda: crd_established(kube, crd["metadata"]["name"]), 60)
    finally:
        await kube.close()


@pytest.fixture
async def admin(cluster: Cluster) -> AsyncIterator[Kube]:
    kube = _kube(cluster)
    yield kube
    await kube.close()


@pytest.fixture
async def stand_in(cluster: Cluster, admin: Kube, tmp_path: Path) -> AsyncIterator[indexed.JobJudge]:
    """The webhook (mutating: indexes; validating: Pod Security) and the judge, registered with the API server."""
    run_id = secrets.token_hex(3)
    ca, cert, key = serving_certificate(tmp_path, "realnode-indexed")
    judge = indexed.JobJudge(_kube(cluster), node=NODE)
    runner, port = await indexed.serve(judge.rules.kube, cert, key, judge=judge)
    stop = asyncio.Event()
    judging = asyncio.ensure_future(judge.run(stop))
    hooks = [("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
              indexed.webhook_configuration(port, ca.read_bytes(), run_id)),
             ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
              endpoints.webhook_configuration(port, ca.read_bytes(), run_id))]
    try:
        for path, hook in hooks:
            await admin.create(path, hook)
        yield judge
    finally:
        for path, hook in hooks:
            with contextlib.suppress(ApiError):
                await admin.request("DELETE", f"{path}/{hook['metadata']['name']}")
        stop.set()
        await judging
        await runner.cleanup()
        await asyncio.sleep(0.1)  # the API server's keep-alive connections, closed by cleanup, finish closing
        await judge.rules.kube.close()


async def _minicluster_job(admin: Kube, size: int, parallelism: int | None = None) -> tuple[str, str, dict[str, Any]]:
    """A restricted namespace, a MiniCluster of `size` and its ranks' Job as the operator renders it (1.20 keeps
    what it knows of it).  (namespace, name, the Job as created)"""
    namespace, name = f"idx-{secrets.token_hex(3)}", "demo"
    await admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {ENFORCE_LABEL: "restricted"}}})
    body = await admin.create(f"{MC_API}/namespaces/{namespace}/miniclusters", {
        "apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster",
        "metadata": {"name": name, "namespace": namespace},
        # A named image has the runtime injected and runs as the image's user: restricted needs runAsNonRoot said.
        "spec": {"size": size, "image": "ghcr.io/minicluster/runtime:0.1.0", "pod": {"packRanks": True},
                 "securityContext": {"runAsNonRoot": True}}})
    [job] = manifests.jobs(MiniCluster.from_body(body))
    if parallelism is not None:
        job["spec"]["parallelism"] = parallelism
    created = await admin.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    assert "completionMode" not in created["spec"]  # 1.20 dropped it: the reason for the stand-in
    return namespace, name, created


async def _pods(admin: Kube, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    listed = (await admin.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
    return by_job(listed).get(job["metadata"]["uid"], [])


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if phase(p) != "Failed" and not p["metadata"].get("deletionTimestamp")]


async def _end_pod(admin: Kube, pod: dict[str, Any], pod_phase: str, code: int) -> None:
    """What a kubelet reports when the pod's container exits with `code`."""
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    status = {"phase": pod_phase, "containerStatuses": [{
        "name": manifests.CONTAINER, "image": "ghcr.io/minicluster/runtime:0.1.0", "imageID": "", "ready": False,
        "restartCount": 0, "state": {"terminated": terminated}}]}
    meta = pod["metadata"]
    await admin.merge_patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": status})


def _conditions(job: dict[str, Any] | None) -> dict[str, str]:
    return {c["type"]: c.get("reason", "") for c in ((job or {}).get("status") or {}).get("conditions") or []
            if c.get("status") == "True"}


async def test_each_pod_gets_its_own_index_hostname_and_environment_when_it_is_created(
        stand_in: indexed.JobJudge, admin: Kube) -> None:
    namespace, name, job = await _minicluster_job(admin, size=4)
    pods = await until(lambda: _enough(admin, namespace, job, 4), 60)
    assert sorted(index_of(p) for p in pods) == [0, 1, 2, 3]
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        i = index_of(pod)
        assert meta["labels"][INDEX_KEY] == str(i)
        assert meta["name"].startswith(f"{name}-{i}-")
        assert (spec["hostname"], spec["subdomain"]) == (f"{name}-{i}", name)
        [container] = spec["containers"]
        [variable] = [e for e in container["env"] if e["name"] == "JOB_COMPLETION_INDEX"]
        assert variable["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{INDEX_KEY}']"


async def _enough(admin: Kube, namespace: str, job: dict[str, Any], count: int) -> list[dict[str, Any]] | None:
    pods = _live(await _pods(admin, namespace, job))
    return pods if len(pods) >= count and all(index_of(p) is not None for p in pods) else None


async def test_a_replacement_takes_its_predecessors_index_only_once_the_predecessor_is_gone(
        stand_in: indexed.JobJudge, admin: Kube) -> None:
    namespace, _, job = await _minicluster_job(admin, size=3)
    pods = await until(lambda: _enough(admin, namespace, job, 3), 60)
    [one] = [p for p in pods if index_of(p) == 1]
    path = f"/api/v1/namespaces/{namespace}/pods/{one['metadata']['name']}"
    await admin.merge_patch(path, {"metadata": {"finalizers": [HOLD]}})
    await admin.request("DELETE", path)

    # 1.20's Job controller makes a replacement at once; while pod 1 terminates, the stand-in gives it index 1 but
    # holds it: a scheduler no one runs, unbound.
    async def replacement() -> dict[str, Any] | None:
        return next((p for p in await _pods(admin, namespace, job)
                     if index_of(p) == 1 and p["metadata"]["uid"] != one["metadata"]["uid"]), None)
    held = await until(replacement, 60)
    assert held["spec"]["schedulerName"] == indexed.HELD_SCHEDULER
    await asyncio.sleep(5 * stand_in.period)  # rounds of the judge, which must leave it be
    assert "nodeName" not in (await replacement() or {})["spec"]

    await admin.merge_patch(path, {"metadata": {"finalizers": None}})

    async def bound() -> bool:
        pod = await replacement()
        return pod is not None and pod["spec"].get("nodeName") == NODE
    await until(bound, 30)
    pods = await until(lambda: _enough(admin, namespace, job, 3), 120)
    assert sorted(index_of(p) for p in pods) == [0, 1, 2]
    assert one["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}

    # A Failed pod (killed: not the program's failure) frees its index for its replacement.
    [two] = [p for p in pods if index_of(p) == 2]
    await _end_pod(admin, two, "Failed", SIGKILLED)

    async def replaced() -> list[dict[str, Any]] | None:
        now = await _enough(admin, namespace, job, 3)
        return now if now and two["metadata"]["uid"] not in {p["metadata"]["uid"] for p in now} else None
    pods = await until(replaced, 120)
    assert sorted(index_of(p) for p in pods) == [0, 1, 2]
    assert "Failed" not in _conditions(await admin.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/demo"))


async def test_quick_creates_get_distinct_indexes_and_none_is_given_twice(
        stand_in: indexed.JobJudge, admin: Kube) -> None:
    # parallelism 0: 1.20's Job controller makes no pods of its own; the stand-in still reads completions 3
    # from the MiniCluster.
    namespace, name, job = await _minicluster_job(admin, size=3, parallelism=0)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": f"{name}-", "namespace": namespace, **job["spec"]["template"]["metadata"],
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                             "uid": job["metadata"]["uid"], "controller": True}]},
           "spec": job["spec"]["template"]["spec"]}

    def request(dry_run: bool = False) -> dict[str, Any]:
        return {"uid": secrets.token_hex(8), "operation": "CREATE", "namespace": namespace, "object": pod,
                "dryRun": dry_run}

    indexer = indexed.Indexer(JobRules(admin))
    dry = await indexer.review(request(dry_run=True))
    answers = await asyncio.gather(*(indexer.review(request()) for _ in range(3)))
    refused = await indexer.review(request())
    given = sorted(_index_in_patch(a) for a in answers)
    assert (_index_in_patch(dry), given) == (0, [0, 1, 2])
    assert not refused["allowed"] and "no free completion index" in refused["status"]["message"]


def _index_in_patch(answer: dict[str, Any]) -> int:
    assert answer["allowed"], answer
    ops = json.loads(base64.b64decode(answer["patch"]))
    return int(next(op["value"] for op in ops if op["path"].endswith("job-completion-index")))


async def test_index_0_succeeding_completes_the_job_and_ends_the_other_pods(
        stand_in: indexed.JobJudge, admin: Kube) -> None:
    namespace, name, job = await _minicluster_job(admin, size=3)
    pods = await until(lambda: _enough(admin, namespace, job, 3), 60)
    await _end_pod(admin, next(p for p in pods if index_of(p) == 0), "Succeeded", 0)
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"

    async def complete() -> dict[str, str] | None:
        conditions = _conditions(await admin.get(path))
        rest = [p for p in await _pods(admin, namespace, job) if phase(p) not in ("Succeeded", "Failed")]
        return conditions if "Complete" in conditions and not rest else None
    conditions = await until(complete, 60)
    assert conditions["Complete"] == conditions["SuccessCriteriaMet"] == "SuccessPolicy"


async def test_a_failjob_exit_code_fails_the_job_and_ends_the_other_pods(
        stand_in: indexed.JobJudge, admin: Kube) -> None:
    namespace, name, job = await _minicluster_job(admin, size=3)
    pods = await until(lambda: _enough(admin, namespace, job, 3), 60)
    failing = next(p for p in pods if index_of(p) == 1)
    await _end_pod(admin, failing, "Failed", manifests.PROGRAM_FAILURE_CODES[0])
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"

    async def failed() -> dict[str, Any] | None:
        got = await admin.get(path)
        rest = [p for p in await _pods(admin, namespace, job) if phase(p) not in ("Succeeded", "Failed")]
        return got if "Failed" in _conditions(got) and not rest else None
    got = await until(failed, 60)
    conditions = _conditions(got)
    assert conditions["Failed"] == conditions["FailureTarget"] == "PodFailurePolicy"
    [message] = {c["message"] for c in got["status"]["conditions"] if c["type"] == "Failed"}
    assert failing["metadata"]["name"] in message


async def test_pod_security_is_enforced_from_the_same_server(stand_in: indexed.JobJudge, admin: Kube) -> None:
    namespace, _, _ = await _minicluster_job(admin, size=1, parallelism=0)

    async def account_ready() -> bool:  # 1.20's ServiceAccount admission wants the account and its token Secret
        account = await admin.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        return bool((account or {}).get("secrets"))
    await until(account_ready, 60)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # no securityContext: not "restricted"
    with pytest.raises(ApiError) as refused:
        await admin.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    assert refused.value.status == 403 and "restricted" in refused.value.message
