"""The pod-level tier: the real 1.20 control plane (tests/operator/k8s_control_plane.py), an emulated node
(node.py) that runs pods, and the operator installed as docs/operator.md#install says (install.py): its
Deployment's pod runs on that node, in the cluster, and reaches the brokers by their DNS names.  Needs root
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest

from minicluster.operator.kube import ApiError, Kube
from tests.e2e import appimages, endpoints, image, install
from tests.e2e.network import Bridge
from tests.e2e.node import FAMILY_LABEL, Node
from tests.e2e.podsecurity import ENFORCE_LABEL
from tests.e2e.polling import until
from tests.host import skip_unless_ready
from tests.operator.k8s_control_plane import (
    ADMIN_TOKEN, Cluster, collection_path, find_binaries, serving_certificate,
)
import contextlib

__all__ = ["until"]  # the tests' import of it

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
        return "no kube-apiserver/etcd/kube-controller-manager: run .ci/kubernetes.sh or set MC_K8S_BIN"
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
    image: str = image.NAME  # the runtime image MiniClusters name
    families: tuple[str, ...] = ("ipv4", "ipv6")  # the pod network's address families

    @property
    def kubernetes_service(self) -> str:
        """KUBERNETES_SERVICE_HOST:PORT as pods see it: the API server itself (no kube-proxy here)."""
        return f"{self.cluster.address}:{self.cluster.port}"

    def namespace(self, suffix: str) -> str:
        return f"e2e-{self.run_id}-{suffix}"

    def watch_exit_code(self, ns: str, pod: dict[str, Any]) -> asyncio.Future[int | None]:
        """Start watching `pod` (from the version seen) for the exit code its node reports; a deleted pod's final
        status lives only for an instant, which polling would miss.  Start it before ending the pod."""
        def watch() -> int | None:
            from kubernetes import client, config
            from kubernetes import watch as k8s_watch

            api = config.new_client_from_config(str(self.kubeconfig))
            try:
                stream = k8s_watch.Watch().stream(
                    client.CoreV1Api(api).list_namespaced_pod, ns,
                    field_selector=f"metadata.name={pod['metadata']['name']}",
                    resource_version=pod["metadata"]["resourceVersion"], timeout_seconds=90)
                for event in stream:
                    for status in event["object"].status.container_statuses or []:
                        if status.state.terminated is not None:
                            return int(status.state.terminated.exit_code)
                    if event["type"] == "DELETED":
                        return None
                return None
            finally:
                api.close()
        return asyncio.ensure_future(asyncio.to_thread(watch))

    def app_image(self, name: str) -> str:
        """The name MiniClusters give for application image `name` (appimages.py), built or taken from the cache
        and known to the node; the test is skipped with the reason where it cannot be built."""
        skip_unless_ready(appimages.unavailable(name))
        self.node.images[appimages.reference(name)] = appimages.ensure(name)
        return appimages.reference(name)

    def on_node(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)


@pytest.fixture(scope="session")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    skip_unless_ready(_unavailable())
    run_id = secrets.token_hex(3)[:5]
    workdir = tmp_path_factory.mktemp("e2e")
    t0 = time.monotonic()
    images = {recipe.name: image.ensure(REPO, recipe) for recipe in image.RECIPES}
    images[image.NAME] = image.with_view(REPO, images[image.NAME])  # what copy mode's init container installs
    image_seconds = time.monotonic() - t0
    bridge = Bridge(run_id, int(run_id, 16))
    # The API server listens on the bridge's own address, port 443: what pods reach as the `kubernetes` Service
    # (no kube-proxy here to forward its ClusterIP).
    cluster = Cluster(workdir / "k8s", find_binaries(), address=bridge.gateway("ipv4"),  # type: ignore[arg-type]
                      port=443)
    (workdir / "k8s").mkdir()
    stops: list[Callable[[], None]] = []
    try:
        bridge.up()
        stops.append(bridge.down)
        cluster.start()
        stops.append(cluster.stop)
        node_env = _start_node(cluster, run_id, workdir, images, bridge, stops)
        t1 = time.monotonic()
        asyncio.run(_install(cluster, node_env))
        env = Env(cluster, node_env.node, run_id, cluster.admin_kubeconfig(), node_env.loop,
                  {"image_build_or_cache_s": image_seconds, "operator_install_to_ready_s": time.monotonic() - t1,
                   "setup_s": time.monotonic() - t0})
        yield env
        report_timings("e2e", workdir, env.timings, t0)
    finally:
        unwind("e2e", stops)
        for controller in ("cpu", "memory"):
            _rmdir_tree(Path(f"/sys/fs/cgroup/{controller}/mce-{run_id}"))


def loop_in_thread(name: str, main: Callable[[asyncio.Event, Callable[[], None]], Awaitable[None]],
                   ) -> tuple[asyncio.AbstractEventLoop, Callable[[], None]]:
    """Run `main(stop, started)` on an event loop of its own in a daemon thread: returns that loop once `main`
    has called `started()`, and the function that sets `stop` and joins the thread."""
    stop = threading.Event()
    started = threading.Event()
    state: dict[str, Any] = {}

    async def run() -> None:
        flag = asyncio.Event()
        watcher = asyncio.ensure_future(asyncio.to_thread(stop.wait))
        watcher.add_done_callback(lambda _f: flag.set())

        def ready() -> None:
            state["loop"] = asyncio.get_running_loop()
            started.set()
        await main(flag, ready)

    def body() -> None:
        try:
            asyncio.run(run())
        finally:
            started.set()

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    assert started.wait(60) and "loop" in state, f"{name} did not start"

    def halt() -> None:
        stop.set()
        thread.join(60)
    return state["loop"], halt


def report_timings(tier: str, workdir: Path, timings: dict[str, float], t0: float) -> None:
    timings["session_s"] = time.monotonic() - t0
    (workdir / "timings.json").write_text(json.dumps(timings, indent=1))
    print(f"\n{tier} timings ({workdir / 'timings.json'}):", json.dumps({k: round(v, 1) for k, v in timings.items()}))


def unwind(tier: str, stops: list[Callable[[], None]]) -> None:
    """Undo the session's setup steps, last first; one failed step must not leave the rest behind."""
    for stop in reversed(stops):
        try:
            stop()
        except Exception as exc:
            print(f"{tier} teardown: {stop}: {exc}")


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


def _start_node(cluster: Cluster, run_id: str, workdir: Path, images: dict[str, image.Image], bridge: Bridge,
                stops: list[Callable[[], None]]) -> _NodeThread:
    ca, cert, key = serving_certificate(workdir, "e2e-node")
    kube = Kube(_login(cluster, ADMIN_TOKEN))
    node = Node(kube, run_id, workdir, images, REPO, bridge, (cluster.address, cluster.port))
    async def main(stop: asyncio.Event, started: Callable[[], None]) -> None:
        runner, port = await endpoints.serve(node.find, cert, key)
        await node.register(port)
        started()
        try:
            await node.run(stop)
        finally:
            await runner.cleanup()
            await kube.close()

    loop, halt = loop_in_thread("e2e-node", main)
    stops.append(halt)
    return _NodeThread(node, loop, ca.read_bytes())


async def _install(cluster: Cluster, node_env: _NodeThread) -> None:
    """The Pod Security webhook (the node's), then `kubectl apply -k deploy/`; returns once the operator's pod
    is running on the node.  Its namespace is dual-stack here, so it reaches brokers of either family."""
    kube = Kube(_login(cluster, ADMIN_TOKEN))
    try:
        webhook = endpoints.webhook_configuration(node_env.node.port, node_env.ca_pem, node_env.node.run_id)
        await kube.create(collection_path(webhook), webhook)
        docs = install.kustomize(REPO / "deploy")
        for doc in docs:
            if doc["kind"] == "Namespace" and doc["metadata"]["name"] == install.NAMESPACE:
                doc["metadata"]["labels"][FAMILY_LABEL] = "dual"
            if doc["kind"] == "Deployment":
                # The 1.20 API server drops completionMode & co.; the node stands in for them (node.py), so the
                # operator must not report the cluster as unsupported (docs/operator.md, "Older clusters").
                [container] = doc["spec"]["template"]["spec"]["containers"]
                container["env"].append({"name": "MC_OPERATOR_CHECK_JOBS", "value": "0"})
        await install.apply(kube, docs)
        await until(lambda: _established(kube), 60)
        await until(lambda: install.operator_pod(kube), 60)
    finally:
        await kube.close()


async def _established(kube: Kube) -> bool:
    crd = await kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/miniclusters.minicluster.dev")
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd or {}).get("status", {}).get("conditions", []))


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


def minicluster(e2e: Env, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    # One node (emulated here, real in tests/realnode) holds every rank: pack them, against the one-per-node default.
    pod = {"packRanks": True, **spec.pop("pod", {})}
    if "image" not in spec and "init" not in spec.get("commands", {}):
        # The runtime image (USER 10001) fits the restricted namespaces most scenarios use (commands.init is root).
        spec.setdefault("securityContext", {"runAsNonRoot": True})
    return {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"size": 3, "image": e2e.image, "pod": pod, **spec}}


def kubectl_exec(e2e: Env, namespace: str, pod: str, argv: list[str],
                 container: str = "minicluster") -> tuple[int, str, str]:
    """What `kubectl exec POD -- ARGV` does: pods/exec through the API server, which proxies it to the node's
    kubelet API.  (exit status, stdout, stderr)"""
    from kubernetes import client, config
    from kubernetes.stream import stream

    api = config.new_client_from_config(str(e2e.kubeconfig))
    try:
        ws = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace, container=container,
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
