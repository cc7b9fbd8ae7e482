"""The pod-level tier: the real 1.20 control plane (tests/operator/k8s_control_plane.py), the operator outside it
under its own ServiceAccount, and an emulated node (node.py) that runs the MiniClusters' pods.  Needs root
(namespaces, a bridge, cgroups, mounts); skipped with the reason elsewhere, failed when CI is set."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from minicluster.operator import operate
from minicluster.operator.kube import ApiError, Kube
from tests.e2e import endpoints, image
from tests.e2e.network import Bridge
from tests.e2e.node import FAMILY_LABEL, Node
from tests.e2e.podsecurity import ENFORCE_LABEL
from tests.operator.k8s_control_plane import (
    ADMIN_TOKEN, Cluster, collection_path, find_binaries, operator_token, serving_certificate,
)
import contextlib

REPO = Path(__file__).resolve().parents[2]
MC_API = "/apis/minicluster.dev/v1alpha1"
TOOLS = ("ip", "unshare", "nsenter", "setpriv")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the pod-level tier needs root (network, mount and PID namespaces, a bridge, cgroups)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "no overlayfs"
    if not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
        return "no cgroup v1 cpu controller for the pods' CPU limits"
    if find_binaries() is None:
        return "no kube-apiserver/etcd/kube-controller-manager: run .ci/apiserver.sh or set MC_K8S_BIN"
    return image.available()


def _login(cluster: Cluster, token: str) -> Callable[[], Any]:
    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.server, ca_path=str(cluster.ca_path), token=token)
    return login


@dataclass
class Env:
    cluster: Cluster
    node: Node
    run_id: str
    kubeconfig: Path
    loop: asyncio.AbstractEventLoop  # the node's loop; tests talk to the node only through it
    timings: dict[str, float] = field(default_factory=dict)

    def namespace(self, suffix: str) -> str:
        return f"e2e-{self.run_id}-{suffix}"

    def on_node(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)


@pytest.fixture(scope="session")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    reason = _unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    run_id = secrets.token_hex(3)[:5]
    workdir = tmp_path_factory.mktemp("e2e")
    t0 = time.monotonic()
    built = image.ensure(REPO)
    image_seconds = time.monotonic() - t0
    cluster = Cluster(workdir / "k8s", find_binaries())  # type: ignore[arg-type]
    (workdir / "k8s").mkdir()
    bridge = Bridge(run_id, int(run_id, 16))
    stops: list[Callable[[], None]] = []
    try:
        cluster.start()
        stops.append(cluster.stop)
        bridge.up()
        stops.append(bridge.down)
        node_env = _start_node(cluster, run_id, workdir, built, bridge, stops)
        token = asyncio.run(_install(cluster, node_env))
        _start_operator(cluster, token, stops)
        env = Env(cluster, node_env.node, run_id, cluster.admin_kubeconfig(), node_env.loop,
                  {"image_build_or_cache_s": image_seconds, "setup_s": time.monotonic() - t0})
        yield env
        env.timings["session_s"] = time.monotonic() - t0
        (workdir / "timings.json").write_text(json.dumps(env.timings, indent=1))
        print(f"\ne2e timings ({workdir / 'timings.json'}):",
              json.dumps({k: round(v, 1) for k, v in env.timings.items()}))
    finally:
        for stop in reversed(stops):
            try:
                stop()
            except Exception as exc:  # one failed step must not leave the rest behind
                print(f"e2e teardown: {stop}: {exc}")
        for controller in ("cpu", "memory"):
            _rmdir_tree(Path(f"/sys/fs/cgroup/{controller}/mce-{run_id}"))


def _rmdir_tree(root: Path) -> None:
    """Kill whatever still runs in the run's cgroups (every container process joined one), then remove them."""
    if not root.exists():
        return
    for child in root.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in (root / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        root.rmdir()


@dataclass
class _NodeThread:
    node: Node
    loop: asyncio.AbstractEventLoop
    ca_pem: bytes


def _start_node(cluster: Cluster, run_id: str, workdir: Path, built: image.Image, bridge: Bridge,
                stops: list[Callable[[], None]]) -> _NodeThread:
    ca, cert, key = serving_certificate(workdir, "e2e-node")
    kube = Kube(_login(cluster, ADMIN_TOKEN))
    node = Node(kube, run_id, workdir, built, REPO, bridge)
    stop = threading.Event()
    ready: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        runner, port = await endpoints.serve(node.find, cert, key)
        await node.register(port)
        ready["loop"] = asyncio.get_running_loop()
        started.set()
        flag = asyncio.Event()
        watcher = asyncio.ensure_future(asyncio.to_thread(stop.wait))
        watcher.add_done_callback(lambda _f: flag.set())
        try:
            await node.run(flag)
        finally:
            await runner.cleanup()
            await kube.close()

    def body() -> None:
        try:
            asyncio.run(main())
        finally:
            started.set()

    thread = threading.Thread(target=body, name="e2e-node", daemon=True)
    thread.start()
    assert started.wait(60) and "loop" in ready, "the emulated node did not start"

    def halt() -> None:
        stop.set()
        thread.join(60)
    stops.append(halt)
    return _NodeThread(node, ready["loop"], ca.read_bytes())


async def _install(cluster: Cluster, node_env: _NodeThread) -> str:
    """CRD, deploy/ (namespace, ServiceAccount, RBAC), the outside-the-cluster RBAC, the Pod Security webhook;
    returns the operator's ServiceAccount token."""
    docs = [yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text())]
    for name in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "outside-cluster.yaml"):
        docs += list(yaml.safe_load_all((REPO / "deploy" / name).read_text()))
    docs.append(endpoints.webhook_configuration(node_env.node.port, node_env.ca_pem, node_env.node.run_id))
    kube = Kube(_login(cluster, ADMIN_TOKEN))
    try:
        for doc in docs:
            await kube.create(collection_path(doc), doc)
        await until(lambda: _established(kube), 60)
        return await until(lambda: operator_token(kube), 60)
    finally:
        await kube.close()


async def _established(kube: Kube) -> bool:
    crd = await kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/miniclusters.minicluster.dev")
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd or {}).get("status", {}).get("conditions", []))


def _start_operator(cluster: Cluster, token: str, stops: list[Callable[[], None]]) -> None:
    stop, ready = threading.Event(), threading.Event()

    async def main() -> None:
        # The operator runs outside the cluster, as a developer's would: brokers through the pod proxy.
        await operate(login=_login(cluster, token), registry=kopf.OperatorRegistry(), poll_interval=1.0,
                      metrics_port=None, stop_flag=stop, ready_flag=ready, broker_access="proxy")

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="e2e-operator", daemon=True)
    thread.start()
    assert ready.wait(60), "the operator did not start"

    def halt() -> None:
        stop.set()
        thread.join(30)
    stops.append(halt)


async def until(check: Callable[[], Any], timeout: float = 60.0, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s; last seen: {last!r}")
        await asyncio.sleep(every)


@pytest.fixture
async def admin(e2e: Env) -> AsyncIterator[Kube]:
    kube = Kube(_login(e2e.cluster, ADMIN_TOKEN))
    yield kube
    await kube.close()


async def make_namespace(admin: Kube, name: str, restricted: bool = True, family: str = "ipv4") -> str:
    labels = {FAMILY_LABEL: family}
    if restricted:
        labels[ENFORCE_LABEL] = "restricted"
    try:
        await admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": name, "labels": labels}})
    except ApiError as exc:
        if exc.status != 409:
            raise
    return name


def minicluster(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"size": 3, "image": image.NAME, **spec}}


def kubectl_exec(e2e: Env, namespace: str, pod: str, argv: list[str]) -> tuple[int, str, str]:
    """What `kubectl exec POD -- ARGV` does: pods/exec through the API server, which proxies it to the node's
    kubelet API.  (exit status, stdout, stderr)"""
    from kubernetes import client, config
    from kubernetes.stream import stream

    api = config.new_client_from_config(str(e2e.kubeconfig))
    try:
        ws = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace, container="minicluster",
                    command=argv, stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False)
        out, err = [], []
        while ws.is_open():
            ws.update(timeout=1)
            out.append(ws.read_stdout())
            err.append(ws.read_stderr())
        out.append(ws.read_stdout())
        err.append(ws.read_stderr())
        code = ws.returncode
        ws.close()
        ws.sock.shutdown()  # close() skips the socket when the server closed first
        return int(code), "".join(out), "".join(err)
    finally:
        api.close()
