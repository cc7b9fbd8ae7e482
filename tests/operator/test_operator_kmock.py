"""Tier (b): the whole kopf operator in-process against kmock, kopf's mock
Kubernetes API server.  The broker's status comes from a real local HTTP
server, fetched by the production HttpStatusFetcher."""
from __future__ import annotations

import asyncio
import functools
import gc
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import aiohttp.web
import kmock as kmocklib
import kopf
import pytest

from minicluster.operator import handlers, manifests, operate
from minicluster.operator.kube import Kube
from minicluster.operator.metrics import Metrics
from minicluster.operator.spec import MiniCluster
from minicluster.operator.status import HttpStatusFetcher

MC = "minicluster.dev/v1alpha1/miniclusters"
MC_URL = "/apis/minicluster.dev/v1alpha1/namespaces/default/miniclusters"
JOB = "batch/v1/jobs"
# The labels the Job controller copies from the operator's pod template onto every pod: what its watch selects.
OWN = {"app.kubernetes.io/managed-by": "minicluster-operator"}

pytestmark = [
    # kmock 0.8 reads its bundled resources with a deprecated importlib API.
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
    # kopf 1.45 can spawn a timer for an event that arrives while it is
    # stopping; that orphan's own HTTP session (inside kopf) is never closed.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in.*(ClientSession|BaseConnector|_SelectorTransport|socket\\.socket)"
        ":pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture
async def broker() -> AsyncIterator[dict[str, Any]]:
    """A fake broker status endpoint: tests mutate the dict it serves."""
    report: dict[str, Any] = {
        "name": "demo", "size": 4, "max_size": 8,
        "ranks": {"up": 2, "unresponsive": 0, "lost": 0, "expected": 4},
        "ready": False,
        "jobs": {"queued": 3, "running": 1, "finished": 0, "failed": 0},
        "command": None,
        "_polls": 0,  # the operator's reads of it: one per poll of an active MiniCluster
    }

    async def serve(_: aiohttp.web.Request) -> aiohttp.web.Response:
        report["_polls"] += 1
        return aiohttp.web.json_response(report)

    app = aiohttp.web.Application()
    app.router.add_get("/status", serve)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    report["_port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield report
    await runner.cleanup()


@pytest.fixture
async def operator(kmock: kmocklib.KubernetesEmulator, broker: dict[str, Any]) -> AsyncIterator[None]:
    kmock.resources.load_bundled()
    kmock.resources[MC] = kmocklib.ResourceInfo(
        kind="MiniCluster", namespaced=True, shortnames={"mc", "minic"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        subresources={"status", "scale"},
    )
    server = str(kmock.url).rstrip("/")
    port = broker["_port"]

    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server)

    running: dict[str, Any] = {}

    async def main() -> None:
        running["task"], running["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        fetcher = HttpStatusFetcher(lambda mc: f"http://127.0.0.1:{port}/status")
        try:
            await operate(login=login, fetch_status=fetcher, registry=kopf.OperatorRegistry(),
                          poll_interval=0.3, metrics_port=None, stop_flag=stop, ready_flag=ready)
        except asyncio.CancelledError:
            pass  # the teardown's, below
        finally:
            await fetcher.close()

    # kopf gets its own thread and loop, as in production: on exit it waits
    # for every task its loop spawned, which would include kmock's handlers.
    stop, ready = threading.Event(), threading.Event()
    # A daemon: an operator that never stops fails its test below, and must not also hold the process at exit.
    thread = threading.Thread(target=asyncio.run, args=(main(),), name="kopf", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10)
    yield
    stop.set()
    # kopf 1.45 may leave the status timer of a MiniCluster that still exists unstopped when it exits (its stopper
    # is still unset seconds later), then waits 5 s for it as a hung task: past a second, cancel the operator.
    await asyncio.to_thread(thread.join, 1.0)
    if thread.is_alive():
        running["loop"].call_soon_threadsafe(running["task"].cancel)
    await asyncio.to_thread(thread.join, 15)
    assert not thread.is_alive()
    gc.collect()  # surface kopf's orphaned session here, under this module's filter


async def eventually(check: Callable[[], Any], timeout: float = 8.0) -> Any:
    """Poll `check` until it returns something truthy without raising."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (KeyError, AssertionError, TypeError):
            if asyncio.get_running_loop().time() > deadline:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {result!r}")
        await asyncio.sleep(0.1)


async def polls(broker: dict[str, Any], count: int = 3) -> None:
    """Wait until `count` more of the operator's polls read the broker's status: a witness that polls, each of
    which would have acted, went by (instead of a sleep that hopes they did)."""
    seen = broker["_polls"]
    await eventually(lambda: broker["_polls"] >= seen + count)


def obj(kmock: kmocklib.KubernetesEmulator, resource: str, name: str) -> dict[str, Any]:
    return kmock.objects[resource, "default", name].raw


def exists(kmock: kmocklib.KubernetesEmulator, resource: str, name: str) -> bool:
    # (Not `key in kmock.objects`: kmock keys its objects by a parsed resource, and keeps deleted ones.)
    try:
        return not kmock.objects[resource, "default", name].deleted
    except KeyError:
        return False


async def create(kmock: kmocklib.KubernetesEmulator, body: dict[str, Any]) -> None:
    async with kmock.post(MC_URL, json=body) as resp:
        assert resp.status < 300, await resp.text()


async def patch(kmock: kmocklib.KubernetesEmulator, name: str, data: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with kmock.patch(f"{MC_URL}/{name}", data=json.dumps(data), headers=headers) as resp:
        assert resp.status < 300, await resp.text()


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in status.get("conditions", []) if c["type"] == type_]
    if not found:
        raise KeyError(type_)
    return found[0]


Kmock = kmocklib.KubernetesEmulator
Make = Callable[..., dict[str, Any]]


async def test_create_makes_owned_children(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    job = await eventually(lambda: obj(kmock, JOB, "demo"))
    for resource, name in [("v1/secrets", "demo-curve"), ("v1/configmaps", "demo-config"),
                           ("v1/services", "demo"), (JOB, "demo")]:
        child = obj(kmock, resource, name)
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-demo"
    assert job["spec"]["completions"] == 4
    status = await eventually(lambda: obj(kmock, MC, "demo").get("status", {}).get("selector"))
    assert status == "minicluster.dev/name=demo"


async def test_status_comes_from_the_broker(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    await create(kmock, make_body())
    status = await eventually(lambda: obj(kmock, MC, "demo")["status"]["ranks"])
    assert status == {"joined": 2, "expected": 4, "unresponsive": 0, "lost": 0}
    mc = obj(kmock, MC, "demo")
    assert mc["status"]["phase"] == "Pending"
    assert condition(mc["status"], "Ready")["status"] == "False"
    assert mc["status"]["jobs"]["queued"] == 3

    broker["ranks"]["up"], broker["ready"] = 4, True
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Running")
    assert condition(obj(kmock, MC, "demo")["status"], "Ready")["reason"] == "AllRanksJoined"

    broker["command"] = {"state": "exited", "status": 3}
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Failed")
    failed = condition(obj(kmock, MC, "demo")["status"], "Failed")
    assert failed["status"] == "True" and "status 3" in failed["message"]


async def test_a_job_the_api_server_kept_whole_raises_no_alarm(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    # kmock keeps every field it is given, as Kubernetes 1.33 does: the cluster is supported.
    await create(kmock, make_body(storage={"size": "1Gi"}))
    await eventually(lambda: obj(kmock, JOB, "demo") and obj(kmock, JOB, "demo-broker"))
    assert obj(kmock, JOB, "demo")["spec"]["completionMode"] == "Indexed"
    reconciled = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert reconciled["reason"] == "ChildrenUpToDate"
    broker["ranks"]["up"], broker["ready"] = 4, True
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Running")
    await polls(broker)  # each checking the Jobs again
    assert obj(kmock, MC, "demo")["status"]["phase"] == "Running"
    assert (obj(kmock, JOB, "demo-broker")["spec"]["parallelism"], obj(kmock, JOB, "demo")["spec"]["parallelism"]) == (
        1, 4)
    assert not [e for e in kmock[kmocklib.resource("v1/events")]
                if e.method == "POST" and e.data["reason"] == "UnsupportedCluster"]


async def test_job_verdict_wins(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo/status", json=done) as resp:
        assert resp.status < 300
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Succeeded")


async def test_scale_patches_job_and_config(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    await patch(kmock, "demo", {"spec": {"size": 7}, "metadata": {"generation": 2}})
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["parallelism"] == 7)
    assert obj(kmock, JOB, "demo")["spec"]["completions"] == 7
    await eventually(lambda: "size = 7" in obj(kmock, "v1/configmaps", "demo-config")["data"]["config.toml"])
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["size"] == 7)


async def test_scale_beyond_max_size_is_reported(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, MC, "demo").get("status", {}).get("maxSize"))
    await patch(kmock, "demo", {"spec": {"size": 9}})
    reconciled = await eventually(
        lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["status"] == "False"
        and condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert "exceeds maxSize 8" in reconciled["message"]
    assert obj(kmock, JOB, "demo")["spec"]["parallelism"] == 4
    await eventually(lambda: any(e.data["reason"] == "InvalidSpec"
                                 for e in kmock[kmocklib.resource("v1/events")] if e.method == "POST"))


async def test_suspend_and_resume(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    await patch(kmock, "demo", {"spec": {"suspend": True}})
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is True)
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Suspended")
    await patch(kmock, "demo", {"spec": {"suspend": False}})
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is False)


async def test_queue_name_creates_a_suspended_labelled_job(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    await create(kmock, make_body(queueName="team-a"))
    job = await eventually(lambda: obj(kmock, JOB, "demo"))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Suspended")
    assert condition(obj(kmock, MC, "demo")["status"], "Suspended")["reason"] == "QueuedInKueue"
    # Kueue admits by un-suspending; the operator must not suspend it again.
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo",
                           json={"spec": {"suspend": False}}) as resp:
        assert resp.status < 300
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Pending")
    assert obj(kmock, JOB, "demo")["spec"]["suspend"] is False


async def test_foreign_object_is_left_alone(operator: None, kmock: Kmock, make_body: Make) -> None:
    foreign = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "demo-config", "namespace": "default"}, "data": {"x": "y"}}
    async with kmock.post("/api/v1/namespaces/default/configmaps", json=foreign) as resp:
        assert resp.status < 300
    await create(kmock, make_body())
    reconciled = await eventually(
        lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert reconciled["reason"] == "NotOwned"
    assert obj(kmock, "v1/configmaps", "demo-config")["data"] == {"x": "y"}
    assert ("batch/v1/jobs", "default", "demo") not in kmock.objects


async def test_no_finalizer_holds_a_deleted_minicluster(operator: None, kmock: Kmock, make_body: Make) -> None:
    # kopf puts a finalizer on every object with a timer (kopf issue #1074): with one, a MiniCluster deleted while
    # no operator runs (or with its CRD) sticks in Terminating. The status is polled without a timer.
    await create(kmock, make_body())
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Ready"))
    assert "minicluster.dev/operator" not in (obj(kmock, MC, "demo")["metadata"].get("finalizers") or [])
    async with kmock.delete(f"{MC_URL}/demo") as resp:
        assert resp.status < 300
    await eventually(lambda: kmock.objects[MC, "default", "demo"].deleted)


async def test_a_standing_problem_is_reported_once(operator: None, kmock: Kmock, make_body: Make) -> None:
    foreign = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "demo", "namespace": "default"}, "spec": {"clusterIP": "None"}}
    async with kmock.post("/api/v1/namespaces/default/services", json=foreign) as resp:
        assert resp.status < 300
    await create(kmock, make_body())
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "NotOwned")

    def reported() -> int:
        return [e.data["reason"] for e in kmock[kmocklib.resource("v1/events")]
                if e.method == "POST"].count("NotOwned")
    await eventually(reported)  # the event may trail the condition on a loaded machine
    await asyncio.sleep(0.5)  # and a second writer's (below)
    before = reported()
    # Kept: polls of a Job not ours stop before reading the broker (polls() cannot count them), and this is a
    # negative (no second report) with no later event to wait for.
    await asyncio.sleep(1.5)  # several polls, each retrying the reconcile
    # (kmock has no resourceVersion conflicts, so create and the first poll
    # may both report; a real API server makes the second writer re-read.)
    assert 1 <= before <= 2 and reported() == before


async def test_pod_template_changes_are_reported(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    await patch(kmock, "demo", {"spec": {"image": "example.org/other:2", "size": 5}})
    cond = await eventually(
        lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "TemplateImmutable"
        and condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert "Recreate the MiniCluster" in cond["message"]
    assert obj(kmock, JOB, "demo")["spec"]["parallelism"] == 5  # the size still applied
    assert obj(kmock, MC, "demo")["status"]["size"] == 5


async def test_storage_gives_rank_0_a_claim_and_a_job_and_ends_the_workers_with_it(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    await create(kmock, make_body(storage={"size": "1Gi"}))
    # The handler creates the three children one after another; each may still be on its way.
    names = ((JOB, "demo-broker"), ("v1/persistentvolumeclaims", "demo-state"), (JOB, "demo"))
    children = [await eventually(lambda r=resource, n=name: obj(kmock, r, n))  # type: ignore[misc]
                for resource, name in names]
    for child in children:
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-demo"
    durable = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "StateDurable"))
    assert (durable["status"], durable["reason"]) == ("True", "PersistentVolumeClaim")
    # Rank 0's Job is the MiniCluster's verdict; a failed broker leaves no workers behind.
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}}
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo-broker/status", json=failed) as resp:
        assert resp.status < 300
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Failed")
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"]["suspend"] is True)


@pytest.mark.parametrize("mode", ["copy", "imageVolume"])
async def test_every_job_brings_the_runtime_to_the_application_image(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any], mode: str,
) -> None:
    await create(kmock, make_body(
        image="docker.io/library/debian:bookworm", storage={"size": "1Gi"},
        runtime={"mode": mode, "image": "registry.example/runtime:2", "imagePullPolicy": "Always"},
        securityContext={"runAsUser": 1000, "runAsNonRoot": True},
        containerSecurityContext={"capabilities": {"add": ["IPC_LOCK"]}}))
    for name in ("demo-broker", "demo"):
        pod = (await eventually(functools.partial(obj, kmock, JOB, name)))["spec"]["template"]["spec"]
        [app] = pod["containers"]
        assert app["image"] == "docker.io/library/debian:bookworm"
        assert app["command"][:2] == ["/mnt/minicluster/bin/mc", "boot"]
        assert app["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 10001
        [volume] = [v for v in pod["volumes"] if v["name"] == "minicluster-runtime"]
        if mode == "copy":
            [init] = pod["initContainers"]
            assert (init["image"], init["imagePullPolicy"]) == ("registry.example/runtime:2", "Always")
            assert volume == {"name": "minicluster-runtime", "emptyDir": {}}
        else:
            assert "initContainers" not in pod
            assert volume["image"] == {"reference": "registry.example/runtime:2", "pullPolicy": "Always"}
    # What the pods were made from is recorded: the same spec raises no TemplateImmutable on the next polls.
    await polls(broker)
    assert condition(obj(kmock, MC, "demo")["status"], "Reconciled")["status"] == "True"


async def test_pods_own_reasons_reach_the_ready_condition(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "demo-3-abcde", "namespace": "default",
                        "labels": {"minicluster.dev/name": "demo", **OWN},
                        "annotations": {"batch.kubernetes.io/job-completion-index": "3"}},
           "spec": {"containers": [{"name": "minicluster", "image": "nope:1"}]},
           "status": {"phase": "Pending", "containerStatuses": [{"name": "minicluster", "state": {"waiting": {
               "reason": "ErrImagePull", "message": 'pull access denied for nope'}}}]}}
    async with kmock.post("/api/v1/namespaces/default/pods", json=pod) as resp:
        assert resp.status < 300, await resp.text()
    ready = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Ready")["reason"] == "ErrImagePull"
                             and condition(obj(kmock, MC, "demo")["status"], "Ready"))
    assert ready["message"] == "rank 3 (pod demo-3-abcde): pull access denied for nope"


async def test_an_image_the_runtime_cannot_start_in_reaches_the_ready_condition(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    # The application image lacks what the pod runs: containerd's StartError, as a kubelet writes it.
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, JOB, "demo"))
    error = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create '
             'failed: unable to start container process: exec: "/mnt/minicluster/bin/mc": '
             'stat /mnt/minicluster/bin/mc: no such file or directory: unknown')
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "demo-0-fghij", "namespace": "default",
                        "labels": {"minicluster.dev/name": "demo", **OWN},
                        "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
           "spec": {"containers": [{"name": "minicluster", "image": "debian:bookworm"}]},
           "status": {"phase": "Failed", "containerStatuses": [{
               "name": "minicluster", "ready": False, "restartCount": 0, "started": False, "image": "debian:bookworm",
               "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": error,
                                        "startedAt": "1970-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:00Z"}}}]}}
    async with kmock.post("/api/v1/namespaces/default/pods", json=pod) as resp:
        assert resp.status < 300, await resp.text()
    ready = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Ready")["reason"] == "StartError"
                             and condition(obj(kmock, MC, "demo")["status"], "Ready"))
    assert ready["message"] == f"rank 0 (pod demo-0-fghij), container minicluster: exit code 128: {error}"


async def test_a_refused_edit_does_not_freeze_the_status(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    await create(kmock, make_body())
    await eventually(lambda: obj(kmock, MC, "demo").get("status", {}).get("maxSize"))
    await patch(kmock, "demo", {"spec": {"size": 9}})  # beyond maxSize 8: refused, the pods run on
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "InvalidSpec")
    broker["ranks"]["up"], broker["ready"] = 4, True
    status = await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Running"
                              and obj(kmock, MC, "demo")["status"])
    assert condition(status, "Ready")["status"] == "True" and status["ranks"]["joined"] == 4
    assert condition(status, "Reconciled")["status"] == "False" and status["size"] == 4
    assert obj(kmock, JOB, "demo")["spec"]["parallelism"] == 4


async def test_a_job_from_an_older_operator_version_is_adopted_not_flagged(
    operator: None, kmock: Kmock, make_body: Make,
) -> None:
    # An older operator recorded the hash of the pod template it rendered, which this version renders otherwise.
    old = manifests.job(MiniCluster.from_body(make_body()))
    old["metadata"]["annotations"] = {"minicluster.dev/template-hash": "0123456789abcdef"}
    async with kmock.post("/apis/batch/v1/namespaces/default/jobs", json=old) as resp:
        assert resp.status < 300, await resp.text()
    await create(kmock, make_body())
    reconciled = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    assert reconciled["reason"] == "ChildrenUpToDate"
    annotations = obj(kmock, JOB, "demo")["metadata"]["annotations"]
    assert annotations == {manifests.SPEC_HASH: manifests.spec_hash(MiniCluster.from_body(make_body()))}
    await patch(kmock, "demo", {"spec": {"image": "example.org/other:2"}})
    await eventually(
        lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "TemplateImmutable")


async def test_a_finished_minicluster_never_runs_again(operator: None, kmock: Kmock, make_body: Make) -> None:
    await create(kmock, make_body(command=["true"]))
    await eventually(lambda: obj(kmock, JOB, "demo"))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo/status", json=done) as resp:
        assert resp.status < 300
    await eventually(lambda: obj(kmock, MC, "demo")["status"]["phase"] == "Succeeded")
    async with kmock.delete("/apis/batch/v1/namespaces/default/jobs/demo") as resp:  # a TTL controller's
        assert resp.status < 300
    # Whichever comes first: the operator says it leaves the Job gone, or it has made it again.
    await eventually(lambda: exists(kmock, JOB, "demo")
                     or condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "Finished")
    # Kept: with its Jobs gone a poll reads no broker (polls() cannot count it), and a Job made again is a
    # negative with no later event to wait for.
    await asyncio.sleep(1)  # several more polls
    assert not exists(kmock, JOB, "demo")
    assert "not made again" in condition(obj(kmock, MC, "demo")["status"], "Reconciled")["message"]
    assert obj(kmock, MC, "demo")["status"]["phase"] == "Succeeded"


async def test_a_poll_with_a_body_older_than_the_end_does_not_run_a_finished_minicluster_again(
    kmock: Kmock, make_body: Make,
) -> None:
    """kopf hands a timer the body its watch last delivered: on a loaded operator, one from before the status that
    said Succeeded. The Job, deleted after the end, must not be made again from it (it was, under a load of 15)."""
    await create(kmock, make_body(command=["true"]))
    async with kmock.patch(f"{MC_URL}/demo/status", json={"status": {"phase": "Succeeded"}}) as resp:
        assert resp.status < 300
    stale = {**obj(kmock, MC, "demo"), "status": {"phase": "Running"}}
    server = str(kmock.url).rstrip("/")

    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server)

    fetcher = HttpStatusFetcher(lambda mc: "http://127.0.0.1:9/status")
    deps = handlers.Deps(kube=Kube(login), fetch_status=fetcher, metrics=Metrics())
    try:
        await handlers._poll(deps, kopf.Body(cast(kopf.RawBody, stale)), handlers.Children(pods={}, jobs={}))
    finally:
        await deps.kube.close()
        await fetcher.close()
    assert not exists(kmock, JOB, "demo")
    assert condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "Finished"


async def test_pod_fields_reach_every_job_and_a_bad_one_is_refused_before_anything_is_made(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    await create(kmock, make_body(
        storage={"size": "1Gi"}, imagePullPolicy="IfNotPresent", workingDir="/work",
        pod={"labels": {"team": "physics"}, "imagePullSecrets": ["registry"], "priorityClassName": "high",
             "shmSize": "4Gi"},
        commands={"init": ["sh", "-c", "true"], "pre": ["true"]}, services=[{"name": "db", "image": "redis:7"}]))
    for name in ("demo-broker", "demo"):
        template = (await eventually(functools.partial(obj, kmock, JOB, name)))["spec"]["template"]
        pod = template["spec"]
        assert template["metadata"]["labels"]["team"] == "physics"
        assert pod["imagePullSecrets"] == [{"name": "registry"}] and pod["automountServiceAccountToken"] is False
        assert pod["priorityClassName"] == "high"
        assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {"labelSelector": {"matchLabels": {"minicluster.dev/name": "demo"}},
             "topologyKey": "kubernetes.io/hostname"}]
        assert [c["name"] for c in pod["initContainers"]] == ["minicluster-runtime", "minicluster-init", "db"]
        [app] = pod["containers"]
        assert (app["imagePullPolicy"], app["workingDir"]) == ("IfNotPresent", "/work")
        assert app["command"][2:4] == ["--pre", '["true"]']
    # What the pods were made from is recorded: the same spec raises no TemplateImmutable on the next polls ...
    await polls(broker)
    assert condition(obj(kmock, MC, "demo")["status"], "Reconciled")["status"] == "True"
    # ... and a change of them does.
    await patch(kmock, "demo", {"spec": {"pod": {"labels": {"team": "chemistry"}}}})
    await eventually(
        lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["reason"] == "TemplateImmutable")
    await create(kmock, make_body(name="bad", pod={"labels": {"minicluster.dev/name": "other"}}))
    refused = await eventually(lambda: kmock.objects[MC, "default", "bad"].raw["status"]["phase"] == "Invalid"
                               and condition(kmock.objects[MC, "default", "bad"].raw["status"], "Reconciled"))
    assert "spec.pod.labels: 'minicluster.dev/name' is set by the operator" in refused["message"]
    assert not exists(kmock, JOB, "bad")


async def test_phase_changes_are_events_and_progress_is_kstatus(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    def events() -> list[tuple[str, str, str]]:
        return [(e.data["type"], e.data["reason"], e.data["message"]) for e in kmock[kmocklib.resource("v1/events")]
                if e.method == "POST"]

    def state() -> dict[str, Any]:
        return obj(kmock, MC, "demo")["status"]
    await create(kmock, make_body())
    await eventually(lambda: ("Normal", "Pending") in [e[:2] for e in events()])
    reconciling = await eventually(lambda: condition(state(), "Reconciling"))
    assert (reconciling["status"], reconciling["observedGeneration"]) == ("True", 1)
    broker["ranks"]["up"], broker["ready"] = 4, True
    await eventually(lambda: ("Normal", "Running", "phase Pending -> Running (AllRanksJoined: 4/4 ranks joined)")
                     in events())
    await eventually(lambda: condition(state(), "Reconciling")["status"] == "False")
    assert all(c["observedGeneration"] == 1 for c in state()["conditions"])
    assert condition(state(), "Stalled")["status"] == "False"
    # An edit refused (size beyond maxSize): nothing progresses until the user changes the spec again.
    await patch(kmock, "demo", {"spec": {"size": 9}, "metadata": {"generation": 2}})
    stalled = await eventually(lambda: condition(state(), "Stalled")["status"] == "True"
                               and condition(state(), "Stalled"))
    assert stalled["reason"] == "InvalidSpec" and "exceeds maxSize 8" in stalled["message"]
    assert condition(state(), "Reconciled")["observedGeneration"] == 2
    broker["command"] = {"state": "exited", "status": 3}
    await eventually(lambda: [e for e in events() if e[:2] == ("Warning", "Failed")])
    assert [e[1] for e in events() if e[0] == "Normal"] == ["Pending", "Running"]


async def test_the_ttl_reaches_a_job_only_once_its_end_is_recorded(
    operator: None, kmock: Kmock, make_body: Make, broker: dict[str, Any],
) -> None:
    # Deleted by the TTL controller before the operator saw it end, the Job would be made (and run) again.
    await create(kmock, make_body(command=["true"], ttlSecondsAfterFinished=0))
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled"))
    await polls(broker)  # of the running Job
    assert "ttlSecondsAfterFinished" not in obj(kmock, JOB, "demo")["spec"]
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    async with kmock.patch("/apis/batch/v1/namespaces/default/jobs/demo/status", json=done) as resp:
        assert resp.status < 300
    await eventually(lambda: obj(kmock, JOB, "demo")["spec"].get("ttlSecondsAfterFinished") == 0)
    assert obj(kmock, MC, "demo")["status"]["phase"] == "Succeeded"


async def test_a_changed_per_rank_budget_is_reported_not_ignored(operator: None, kmock: Kmock, make_body: Make) -> None:
    # Where no CEL rule refuses the edit (before 1.25), the Job's backoffLimitPerIndex would silently stay.
    await create(kmock, make_body(failurePolicy={"backoffLimitPerRank": 2}))
    await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Reconciled")["status"] == "True")
    await patch(kmock, "demo", {"spec": {"failurePolicy": {"backoffLimitPerRank": 5, "backoffLimit": 30}}})
    stalled = await eventually(lambda: condition(obj(kmock, MC, "demo")["status"], "Stalled")["status"] == "True"
                               and condition(obj(kmock, MC, "demo")["status"], "Stalled"))
    assert stalled["reason"] == "TemplateImmutable" and "backoffLimitPerIndex 2" in stalled["message"]
    assert obj(kmock, JOB, "demo")["spec"]["backoffLimitPerIndex"] == 2
    assert obj(kmock, JOB, "demo")["spec"]["backoffLimit"] == 30  # what a Job lets change still is
