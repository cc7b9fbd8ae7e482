"""The MiniCluster's own pods, run on an emulated node against the real API server (conftest.py, node.py).

The interactive MiniCluster `demo` lives in a namespace that enforces Pod Security "restricted"; the tests on it
run in file order and each leaves it Ready again, except the last, which deletes it.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from minicluster import exitcodes
from minicluster.operator.kube import Kube
from minicluster.operator.spec import MiniCluster
from minicluster.operator.status import ProxyStatusFetcher
from minicluster.runtime import RUNTIME_ROOT
from tests.operator.k8s_control_plane import collection_path, operator_token
from tests.e2e import install
from tests.e2e.conftest import (
    ADMIN_TOKEN, MC_API, REPO, Env, _login, kubectl_exec, make_namespace, minicluster, until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]
INDEX = "batch.kubernetes.io/job-completion-index"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# --- helpers -------------------------------------------------------------------------------------------------


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


async def get_mc(admin: Kube, ns: str, name: str) -> dict[str, Any]:
    return await admin.get(f"{MC_API}/namespaces/{ns}/miniclusters/{name}") or {}


async def wait_condition(admin: Kube, ns: str, name: str, type_: str, status: str = "True",
                         timeout: float = 90, reason: str | None = None) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        cond = condition(await get_mc(admin, ns, name), type_)
        ok = cond.get("status") == status and (reason is None or cond.get("reason") == reason)
        return cond if ok else None
    try:
        return await until(check, timeout)
    except AssertionError:
        status_now = (await get_mc(admin, ns, name)).get("status", {})
        raise AssertionError(f"{ns}/{name}: no {type_}={status} ({reason}) in {timeout}s; "
                             f"phase {status_now.get('phase')}, conditions {status_now.get('conditions')}") from None


async def pods(admin: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    return (await admin.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=minicluster.dev/name={name}"))["items"]


async def running_pod(admin: Kube, ns: str, name: str, index: int, role: str | None = None,
                      other_than: dict[str, Any] | None = None) -> dict[str, Any]:
    """The running pod of rank `index` (or `role`): not terminating, and not `other_than`, an ended one whose
    status the node may not have written yet."""
    async def check() -> dict[str, Any] | None:
        for pod in await pods(admin, ns, name):
            meta = pod["metadata"]
            if other_than is not None and meta["uid"] == other_than["metadata"]["uid"]:
                continue
            mine = ((meta.get("labels") or {}).get("minicluster.dev/role") == role if role
                    else (meta.get("annotations") or {}).get(INDEX) == str(index))
            if mine and pod["status"].get("phase") == "Running" and not meta.get("deletionTimestamp"):
                return pod
        return None
    return await until(check, 90)


async def _absent(admin: Kube, path: str) -> bool:
    return await admin.get(path) is None


def exit_code_of(pod: dict[str, Any]) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if ended:
            return int(ended["exitCode"])
    return None


def kubectl_mc(e2e: Env, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl-mc", "--kubeconfig", str(e2e.kubeconfig), "-n", ns, *args],
                          capture_output=True, text=True, timeout=120)


async def exec_in(e2e: Env, ns: str, pod: dict[str, Any], *argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(kubectl_exec, e2e, ns, pod["metadata"]["name"], list(argv))


async def create(admin: Kube, body: dict[str, Any]) -> None:
    await admin.create(f"{MC_API}/namespaces/{body['metadata']['namespace']}/miniclusters", body)


# --- the interactive MiniCluster -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(e2e: Env) -> Iterator[str]:
    async def setup() -> str:
        admin = Kube(_login(e2e.cluster, ADMIN_TOKEN))
        try:
            ns = await make_namespace(admin, e2e.namespace("main"))
            t0 = time.monotonic()
            # A 1-CPU limit per pod on this 2-core node; requests small enough that a real scheduler places all.
            await create(admin, minicluster(e2e, "demo", ns,
                                            resources={"limits": {"cpu": "1"}, "requests": {"cpu": "100m"}}))
            await wait_condition(admin, ns, "demo", "Ready")
            e2e.timings["ready_3_of_3_s"] = time.monotonic() - t0
            return ns
        finally:
            await admin.close()
    yield asyncio.run(setup())


async def test_the_operator_runs_as_its_deployments_pod_and_reaches_brokers_by_dns(
        e2e: Env, admin: Kube, demo: str) -> None:
    # `demo` became Ready through this operator: installed by `kubectl apply -k deploy/`, its pod made by the
    # controller-manager (Deployment -> ReplicaSet -> Pod) and run on the node.
    pod = await install.operator_pod(admin)
    assert pod is not None and pod["spec"]["nodeName"] == e2e.node.name
    [rs_ref] = pod["metadata"]["ownerReferences"]
    rs = await admin.get(f"/apis/apps/v1/namespaces/{install.NAMESPACE}/replicasets/{rs_ref['name']}")
    assert rs is not None and rs["metadata"]["ownerReferences"][0]["name"] == "minicluster-operator"
    name = pod["metadata"]["name"]
    code, out, err = await asyncio.to_thread(
        kubectl_exec, e2e, install.NAMESPACE, name,
        ["sh", "-c", "id -u; echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; cd " + SA_DIR
         + " && cat namespace && echo && echo $(ls) && cat token; echo; touch /written 2>&1; cat /proc/1/cmdline"],
        container="operator")
    assert code == 0, err
    uid, service, namespace, files, token, touched, cmdline = out.splitlines()
    assert uid == "10001" and service == e2e.kubernetes_service
    # The ServiceAccount admission plugin's token volume, from the token controller's Secret.
    assert (namespace, files.split()) == (install.NAMESPACE, ["ca.crt", "namespace", "token"])
    assert token == await operator_token(admin, install.NAMESPACE)
    assert "Read-only file system" in touched  # readOnlyRootFilesystem
    assert cmdline.split("\0")[:3] == ["python", "-m", "minicluster.operator"]  # the image's ENTRYPOINT is PID 1
    # Outside-the-cluster access (the pod proxy) is not granted by deploy/, so Ready came by the brokers' DNS names.
    review = await admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{install.NAMESPACE}:minicluster-operator",
                 "resourceAttributes": {"verb": "get", "resource": "pods", "subresource": "proxy",
                                        "namespace": demo}}})
    assert review["status"]["allowed"] is False


async def test_pods_pass_restricted_run_as_the_image_user_and_read_the_key(e2e: Env, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    code, out, err = await exec_in(e2e, demo, broker, "sh", "-c",
                                   "id -u; id -g; id -G; stat -L -c '%a %u %g' /etc/minicluster/curve/curve.key_secret;"
                                   " echo $$; cat /proc/1/cmdline | tr '\\0' ' '")
    assert code == 0, err
    uid, gid, groups, key, _shell, pid1 = out.splitlines()
    assert (uid, gid) == ("10001", "10001") and "10001" in groups.split()
    # The Secret item is 0400 and root's; fsGroup gives the image user's group read access (0440 root:10001).
    assert key == "440 0 10001"
    assert " boot " in pid1 and "python" in pid1.split()[0]  # mc boot is the container's PID 1


async def test_kubectl_exec_mc_submit_works_as_documented(e2e: Env, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    # docs/operator.md: kubectl exec -it $BROKER -- mc-submit -N 3 hostname; then mc jobs.
    code, out, err = await exec_in(e2e, demo, broker, "mc-submit", "-N", "3", "--wait", "hostname")
    assert code == 0, err
    code, out, err = await exec_in(e2e, demo, broker, "mc", "run", "-N", "3", "hostname")
    assert code == 0, err
    assert sorted(out.split()) == ["demo-0", "demo-1", "demo-2"]


async def test_kubectl_mc_plugin_finds_the_broker(e2e: Env, demo: str) -> None:
    run = await asyncio.to_thread(kubectl_mc, e2e, demo, "run", "demo", "-N", "3", "hostname")
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.split()) == ["demo-0", "demo-1", "demo-2"]
    submitted = await asyncio.to_thread(kubectl_mc, e2e, demo, "submit", "demo", "--", "sh", "-c", "exit 3")
    assert submitted.returncode == 0 and submitted.stdout.strip().isdigit(), submitted.stderr
    failing = await asyncio.to_thread(kubectl_mc, e2e, demo, "exec", "demo", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7  # the remote status comes back
    missing = await asyncio.to_thread(kubectl_mc, e2e, demo, "jobs", "nosuch")
    assert missing.returncode == 1 and "not found" in missing.stderr


async def test_cpu_limit_is_what_each_rank_advertises(e2e: Env, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    code, out, err = await exec_in(e2e, demo, broker, "mc", "resources", "--json")
    assert code == 0, err
    assert [r["cores_total"] for r in json.loads(out)["ranks"]] == [1, 1, 1]  # limits.cpu "1", not the node's 2


async def orphans_ended(e2e: Env, namespace: str, pod: dict[str, Any], alive: str) -> bool:
    _, out, _ = await exec_in(e2e, namespace, pod, "sh", "-c", alive)
    return out.strip() == "0"


async def test_pid_1_reaps_orphans_in_every_pod(e2e: Env, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    code, _, err = await exec_in(e2e, demo, broker, "mc", "run", "-N", "3", "sh", "-c",
                                 "for i in 1 2 3; do sleep 0.2 & done; exit 0")
    assert code == 0, err
    # The orphans' `sleep` ends after 0.2 s: once none is alive (its state not Z), each left a zombie unless
    # PID 1 reaped it.
    alive = "grep -L '^State:.*Z' $(grep -l '^Name:.*sleep' /proc/[0-9]*/status 2>/dev/null) /dev/null | grep -vc null"
    count = "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"
    for index in range(3):
        pod = await running_pod(admin, demo, "demo", index)
        await until(lambda pod=pod: orphans_ended(e2e, demo, pod, alive), 30)
        code, out, err = await exec_in(e2e, demo, pod, "sh", "-c", count)
        assert (code, out.strip()) == (0, "0"), f"zombies in rank {index}'s pod: {out} {err}"


async def test_a_crashed_worker_comes_back_at_its_rank(e2e: Env, admin: Kube, demo: str) -> None:
    worker = await running_pod(admin, demo, "demo", 2)
    t0 = time.monotonic()
    ended = e2e.watch_exit_code(demo, worker)
    e2e.on_node(lambda: e2e.node.kill(demo, worker["metadata"]["name"]))
    assert await ended == 137  # killed: counts against backoffLimit, retried
    await running_pod(admin, demo, "demo", 2, other_than=worker)
    e2e.timings["crashed_worker_replaced_s"] = time.monotonic() - t0
    await wait_condition(admin, demo, "demo", "Ready")
    run = await asyncio.to_thread(kubectl_mc, e2e, demo, "run", "demo", "-N", "3", "hostname")
    assert sorted(run.stdout.split()) == ["demo-0", "demo-1", "demo-2"], run.stderr


async def test_an_evicted_worker_exits_as_a_disruption_and_rejoins(e2e: Env, admin: Kube, demo: str) -> None:
    worker = await running_pod(admin, demo, "demo", 1)
    name = worker["metadata"]["name"]
    # Kubernetes >= 1.26 marks an evicted pod DisruptionTarget (the podFailurePolicy's Ignore rule); 1.20 does not.
    disruption = {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                                             "reason": "EvictionByEvictionAPI"}]}}
    await admin.request("PATCH", f"/api/v1/namespaces/{demo}/pods/{name}/status", disruption,
                        "application/strategic-merge-patch+json")
    ended = e2e.watch_exit_code(demo, worker)
    await admin.create(f"/api/v1/namespaces/{demo}/pods/{name}/eviction",
                       {"apiVersion": "policy/v1beta1", "kind": "Eviction",
                        "metadata": {"name": name, "namespace": demo}})
    assert await ended == exitcodes.DISRUPTED  # 143, never 0
    await running_pod(admin, demo, "demo", 1)
    await wait_condition(admin, demo, "demo", "Ready")
    assert (await get_mc(admin, demo, "demo"))["status"]["phase"] == "Running"


async def test_deleting_the_broker_is_a_disruption_and_without_storage_its_state_is_reported_lost(
    e2e: Env, admin: Kube, demo: str,
) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    durable = condition(await get_mc(admin, demo, "demo"), "StateDurable")
    assert (durable["status"], durable["reason"]) == ("False", "EmptyDir") and "dies with" in durable["message"]
    code, _job_id, err = await exec_in(e2e, demo, broker, "mc-submit", "-N", "2", "sleep", "300")
    assert code == 0, err
    workers = {p["metadata"]["uid"] for p in await pods(admin, demo, "demo")
               if p["status"].get("phase") == "Running" and p["metadata"]["uid"] != broker["metadata"]["uid"]}
    t0 = time.monotonic()
    ended = e2e.watch_exit_code(demo, broker)
    await admin.request("DELETE", f"/api/v1/namespaces/{demo}/pods/{broker['metadata']['name']}")
    assert await ended == exitcodes.DISRUPTED
    job = await admin.get(f"/apis/batch/v1/namespaces/{demo}/jobs/demo")
    assert not any(c["type"] == "Complete" for c in job["status"].get("conditions") or [])
    new_broker = await running_pod(admin, demo, "demo", 0, other_than=broker)
    e2e.timings["broker_deleted_to_new_pod_running_s"] = time.monotonic() - t0
    # Bounded: the in-cluster operator noticed the new broker 3.4–7.6 s after the deletion in most runs here, but
    # 56.9 s in one of six full-tier runs (not understood yet: issue 9 note); a pooled connection or a cached
    # address once made it minutes.
    lost = await wait_condition(admin, demo, "demo", "StateDurable", "False", reason="StateLost", timeout=120)
    assert "empty journal" in lost["message"]
    e2e.timings["broker_deleted_to_state_lost_reported_s"] = time.monotonic() - t0
    # Bounded: workers whose connect to the old broker IP hung in SYN retries rejoined only after ~70 s.
    await wait_condition(admin, demo, "demo", "Ready", timeout=30)
    # Seen by the operator: the new broker answers (that is how the loss was noticed) with every rank joined.
    e2e.timings["broker_deleted_to_new_broker_ready_s"] = time.monotonic() - t0
    # The workers were not told to stop: the same pods are still running.
    still = {p["metadata"]["uid"] for p in await pods(admin, demo, "demo") if p["status"].get("phase") == "Running"}
    assert workers <= still
    code, out, err = await exec_in(e2e, demo, new_broker, "mc", "jobs", "-a", "--json")
    assert code == 0 and json.loads(out)["jobs"] == [], (out, err)
    events = await admin.get(f"/api/v1/namespaces/{demo}/events?fieldSelector=involvedObject.name=demo")
    assert "StateLost" in {e["reason"] for e in events["items"]}


async def test_outside_the_cluster_the_broker_status_comes_through_the_pod_proxy(
        e2e: Env, admin: Kube, demo: str) -> None:
    # docs/operator.md#outside-the-cluster: an operator outside the pod network reads /status through the API
    # server's pod proxy once deploy/outside-cluster.yaml grants its ServiceAccount pods/proxy.
    token = await operator_token(admin, install.NAMESPACE)
    assert token is not None
    outside = Kube(_login(e2e.cluster, token))
    fetch = ProxyStatusFetcher(outside)
    mc = MiniCluster.from_body(await get_mc(admin, demo, "demo"))
    broker = await running_pod(admin, demo, "demo", 0)
    granted = list(yaml.safe_load_all((REPO / "deploy" / "outside-cluster.yaml").read_text()))
    try:
        assert await fetch(mc, broker) is None  # deploy/ alone grants no pods/proxy (403)
        for doc in granted:
            await admin.create(collection_path(doc), doc)
        status = await until(lambda: fetch(mc, broker), 30)
        assert status["ranks"]["up"] == 3, status
    finally:
        for doc in reversed(granted):
            await admin.request("DELETE", f"{collection_path(doc)}/{doc['metadata']['name']}")
        await outside.close()


async def test_deleting_the_minicluster_collects_everything(e2e: Env, admin: Kube, demo: str) -> None:
    await admin.request("DELETE", f"{MC_API}/namespaces/{demo}/miniclusters/demo")

    async def collected() -> bool:
        paths = [f"/apis/batch/v1/namespaces/{demo}/jobs/demo", f"/api/v1/namespaces/{demo}/services/demo",
                 f"/api/v1/namespaces/{demo}/configmaps/demo-config", f"/api/v1/namespaces/{demo}/secrets/demo-curve",
                 f"{MC_API}/namespaces/{demo}/miniclusters/demo"]
        gone = [await admin.get(p) is None for p in paths]
        return all(gone) and not await pods(admin, demo, "demo")
    await until(collected, 90)


# --- durable state -------------------------------------------------------------------------------------------

async def test_with_storage_a_new_broker_pod_resumes_the_queue_and_running_jobs(e2e: Env, admin: Kube) -> None:
    ns = await make_namespace(admin, e2e.namespace("store"))
    # high-id places the long job on the worker: rank 0's own tasks die with its pod, whatever the storage.
    await create(admin, minicluster(e2e, "keep", ns, size=2, storage={"size": "1Gi"}, policy="high-id"))
    await wait_condition(admin, ns, "keep", "Ready")
    broker = await running_pod(admin, ns, "keep", 0, role="broker")
    code, done_id, err = await exec_in(e2e, ns, broker, "mc-submit", "--wait", "true")
    assert code == 0, err
    code, long_id, err = await exec_in(e2e, ns, broker, "mc-submit", "sleep", "300")
    assert code == 0, err
    ended = e2e.watch_exit_code(ns, broker)
    await admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{broker['metadata']['name']}")
    assert await ended == exitcodes.DISRUPTED
    new_broker = await running_pod(admin, ns, "keep", 0, role="broker", other_than=broker)
    resumed = await wait_condition(admin, ns, "keep", "StateDurable", reason="Resumed")
    assert "epoch 2" in resumed["message"]
    code, out, err = await exec_in(e2e, ns, new_broker, "mc", "jobs", "-a", "--json")
    states = {j["id"]: (j["state"], j["result"]) for j in json.loads(out)["jobs"]}
    assert states[int(done_id)] == ("INACTIVE", "COMPLETED")
    assert states[int(long_id)][0] == "RUN", states  # reattached: its tasks never stopped
    # Only rank 0's pod mounts the claim; index 0 of the workers' Job stepped aside.
    placeholder = [p for p in await pods(admin, ns, "keep")
                   if (p["metadata"].get("annotations") or {}).get(INDEX) == "0"]
    assert placeholder and all(p["status"]["phase"] == "Succeeded" for p in placeholder)
    await admin.request("DELETE", f"{MC_API}/namespaces/{ns}/miniclusters/keep")
    await until(lambda: _absent(admin, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/keep-state"), 90)


# --- batch MiniClusters --------------------------------------------------------------------------------------

async def test_batch_minicluster_succeeds_and_one_whose_command_fails_fails(e2e: Env, admin: Kube) -> None:
    ns = await make_namespace(admin, e2e.namespace("batch"))
    await create(admin, minicluster(e2e, "good", ns, size=2, command=["mc", "run", "-N", "2", "hostname"]))
    await create(admin, minicluster(e2e, "bad", ns, size=2, command=["sh", "-c", "exit 3"]))
    done = await wait_condition(admin, ns, "good", "Succeeded", timeout=120)
    assert done["reason"] == "BrokerSucceeded"
    failed = await wait_condition(admin, ns, "bad", "Failed", timeout=120)
    assert failed["reason"] in ("PodFailurePolicy", "CommandFailed") and "3" in failed["message"]
    good = list(await pods(admin, ns, "good"))
    broker_log = e2e.on_node(lambda: e2e.node.logs(ns, next(
        p["metadata"]["name"] for p in good if (p["metadata"].get("annotations") or {}).get(INDEX) == "0")))
    assert "good-0" in broker_log and "good-1" in broker_log
    for name in ("good", "bad"):
        await until(lambda name=name: _no_live_pods(admin, ns, name), 60)


async def _no_live_pods(admin: Kube, ns: str, name: str) -> bool:
    return all(p["status"].get("phase") in ("Succeeded", "Failed") for p in await pods(admin, ns, name))


async def test_the_mpi_example_runs_across_pods(e2e: Env, admin: Kube) -> None:
    ns = await make_namespace(admin, e2e.namespace("mpi"))
    body = yaml.safe_load((REPO / "examples" / "03-mpi" / "minicluster.yaml").read_text())
    body["metadata"]["namespace"] = ns
    # The example requests 2 CPUs per pod, for a real cluster; a one-node test cluster of 2 cores fits 4 pods only
    # with less (a real scheduler would leave 3 of 4 pending).
    body["spec"]["resources"] = {"requests": {"cpu": "100m"}}
    body["spec"]["pod"] = {"packRanks": True}  # its 4 ranks on the one node, not one per node
    t0 = time.monotonic()
    await create(admin, body)
    await wait_condition(admin, ns, "mpi", "Succeeded", timeout=180)
    e2e.timings["mpi_example_s"] = time.monotonic() - t0
    broker = next(p for p in await pods(admin, ns, "mpi") if (p["metadata"].get("annotations") or {}).get(INDEX) == "0")
    log = e2e.on_node(lambda: e2e.node.logs(ns, broker["metadata"]["name"]))
    hellos = [line for line in log.splitlines() if line.startswith("Hello, World! I am process")]
    assert len(hellos) == 8 and {line.rsplit(" on ", 1)[1].rstrip(".") for line in hellos} == {
        "mpi-0", "mpi-1", "mpi-2", "mpi-3"}, log[-2000:]


# --- what users see when pods cannot run ----------------------------------------------------------------------

async def test_pod_failures_show_their_own_reasons(e2e: Env, admin: Kube) -> None:
    ns = await make_namespace(admin, e2e.namespace("trouble"))
    await create(admin, minicluster(e2e, "nopull", ns, size=2, image="example.org/missing:1",
                                    securityContext={"runAsNonRoot": True}))
    host_path = {"volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
                 "volumeMounts": [{"name": "host", "mountPath": "/host"}]}
    await create(admin, minicluster(e2e, "refused", ns, size=2, **host_path))
    pull = await wait_condition(admin, ns, "nopull", "Ready", "False", reason="ImagePullBackOff")
    assert "example.org/missing:1" in pull["message"]
    refused = await wait_condition(admin, ns, "refused", "Ready", "False", reason="FailedCreate")
    assert 'violates PodSecurity "restricted:latest"' in refused["message"] and "hostPath" in refused["message"]


# --- IPv6 ---------------------------------------------------------------------------------------------------

async def test_an_ipv6_only_cluster_joins_runs_and_shuts_down(e2e: Env, admin: Kube) -> None:
    if "ipv6" not in e2e.families:
        pytest.skip("the pod network has no IPv6")
    ns = await make_namespace(admin, e2e.namespace("six"), family="ipv6")
    await create(admin, minicluster(e2e, "six", ns, size=2))
    await wait_condition(admin, ns, "six", "Ready")
    broker = await running_pod(admin, ns, "six", 0)
    assert ":" in broker["status"]["podIP"]
    run = await asyncio.to_thread(kubectl_mc, e2e, ns, "run", "six", "-N", "2", "hostname")
    assert sorted(run.stdout.split()) == ["six-0", "six-1"], run.stderr
    # `mc shutdown` is how an interactive MiniCluster ends successfully.
    done = await asyncio.to_thread(kubectl_mc, e2e, ns, "shutdown", "six")
    assert done.returncode == 0, done.stderr
    assert (await wait_condition(admin, ns, "six", "Succeeded"))["reason"] == "BrokerSucceeded"


# --- application images without minicluster: the runtime injected (appimages.py) ------------------------------

async def broker_log(e2e: Env, admin: Kube, ns: str, name: str) -> str:
    """The log of rank 0's pod of MiniCluster `name` (the broker's: its batch command's output)."""
    [broker] = [p for p in await pods(admin, ns, name) if (p["metadata"].get("annotations") or {}).get(INDEX) == "0"]
    return str(e2e.on_node(lambda: e2e.node.logs(ns, broker["metadata"]["name"])))


async def succeeded_or_log(e2e: Env, admin: Kube, ns: str, name: str, timeout: float = 180) -> None:
    try:
        await wait_condition(admin, ns, name, "Succeeded", timeout=timeout)
    except AssertionError as exc:
        try:
            log = (await broker_log(e2e, admin, ns, name))[-3000:]
        except Exception as missing:  # no log (the container never started): the status above says why
            log = f"({missing})"
        raise AssertionError(f"{exc}\nthe broker's log:\n{log}") from None


MPICH_FINALIZE = (
    "Debian's MPICH 4.0.2 (ch4:ucx) may hang in MPI_Finalize across pods: it closes its UCX TCP endpoints before its "
    "last PMI barrier, and a peer already blocked in that barrier never answers (docs/mpi.md, Containers); after "
    "'ring done' all ranks but one waited in the barrier, in 1 of 2 runs on the emulated node and 1 of 1 on the real "
    "node")


@pytest.mark.parametrize("mpi", ["openmpi", pytest.param("mpich", marks=pytest.mark.xfail(reason=MPICH_FINALIZE))])
async def test_an_mpi_application_image_runs_its_mpi_program_across_ranks(e2e: Env, admin: Kube, mpi: str) -> None:
    # Debian bookworm + Debian's Open MPI and MPICH + a ring compiled against each, USER 1000 of its own: no
    # minicluster, no Python.  Restricted Pod Security holds with the image's own non-root user.  Open MPI's
    # PMIx client reaches the runtime's own PMIx server (the image's libpmix2 is never loaded by it).
    image = e2e.app_image("app-mpi")
    ns = await make_namespace(admin, e2e.namespace(f"app{mpi}"))
    await create(admin, minicluster(e2e, "ring", ns, size=2, image=image, securityContext={"runAsNonRoot": True},
                                    command=["mc", "run", "-N", "2", "-n", "4", f"/usr/local/bin/mpi-ring.{mpi}"]))
    await succeeded_or_log(e2e, admin, ns, "ring")
    log = await broker_log(e2e, admin, ns, "ring")
    ranks = {line.split()[2]: line.split()[-1] for line in log.splitlines() if line.startswith("ring: rank")}
    assert "ring done: 4 ranks, token 6" in log, log[-3000:]  # 0 + 1 + 2 + 3: every rank passed the token on
    assert sorted(ranks) == ["0", "1", "2", "3"] and set(ranks.values()) == {"ring-0", "ring-1"}, log[-3000:]


async def test_an_older_glibc_image_runs_a_plain_command_on_every_rank(e2e: Env, admin: Kube) -> None:
    # Debian bullseye (glibc 2.31, older than the runtime's 2.36), USER root: a root image, so a namespace
    # without the restricted profile.
    image = e2e.app_image("app-old")
    ns = await make_namespace(admin, e2e.namespace("appold"), restricted=False)
    said = 'echo "$(hostname) $(cat /etc/debian_version) $(ldd --version | head -n1)"'
    await create(admin, minicluster(e2e, "old", ns, size=2, image=image,
                                    command=["mc", "run", "-N", "2", "sh", "-c", said]))
    await succeeded_or_log(e2e, admin, ns, "old")
    lines = [line for line in (await broker_log(e2e, admin, ns, "old")).splitlines() if "GLIBC" in line]
    assert sorted(line.split()[0] for line in lines) == ["old-0", "old-1"], lines
    assert all(line.split()[1].startswith("11.") and "GLIBC 2.31" in line for line in lines), lines


async def test_a_static_image_without_libc_runs_a_plain_command_on_every_rank(e2e: Env, admin: Kube) -> None:
    # Only a static busybox: no libc, no loader, no /etc/passwd.  The runtime brings its own loader and libraries.
    image = e2e.app_image("app-static")
    ns = await make_namespace(admin, e2e.namespace("appstatic"), restricted=False)
    await create(admin, minicluster(e2e, "static", ns, size=2, image=image,
                                    command=["mc", "run", "-N", "2", "/bin/busybox", "echo", "static-ok"]))
    await succeeded_or_log(e2e, admin, ns, "static")
    log = await broker_log(e2e, admin, ns, "static")
    assert [line for line in log.splitlines() if line == "static-ok"] == ["static-ok"] * 2, log[-3000:]


async def test_an_image_that_cannot_hold_the_runtime_is_not_ready_with_the_reason_at_once(
        e2e: Env, admin: Kube) -> None:
    # /mnt is a file in this image: the runtime's volume cannot be mounted at /mnt/minicluster.
    image = e2e.app_image("app-nomnt")
    ns = await make_namespace(admin, e2e.namespace("appnomnt"), restricted=False)
    await create(admin, minicluster(e2e, "nomnt", ns, size=1, image=image, command=["true"]))
    ready = await wait_condition(admin, ns, "nomnt", "Ready", "False", reason="StartError", timeout=60)
    assert "container minicluster" in ready["message"].lower(), ready  # the app's container, not the runtime's copy
    await wait_condition(admin, ns, "nomnt", "Failed", timeout=60)
    # Failed at once: one pod ran (a 1.20 Job controller may have made a replacement, which never started).
    [pod] = [p for p in await pods(admin, ns, "nomnt") if p["status"].get("phase") == "Failed"]
    [ended] = [c["state"]["terminated"] for c in pod["status"]["containerStatuses"] if c["name"] == "minicluster"]
    assert ended["exitCode"] == exitcodes.NOT_STARTED and "not a directory" in ended["message"].lower(), ended


@pytest.mark.timeout(1800)  # MC_E2E_STARTS MiniClusters of each kind, one after the other
async def test_time_from_pod_start_to_every_rank_joined_injected_and_baked(e2e: Env, admin: Kube) -> None:
    """Not an assertion on time: the numbers for the notes (timings.json), MC_E2E_STARTS starts of each kind.
    Batch mode starts its command once every rank joined; the command prints that moment."""
    starts = int(os.environ.get("MC_E2E_STARTS", "1"))
    ns = await make_namespace(admin, e2e.namespace("starts"), restricted=False)
    clock = "import time; print('joined', time.time())"
    kinds = {"injected": {"image": e2e.app_image("app-static"),
                          "command": [f"{RUNTIME_ROOT}/python/bin/python3.11", "-I", "-c", clock]},
             "baked": {"image": e2e.image, "runtime": {"mode": "baked"}, "command": ["python3", "-c", clock]}}
    for kind, spec in kinds.items():
        seconds, copies = [], []
        for i in range(starts):
            name = f"{kind}-{i}"
            await create(admin, minicluster(e2e, name, ns, size=2, **spec))
            await succeeded_or_log(e2e, admin, ns, name)
            joined = [float(line.split()[1]) for line in (await broker_log(e2e, admin, ns, name)).splitlines()
                      if line.startswith("joined ")]
            assert len(joined) == 1
            ended = await pods(admin, ns, name)
            started = min(_seconds(p["status"]["startTime"]) for p in ended)
            seconds.append(joined[0] - started)
            copies += [_seconds(ran["finishedAt"]) - _seconds(ran["startedAt"]) for ran in (
                c["state"]["terminated"] for p in ended for c in p["status"].get("initContainerStatuses") or [])]
            await admin.request("DELETE", f"{MC_API}/namespaces/{ns}/miniclusters/{name}")
        e2e.timings[f"pod_start_to_joined_{kind}_median_s"] = statistics.median(seconds)
        e2e.timings[f"pod_start_to_joined_{kind}_runs"] = len(seconds)
        print(f"pod start to every rank joined, {kind}: {[round(s, 2) for s in seconds]}; the runtime's copy (init "
              f"container, whole seconds): {copies}")


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
