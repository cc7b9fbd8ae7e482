"""Tier (c): the operator against a real kube-apiserver 1.20 + etcd +
kube-controller-manager on loopback, under its own ServiceAccount and RBAC.

Run `.ci/kubernetes.sh` once to build and cache the binaries.  Kubernetes 1.20
predates Indexed Jobs, suspend, podFailurePolicy, successPolicy and CEL; the
API server drops those Job fields silently and ignores CEL rules, so these
tests check what 1.20 keeps (tier (a) checks the modern fields).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from k8s_control_plane import (ADMIN_TOKEN, Cluster, collection_path, crd_established,
                               operator_token, request_counts)
from minicluster.operator import operate
from minicluster.operator.runner import service_account_login
from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.status import HttpStatusFetcher

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
MC_PATH = "/apis/minicluster.dev/v1alpha1/namespaces/{ns}/miniclusters"

# Broker reports served over real HTTP, keyed by "namespace/name".
REPORTS: dict[str, dict[str, Any]] = {}


def login_as(cluster: Cluster, token: str) -> Callable[[], Any]:
    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.server, ca_path=str(cluster.ca_path), token=token)
    return login


async def admin_apply(cluster: Cluster, *objs: dict[str, Any]) -> None:
    kube = Kube(login_as(cluster, ADMIN_TOKEN))
    try:
        for obj in objs:
            await kube.create(collection_path(obj), obj)
    finally:
        await kube.close()


async def until(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout}s: last {result!r}")
        await asyncio.sleep(0.3)


async def service_account_token(kube: Kube) -> str:
    """The token kube-controller-manager minted for the operator's ServiceAccount."""
    return await until(lambda: operator_token(kube))


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> str:
    """CRD plus the deploy/ namespace, ServiceAccount and RBAC; returns the SA token."""
    docs = [yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text())]
    for name in ("operator/namespace.yaml", "operator/serviceaccount.yaml", "operator/rbac.yaml", "clusterwide.yaml"):
        docs += [doc for doc in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if doc]

    async def install() -> str:
        await admin_apply(cluster, *docs)
        kube = Kube(login_as(cluster, ADMIN_TOKEN))
        try:
            await until(lambda: crd_established(kube))
            return await service_account_token(kube)
        finally:
            await kube.close()
    return asyncio.run(install())


class _Broker(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        report = REPORTS.get(self.path.strip("/").removesuffix("/status"))
        body = json.dumps(report).encode()
        self.send_response(200 if report else 503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def broker_port() -> Iterator[int]:
    broker = ThreadingHTTPServer(("127.0.0.1", 0), _Broker)
    threading.Thread(target=broker.serve_forever, daemon=True).start()
    yield broker.server_address[1]
    broker.shutdown()
    broker.server_close()


@contextlib.contextmanager
def running_operator(cluster: Cluster, token: str, port: int, namespace: str, check_jobs: bool) -> Iterator[None]:
    """The operator for one namespace, logged in with its ServiceAccount token, in its own thread."""
    stop, ready = threading.Event(), threading.Event()

    async def main() -> None:
        fetcher = HttpStatusFetcher(lambda mc: f"http://127.0.0.1:{port}/{mc.namespace}/{mc.name}/status")
        try:
            await operate(namespace, login=login_as(cluster, token), fetch_status=fetcher, poll_interval=0.5,
                          registry=kopf.OperatorRegistry(), metrics_port=None,
                          stop_flag=stop, ready_flag=ready, check_jobs=check_jobs)
        finally:
            await fetcher.close()

    # A daemon: an operator that never stops fails below, and must not also hold the test process at exit.
    thread = threading.Thread(target=asyncio.run, args=(main(),), name=f"kopf-{namespace}", daemon=True)
    thread.start()
    assert ready.wait(30)
    yield
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), f"the operator of {namespace} did not stop in 30 s"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, installed: str, broker_port: int) -> Iterator[None]:
    """The operator of namespace default, as on a cluster whose Job controller had the features the 1.20 API
    server drops (these tests play the kubelet and the Job's outcome themselves): it does not check for them."""
    with running_operator(cluster, installed, broker_port, "default", check_jobs=False):
        yield


LEGACY = "legacy"


@pytest.fixture(scope="module")
def checking_operator(cluster: Cluster, installed: str, broker_port: int) -> Iterator[None]:
    """The operator as shipped (it checks what the API server kept of its Jobs), for namespace LEGACY."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEGACY}}
    asyncio.run(admin_apply(cluster, namespace))
    with running_operator(cluster, installed, broker_port, LEGACY, check_jobs=True):
        yield


@pytest.fixture
async def admin(cluster: Cluster, installed: str) -> AsyncIterator[Kube]:
    kube = Kube(login_as(cluster, ADMIN_TOKEN))
    yield kube
    await kube.close()


def body(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster",
            "metadata": {"name": name},
            "spec": {"size": 2, "maxSize": 4, "image": "example.org/minicluster:0.1.0", **spec}}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


async def test_crd_defaults_and_printer_columns(admin: Kube) -> None:
    created = await admin.create(MC_PATH.format(ns="default"), body("defaults"))
    assert created["spec"]["fanout"] == 32 and created["spec"]["policy"] == "first-fit"
    crd = await admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/miniclusters.minicluster.dev")
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Size", "Joined", "Phase", "Ready"]


@pytest.mark.parametrize("spec, message", [
    ({"size": 0}, "spec.size"),
    ({"policy": "random"}, "spec.policy"),
    ({"image": ""}, "spec.image"),
    ({"logging": {"level": "loud"}}, "spec.logging.level"),
    ({"pod": {"shmSize": "lots"}}, "spec.pod.shmSize"),
    ({"commands": {"pre": "echo hi"}}, "spec.commands.pre"),
    ({"queueName": "team a"}, "spec.queueName"),
    ({"storage": {"size": "0Gi"}}, "spec.storage.size"),
])
async def test_schema_refuses_bad_specs(admin: Kube, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as refused:
        await admin.create(MC_PATH.format(ns="default"), body("bad", **spec))
    assert refused.value.status == 422
    assert message in refused.value.message


async def test_the_pod_fields_are_kept_whole(admin: Kube) -> None:
    # A structural schema prunes what it does not declare: every pod field must survive the API server (resources'
    # claims among them, which an earlier schema dropped without a word).
    fields = {"pod": {"labels": {"team": "a"}, "annotations": {"example.com/x": "y z"}, "imagePullSecrets": ["r"],
                      "priorityClassName": "p", "schedulerName": "s", "runtimeClassName": "r", "shmSize": "2Gi",
                      "packRanks": True},
              "imagePullPolicy": "Never", "workingDir": "/w",
              "commands": {"init": ["sh", "-c", "true"], "pre": ["true"], "post": ["true"]},
              "services": [{"name": "db", "image": "redis:7", "ports": [{"containerPort": 6379}]}],
              "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}
    created = await admin.create(MC_PATH.format(ns="default"), body("podfields", **fields))
    assert {key: created["spec"][key] for key in fields} == fields


async def test_operator_creates_owned_children_and_reports_status(operator: None, admin: Kube) -> None:
    REPORTS["default/alpha"] = {"name": "alpha", "size": 2, "max_size": 4, "ready": True,
                                "ranks": {"up": 2, "unresponsive": 0, "lost": 0, "expected": 2},
                                "jobs": {"queued": 0, "running": 1, "finished": 5, "failed": 0},
                                "command": None}
    mc = await admin.create(MC_PATH.format(ns="default"), body("alpha", topology="zone=topology.kubernetes.io/zone"))
    job = await until(lambda: admin.get("/apis/batch/v1/namespaces/default/jobs/alpha"))
    for path in ("/api/v1/namespaces/default/secrets/alpha-curve",
                 "/api/v1/namespaces/default/configmaps/alpha-config",
                 "/api/v1/namespaces/default/services/alpha"):
        child = await admin.get(path)
        assert child["metadata"]["ownerReferences"][0]["uid"] == mc["metadata"]["uid"]
    assert job["metadata"]["ownerReferences"][0]["uid"] == mc["metadata"]["uid"]
    # Fields Kubernetes 1.20 knows survive; completionMode & co. do not exist there.
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert job["spec"]["template"]["spec"]["subdomain"] == "alpha"
    assert "completionMode" not in job["spec"]
    # spec.topology survives the CRD's pruning, and the API server takes the pod's own label as a rank's level.
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "MC_TOPOLOGY_0", "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}} in container["env"]

    async def running() -> dict[str, Any] | None:
        obj = await admin.get(f"{MC_PATH.format(ns='default')}/alpha")
        return obj if obj.get("status", {}).get("phase") == "Running" else None
    obj = await until(running)
    assert condition(obj, "Ready")["status"] == "True"
    assert obj["status"]["ranks"]["joined"] == 2 and obj["status"]["jobs"]["finished"] == 5
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]


async def test_scale_subresource(operator: None, admin: Kube) -> None:
    await admin.create(MC_PATH.format(ns="default"), body("scaly"))
    path = f"{MC_PATH.format(ns='default')}/scaly"
    await until(lambda: admin.get("/apis/batch/v1/namespaces/default/jobs/scaly"))

    async def selector() -> str | None:
        return (await admin.get(f"{path}/scale") or {}).get("status", {}).get("selector")
    assert await until(selector) == "minicluster.dev/name=scaly"
    scale = await admin.get(f"{path}/scale")
    assert scale["spec"]["replicas"] == 2
    scale["spec"]["replicas"] = 3
    await admin.request("PUT", f"{path}/scale", scale)
    assert (await admin.get(path))["spec"]["size"] == 3

    # 1.20 Jobs have immutable completions (elastic Indexed Jobs came in 1.27):
    # the refusal must surface on the MiniCluster, not vanish in a log.
    async def refused() -> dict[str, Any]:
        return condition(await admin.get(path), "Reconciled")
    cond = await until(lambda: _when(refused, lambda c: c.get("reason") == "Rejected"))
    assert "immutable" in cond["message"]
    config = await admin.get("/api/v1/namespaces/default/configmaps/scaly-config")
    assert "size = 2" in config["data"]["config.toml"]  # the broker is not told about ranks that never come


async def _when(get: Callable[[], Any], ok: Callable[[Any], bool]) -> Any:
    value = await get()
    return value if ok(value) else None


async def test_spec_beyond_schema_is_reported_not_dropped(operator: None, admin: Kube) -> None:
    # size > maxSize is a CEL rule, which 1.20 ignores: the operator must say so.
    await admin.create(MC_PATH.format(ns="default"), body("toobig", size=5, maxSize=4))
    path = f"{MC_PATH.format(ns='default')}/toobig"
    cond = await until(lambda: _when(lambda: _cond(admin, path, "Reconciled"),
                                     lambda c: c.get("reason") == "InvalidSpec"))
    assert "exceeds maxSize 4" in cond["message"]
    assert (await admin.get(path))["status"]["phase"] == "Invalid"

    async def reported() -> int:
        events = await admin.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=toobig")
        return [e["reason"] for e in events["items"]].count("InvalidSpec")
    await until(reported)
    await asyncio.sleep(1)
    assert await reported() == 1
    assert await admin.get("/apis/batch/v1/namespaces/default/jobs/toobig") is None


async def test_foreign_object_is_reported_once_and_left_alone(operator: None, admin: Kube) -> None:
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken"},
               "spec": {"ports": [{"port": 80}]}}
    await admin.create("/api/v1/namespaces/default/services", foreign)
    await admin.create(MC_PATH.format(ns="default"), body("taken"))
    path = f"{MC_PATH.format(ns='default')}/taken"
    await until(lambda: _when(lambda: _cond(admin, path, "Reconciled"),
                              lambda c: c.get("reason") == "NotOwned"))
    await asyncio.sleep(2)  # the poller retries, but must not repeat the event
    events = await admin.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=taken")
    assert [e["reason"] for e in events["items"]].count("NotOwned") == 1
    service = await admin.get("/api/v1/namespaces/default/services/taken")
    assert "ownerReferences" not in service["metadata"] and service["spec"]["ports"][0]["port"] == 80


async def _cond(admin: Kube, path: str, type_: str) -> dict[str, Any]:
    return condition(await admin.get(path) or {}, type_)


async def test_job_completion_from_pod_phases(operator: None, admin: Kube) -> None:
    await admin.create(MC_PATH.format(ns="default"), body("batchy", size=1, command=["true"]))
    await _finish_the_broker(admin, "batchy")
    path = f"{MC_PATH.format(ns='default')}/batchy"
    cond = await until(lambda: _when(lambda: _cond(admin, path, "Succeeded"),
                                     lambda c: c.get("status") == "True"))
    assert cond["reason"] == "BrokerSucceeded"


async def _finish_the_broker(admin: Kube, name: str) -> None:
    """No kubelet: play its part and report rank 0's container as done (size 1: the Job completes)."""
    selector = f"minicluster.dev/name={name}"

    async def pods() -> list[dict[str, Any]]:
        return (await admin.get(f"/api/v1/namespaces/default/pods?labelSelector={selector}"))["items"]
    [pod] = await until(pods)
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [{
        "name": "minicluster", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
    await admin.request("PUT", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/status", pod)


async def _phase(admin: Kube, path: str, phase: str) -> dict[str, Any] | None:
    obj = await admin.get(path) or {}
    return obj if obj.get("status", {}).get("phase") == phase else None


async def test_a_refused_scale_leaves_the_status_live(operator: None, admin: Kube) -> None:
    # Made without maxSize, so its size is fixed; 1.20 ignores the CEL rules that refuse the scale, the operator
    # refuses it and goes on reporting the MiniCluster as it runs.
    fixed = body("fixed", size=1, command=["true"])
    del fixed["spec"]["maxSize"]
    await admin.create(MC_PATH.format(ns="default"), fixed)
    path = f"{MC_PATH.format(ns='default')}/fixed"
    await until(lambda: _when(lambda: admin.get(path), lambda o: (o.get("status") or {}).get("maxSize") == 1))
    for _ in range(10):  # the operator writes the status meanwhile: a PUT of a stale resourceVersion gets 409
        scale = await admin.get(f"{path}/scale")
        scale["spec"]["replicas"] = 2
        try:
            await admin.request("PUT", f"{path}/scale", scale)
            break
        except ApiError as exc:
            if exc.status != 409:
                raise
    else:
        raise AssertionError("the scale was never written: 409 ten times")
    cond = await until(lambda: _when(lambda: _cond(admin, path, "Reconciled"),
                                     lambda c: c.get("reason") == "InvalidSpec"))
    assert "exceeds maxSize 1" in cond["message"]
    REPORTS["default/fixed"] = {"ready": True, "ranks": {"up": 1, "expected": 1}, "jobs": {}}
    running = await until(lambda: _phase(admin, path, "Running"))
    assert condition(running, "Ready")["status"] == "True" and running["status"]["size"] == 1
    await _finish_the_broker(admin, "fixed")
    done = await until(lambda: _phase(admin, path, "Succeeded"))
    assert condition(done, "Reconciled")["reason"] == "InvalidSpec"
    assert (await admin.get("/apis/batch/v1/namespaces/default/jobs/fixed"))["spec"]["parallelism"] == 1


async def test_a_finished_minicluster_is_not_run_again(operator: None, admin: Kube) -> None:
    await admin.create(MC_PATH.format(ns="default"), body("once", size=1, command=["true"]))
    path = f"{MC_PATH.format(ns='default')}/once"
    job_path = "/apis/batch/v1/namespaces/default/jobs/once"
    await _finish_the_broker(admin, "once")
    await until(lambda: _phase(admin, path, "Succeeded"))
    job = await admin.get(job_path)
    # As a TTL controller would; the Job's pods go with it (background propagation, the garbage collector).
    await admin.request("DELETE", f"{job_path}?propagationPolicy=Background")

    async def noticed() -> Any:
        # Whichever comes first: the operator says it leaves the Jobs gone, or it has made one again.
        again = await admin.get(job_path)
        if again is not None and again["metadata"]["uid"] != job["metadata"]["uid"]:
            return again
        return await _when(lambda: _cond(admin, path, "Reconciled"), lambda c: c.get("reason") == "Finished")
    await until(noticed)
    await asyncio.sleep(2)  # several more polls
    again = await admin.get(job_path)
    assert again is None, f"the Job was made again (uid {again['metadata']['uid']}, was {job['metadata']['uid']})"
    assert "not made again" in condition(await admin.get(path), "Reconciled")["message"]
    assert (await admin.get(path))["status"]["phase"] == "Succeeded"


async def test_status_comes_from_watches_not_a_pod_list_per_minicluster(
    operator: None, admin: Kube, cluster: Cluster,
) -> None:
    """Issue 28 item 6: the operator watches its own pods once for all MiniClusters; its polls (every 0.5 s here)
    LIST no pods, however many MiniClusters there are, and a pod's change still reaches the status."""
    names = [f"watched-{i}" for i in range(3)]
    for name in names:
        await admin.create(MC_PATH.format(ns="default"), body(name))

    async def pods_of(name: str) -> list[dict[str, Any]]:
        found = await admin.get(f"/api/v1/namespaces/default/pods?labelSelector=minicluster.dev/name={name}")
        return (found or {}).get("items") or []

    async def all_reported() -> bool:
        reported = [condition(await admin.get(f"{MC_PATH.format(ns='default')}/{n}") or {}, "Ready") for n in names]
        return all(reported) and all([len(await pods_of(n)) == 2 for n in names])
    await until(all_reported)
    before = await asyncio.to_thread(request_counts, cluster)
    await asyncio.sleep(3)  # about 6 polls of each of the 3 (and of the module's other MiniClusters)
    after = await asyncio.to_thread(request_counts, cluster)
    # A pod LIST per MiniCluster and poll would be 18 and more; the watch may at most re-list once.
    assert after[("LIST", "pods")] - before[("LIST", "pods")] <= 1, after - before
    [pod, _] = await pods_of("watched-1")
    pod["status"] = {"phase": "Pending", "containerStatuses": [{
        "name": "minicluster", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}]}
    await admin.request("PUT", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/status", pod)
    path = f"{MC_PATH.format(ns='default')}/watched-1"
    ready = await until(lambda: _when(lambda: _cond(admin, path, "Ready"), lambda c: c.get("reason") == "ErrImagePull"))
    assert "pull access denied" in ready["message"]


async def test_no_finalizer_holds_a_minicluster(operator: None, admin: Kube) -> None:
    """kopf puts a finalizer on every object that has a kopf timer (kopf issue #1074): a MiniCluster deleted while
    no operator runs, or with its CRD, would stick in Terminating. The operator polls without one."""
    await admin.create(MC_PATH.format(ns="default"), body("unheld"))
    path = f"{MC_PATH.format(ns='default')}/unheld"
    reported = await until(lambda: _when(lambda: admin.get(path), lambda mc: bool(condition(mc or {}, "Ready"))))
    await asyncio.sleep(1)  # more polls: none adds one either
    assert not (await admin.get(path) or {})["metadata"].get("finalizers"), reported["metadata"]


async def test_delete_garbage_collects_children(operator: None, admin: Kube) -> None:
    await admin.create(MC_PATH.format(ns="default"), body("gone"))
    await until(lambda: admin.get("/apis/batch/v1/namespaces/default/jobs/gone"))
    await admin.request("DELETE", f"{MC_PATH.format(ns='default')}/gone")

    async def collected() -> bool:
        paths = ["/apis/batch/v1/namespaces/default/jobs/gone", "/api/v1/namespaces/default/services/gone",
                 "/api/v1/namespaces/default/configmaps/gone-config",
                 "/api/v1/namespaces/default/secrets/gone-curve", f"{MC_PATH.format(ns='default')}/gone"]
        return all([await admin.get(p) is None for p in paths])
    await until(collected, timeout=60)


async def test_operator_rbac_is_least_privilege(cluster: Cluster, installed: str) -> None:
    kube = Kube(login_as(cluster, installed))
    try:
        assert await kube.get("/apis/batch/v1/namespaces/default/jobs/nothing-here") is None
        assert (await kube.get("/api/v1/namespaces/default/pods"))["items"] is not None  # read-only access
        for method, path in [("DELETE", "/api/v1/namespaces/default/pods/anything"),
                             ("POST", "/api/v1/namespaces/default/pods"),
                             # Only an operator outside the cluster needs the pod proxy (deploy/outside-cluster.yaml).
                             ("GET", "/api/v1/namespaces/default/pods/anything:8051/proxy/status"),
                             ("GET", "/api/v1/nodes"),
                             ("DELETE", "/apis/batch/v1/namespaces/default/jobs/anything"),
                             ("GET", "/api/v1/namespaces/default/secrets")]:
            with pytest.raises(ApiError) as refused:
                await kube.request(method, path)
            assert refused.value.status == 403, (method, path)
    finally:
        await kube.close()


async def test_a_cluster_without_indexed_jobs_is_reported_at_once(checking_operator: None, admin: Kube) -> None:
    # The 1.20 API server drops completionMode & co. from the Job; without an index every pod would exit 2
    # ("no rank") and be replaced until the backoff limit, while the MiniCluster said only BrokerUnreachable.
    await admin.create(MC_PATH.format(ns=LEGACY), body("old", size=3))
    path = f"{MC_PATH.format(ns=LEGACY)}/old"
    job_path = f"/apis/batch/v1/namespaces/{LEGACY}/jobs/old"

    async def unsupported() -> dict[str, Any] | None:
        obj = await admin.get(path) or {}
        return obj if obj.get("status", {}).get("phase") == "Unsupported" else None
    obj = await until(unsupported)
    ready, reconciled = condition(obj, "Ready"), condition(obj, "Reconciled")
    assert (ready["status"], ready["reason"]) == ("False", "UnsupportedCluster")
    assert reconciled["reason"] == "UnsupportedCluster" and reconciled["message"] == ready["message"]
    message = ready["message"]
    assert "Kubernetes v1.20.2" in message and "completionMode, suspend, podFailurePolicy, successPolicy" in message
    assert "no Indexed Jobs" in message and "Kubernetes 1.31 or newer" in message
    # The Job stays (evidence; the operator deletes nothing) but runs no pod: the controller removes what it made.
    job = await admin.get(job_path)
    assert job["spec"]["parallelism"] == 0 and job["spec"]["completions"] == 3

    async def no_pods() -> bool:
        pods = await admin.get(f"/api/v1/namespaces/{LEGACY}/pods?labelSelector=minicluster.dev/name=old")
        return not [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    await until(no_pods)

    async def reported() -> int:
        events = await admin.get(f"/api/v1/namespaces/{LEGACY}/events?fieldSelector=involvedObject.name=old")
        return [e["reason"] for e in events["items"]].count("UnsupportedCluster")
    await until(reported)
    await asyncio.sleep(2)  # several polls: the verdict stands, is said once, and the Job is not made again
    assert await reported() == 1
    assert (await admin.get(path))["status"]["phase"] == "Unsupported"
    assert (await admin.get(job_path))["metadata"]["uid"] == job["metadata"]["uid"]
    # A size change does not wake the Job (1.20 refuses new completions anyway): the verdict stays.
    await admin.merge_patch(path, {"spec": {"size": 2}})
    await asyncio.sleep(2)
    assert (await admin.get(job_path))["spec"]["parallelism"] == 0
    assert condition(await admin.get(path), "Reconciled")["reason"] == "UnsupportedCluster"


async def test_in_cluster_login_needs_no_cluster_dns(cluster: Cluster, installed: str, tmp_path: Path) -> None:
    # A pod's service-account files and the kubelet's KUBERNETES_SERVICE_* variables; no resolver knows
    # kubernetes.default.svc here, as in a cluster without DNS (kopf's own login dials that name).
    (tmp_path / "token").write_text(installed + "\n")
    (tmp_path / "namespace").write_text("minicluster-system")
    (tmp_path / "ca.crt").write_bytes(cluster.ca_path.read_bytes())
    info = service_account_login(tmp_path, {"KUBERNETES_SERVICE_HOST": cluster.address,
                                            "KUBERNETES_SERVICE_PORT": str(cluster.port)})
    assert info is not None and info.server == cluster.server and info.default_namespace == "minicluster-system"

    async def login() -> kopf.ConnectionInfo:
        return info
    kube = Kube(login)
    try:
        assert (await kube.get("/api/v1/namespaces/default/pods"))["items"] is not None  # as the operator's SA
    finally:
        await kube.close()
    assert service_account_login(tmp_path, {}) is None  # not in a pod: the kubeconfig is next
