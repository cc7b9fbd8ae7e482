"""The operator's load on the API server (issue 28 item 6): requests per minute by verb and resource, its CPU
seconds per minute, and the time from a pod's change to the MiniCluster's status.

  python benchmarks/operator_requests.py [--json] [--counts 1,10] [--size 100] [--window 60] [--interval 5]

Runs a real kube-apiserver, etcd and kube-controller-manager (tests/operator/k8s_control_plane.py; build them
once with .ci/kubernetes.sh), installs the CRD and deploy/'s RBAC, and for each count N makes N MiniClusters of
`--size` ranks in a namespace of their own. The Job controller makes their pods; with no node they stay Pending.
The operator runs in a process of its own (as deployed: its ServiceAccount token, its own CPU time), reaching a
stand-in broker over HTTP that answers 503 (the broker is not up: every poll still makes its HTTP call).

Requests are counted by the API server itself (apiserver_request_total of its /metrics): over a window with the
operator settled, minus a window of the same length right after the operator stopped (kube-controller-manager's
own requests), per minute. Long-running WATCHes are counted when they end, so they show as the watches kopf
re-opens. Latency: one pod's status is patched to an image-pull failure and the time until the MiniCluster's
Ready condition says ErrImagePull is measured (the poll interval bounds it when status is polled).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "operator")]
from k8s_control_plane import (  # type: ignore[import-not-found]  # noqa: E402
    ADMIN_TOKEN, Cluster, binaries_or_skip, collection_path, crd_established, operator_token, request_counts,
)

from minicluster.operator.kube import Kube, path_of  # noqa: E402
from procstat import cpu_seconds  # noqa: E402
from tests.e2e.polling import until  # noqa: E402

MC_PATH = "/apis/minicluster.dev/v1alpha1/namespaces/{ns}/miniclusters"


class _NoBroker(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def login(server: str, ca: str, token: str) -> Any:
    import kopf

    async def connect() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, ca_path=ca, token=token)
    return connect


def run_operator(namespace: str, server: str, ca: str, token: str, broker_port: int, interval: float) -> None:
    """The operator process: one namespace, the broker stand-in for every MiniCluster."""
    import kopf

    from minicluster.operator import operate
    from minicluster.operator.status import HttpStatusFetcher

    async def main() -> None:
        fetcher = HttpStatusFetcher(lambda mc: f"http://127.0.0.1:{broker_port}/{mc.namespace}/{mc.name}/status")
        try:
            await operate(namespace, login=login(server, ca, token), fetch_status=fetcher, poll_interval=interval,
                          registry=kopf.OperatorRegistry(), metrics_port=None, check_jobs=False)
        finally:
            await fetcher.close()
    asyncio.run(main())


def minicluster(name: str, size: int) -> dict[str, Any]:
    return {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster", "metadata": {"name": name},
            "spec": {"size": size, "maxSize": size, "image": "example.org/minicluster:0.1.0"}}


def ready_reason(mc: dict[str, Any] | None) -> str:
    conditions = ((mc or {}).get("status") or {}).get("conditions") or []
    return next((c.get("reason", "") for c in conditions if c["type"] == "Ready"), "")


async def install(cluster: Cluster) -> str:
    docs = [yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text())]
    for name in ("operator/namespace.yaml", "operator/serviceaccount.yaml", "operator/rbac.yaml", "clusterwide.yaml"):
        docs += [doc for doc in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if doc]
    kube = Kube(login(cluster.server, str(cluster.ca_path), ADMIN_TOKEN))
    try:
        for doc in docs:
            await kube.create(collection_path(doc), doc)
        await until(lambda: crd_established(kube), 60)
        return await until(lambda: operator_token(kube), 60)
    finally:
        await kube.close()


async def measure(cluster: Cluster, token: str, broker_port: int, count: int, size: int, window: float,
                  interval: float) -> dict[str, Any]:
    ns = f"bench-{count}"
    kube = Kube(login(cluster.server, str(cluster.ca_path), ADMIN_TOKEN))
    operator: asyncio.subprocess.Process | None = None
    try:
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(count):
            await kube.create(MC_PATH.format(ns=ns), minicluster(f"mc{i}", size))
        operator = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--run-operator", ns, cluster.server, str(cluster.ca_path), token,
            str(broker_port), str(interval), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pods = path_of("Pod", ns) + "?labelSelector=app.kubernetes.io/managed-by"

        async def settled() -> bool:
            listed = (await kube.get(MC_PATH.format(ns=ns)) or {}).get("items") or []
            made = len((await kube.get(pods) or {}).get("items") or [])
            return len(listed) == count and all(ready_reason(m) for m in listed) and made >= count * size
        await until(settled, 120 + count * size / 20)
        await asyncio.sleep(2 * interval)
        before, cpu0, t0 = request_counts(cluster), cpu_seconds(operator.pid), time.monotonic()
        await asyncio.sleep(window)
        after, cpu1, t1 = request_counts(cluster), cpu_seconds(operator.pid), time.monotonic()
        latency = await pod_change_latency(kube, ns, "mc0", 60 + 4 * interval)
        operator.terminate()
        await asyncio.wait_for(operator.wait(), 30)
        operator = None
        minutes = (t1 - t0) / 60
        per_minute = await operator_requests_per_minute(cluster, after - before, window, minutes)
        return {"miniclusters": count, "pods_each": size, "window_s": round(t1 - t0, 1),
                "requests_per_minute": round(sum(per_minute.values()), 1), "by_verb_resource": per_minute,
                "operator_cpu_s_per_minute": round((cpu1 - cpu0) / minutes, 2),
                "pod_change_to_status_s": latency}
    finally:
        if operator is not None:
            operator.kill()
            await operator.wait()
        await kube.close()


async def pod_change_latency(kube: Kube, ns: str, name: str, timeout: float) -> float:
    """Seconds from one pod's status saying its image cannot be pulled to the MiniCluster's Ready saying so."""
    listed = await kube.get(path_of("Pod", ns) + f"?labelSelector=minicluster.dev/name={name}") or {}
    pod = listed["items"][0]
    container = pod["spec"]["containers"][0]["name"]
    status = {"status": {"containerStatuses": [{
        "name": container, "image": pod["spec"]["containers"][0]["image"], "imageID": "", "ready": False,
        "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull", "message": "benchmark"}}}]}}
    t0 = time.monotonic()
    await kube.merge_patch(path_of("Pod", ns, pod["metadata"]["name"]) + "/status", status)

    async def seen() -> bool:
        return ready_reason(await kube.get(path_of("MiniCluster", ns, name))) == "ErrImagePull"
    deadline = time.monotonic() + timeout
    while not await seen():
        if time.monotonic() > deadline:
            raise TimeoutError("the MiniCluster's status never showed the pod's change")
        await asyncio.sleep(0.05)
    return round(time.monotonic() - t0, 2)


async def operator_requests_per_minute(cluster: Any, with_op: Any, window: float,
                                       minutes: float) -> dict[str, float]:
    """The operator's requests per minute by verb and resource: `with_op` (counted over `minutes` while it ran)
    less what the API server counts over the same `window` right after the operator stopped (the
    controller-manager's own)."""
    base0 = request_counts(cluster)
    await asyncio.sleep(window)
    without = request_counts(cluster) - base0
    return {f"{verb} {res}": round((with_op[(verb, res)] - without[(verb, res)]) / minutes, 1)
            for verb, res in sorted(set(with_op) | set(without)) if with_op[(verb, res)] - without[(verb, res)] > 0}


@contextlib.contextmanager
def control_plane() -> Iterator[tuple[Any, str, int]]:
    """A started API server, etcd and controller-manager with the CRD and RBAC installed, and the stand-in broker:
    (cluster, the operator's token, the broker's port); all stopped at the end."""
    broker = ThreadingHTTPServer(("127.0.0.1", 0), _NoBroker)
    threading.Thread(target=broker.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), binaries_or_skip())
        cluster.start()
        try:
            yield cluster, asyncio.run(install(cluster)), broker.server_address[1]
        finally:
            cluster.stop()
            broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--counts", default="1,10", help="numbers of MiniClusters, comma-separated")
    parser.add_argument("--size", type=int, default=100, help="ranks (pods) per MiniCluster")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per measuring window")
    parser.add_argument("--interval", type=float, default=5.0, help="the operator's status poll interval")
    parser.add_argument("--run-operator", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_operator:
        ns, server, ca, token, port, interval = args.run_operator
        run_operator(ns, server, ca, token, int(port), float(interval))
        return
    results: list[dict[str, Any]] = []
    with control_plane() as (cluster, token, broker_port):
        for count in [int(c) for c in args.counts.split(",")]:
            result = asyncio.run(measure(cluster, token, broker_port, count, args.size, args.window, args.interval))
            results.append(result)
            if not args.json:
                print(f"{count} MiniClusters: {result['requests_per_minute']} requests/min, "
                      f"{result['operator_cpu_s_per_minute']} CPU s/min, pod change to status "
                      f"{result['pod_change_to_status_s']} s; {result['by_verb_resource']}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
