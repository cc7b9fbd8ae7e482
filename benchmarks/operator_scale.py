"""The operator with one MiniCluster of 1,000 or 10,000 ranks (issue 29 item 4): what our side adds to the time
from applying it to Ready, on a real API server with pods that never get a node.

  python benchmarks/operator_scale.py [--json] [--sizes 1000,10000] [--direct-from 0] [--window 60]
                                      [--interval 5]

The cluster is benchmarks/operator_requests.py's (a real kube-apiserver, etcd and kube-controller-manager, the
CRD and deploy/'s RBAC, the operator in a process of its own with its ServiceAccount token, a stand-in broker that
answers 503 to every status poll). For each size, in a namespace of its own, the operator is started first, then
one MiniCluster of that many ranks is created, and:

- `render_wall_s`, `render_operator_cpu_s`: from the create call until every child the operator makes (Secret,
  ConfigMap, Service, Job: reconcile._children) exists, polled every 20 ms; the operator's CPU over that time.
- `pods_created_s`: from the create call until the API server holds `size` pods of the MiniCluster. The Job
  controller makes them (kube-controller-manager's default client limit of 20 requests a second bounds it). With
  `--direct-from N`, from size N on the benchmark makes them too, 32 creates at a time, each labelled and owned as
  the Job controller would (the Job's template, its labels, a controller ownerReference to the Job), in rounds of
  up to 500 of those still missing; the Job controller counts them as the Job's active pods and deletes any it
  made beyond the Job's parallelism meanwhile. `pods_by` says which. Not useful on 1.20 at 10,000: its Job
  controller decides once per sync, from a count that is then stale, how many to make, and made its own 10,000
  beside the benchmark's (to be deleted again at 20 a second).
- `settled_s`: from the create call until exactly `size` pods exist, the MiniCluster's Ready condition has a
  reason and the operator's
  CPU, over one poll interval, is below a fifth of a core.
- Then over `--window` seconds settled: the operator's CPU seconds per minute, its RSS (VmRSS) at the end, and its
  API requests per minute (apiserver_request_total, minus a window of the same length after the operator stopped,
  as operator_requests.py does).
- `pod_change_to_status_s`: one pod's status patched to an image-pull failure, until the MiniCluster's Ready says
  ErrImagePull (operator_requests.pod_change_latency).

What is not here: the broker's join handling at these sizes, which benchmarks/ranksim.py measures with real rank
0 (docs/performance.md, "Rank 0 at 1,000 ranks"); a scheduler and kubelets (the pods stay Pending).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import operator as operator_mod
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO), str(REPO / "tests" / "operator")]
from k8s_control_plane import ADMIN_TOKEN, Cluster, request_counts  # type: ignore[import-not-found]  # noqa: E402
from operator_requests import (  # noqa: E402
    MC_PATH, control_plane, login, minicluster, operator_requests_per_minute, pod_change_latency, ready_reason,
)

from minicluster.operator import reconcile  # noqa: E402
from minicluster.operator.kube import Kube, path_of  # noqa: E402
from minicluster.operator.spec import MiniCluster  # noqa: E402
from procstat import cpu_seconds, status_kib  # noqa: E402
from tests.e2e.polling import until  # noqa: E402

CREATES_AT_ONCE = 32
ROUND = 500


async def count_pods(kube: Kube, ns: str) -> int:
    """The pods of the namespace (the MiniCluster's alone) without listing them all: one item and the count of the
    rest (which the API server gives only for a list without a selector)."""
    page = await kube.get(path_of("Pod", ns) + "?limit=1") or {}
    return len(page.get("items") or []) + int((page.get("metadata") or {}).get("remainingItemCount") or 0)


async def make_pods(kube: Kube, ns: str, job_name: str, size: int) -> None:
    """`size` Pending pods of the Job, as the Job controller makes them: its template, owned by the Job."""
    job = await kube.get(path_of("Job", ns, job_name))
    assert job is not None
    template = job["spec"]["template"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    limit = asyncio.Semaphore(CREATES_AT_ONCE)
    made = 0

    async def one(i: int) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
               "metadata": {"name": f"{job_name}-bench-{i:05d}", "namespace": ns,
                            "labels": template["metadata"]["labels"],
                            "annotations": template["metadata"].get("annotations") or {},
                            "ownerReferences": [owner]}}
        async with limit:
            await kube.create(path_of("Pod", ns), pod)
    # In rounds, each up to what is missing: the Job controller makes pods meanwhile too, and deletes (slowly,
    # at its 20 requests a second) any beyond the Job's parallelism.
    while (missing := size - await count_pods(kube, ns)) > 0:
        batch = min(missing, ROUND)
        await asyncio.gather(*(one(i) for i in range(made, made + batch)))
        made += batch


async def measure(cluster: Cluster, token: str, broker_port: int, size: int, direct: bool, window: float,
                  interval: float) -> dict[str, Any]:
    ns, name = f"scale-{size}", "mc"
    kube = Kube(login(cluster.server, str(cluster.ca_path), ADMIN_TOKEN))
    operator: asyncio.subprocess.Process | None = None
    try:
        await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        operator = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "benchmarks" / "operator_requests.py"), "--run-operator", ns, cluster.server,
            str(cluster.ca_path), token, str(broker_port), str(interval),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(8)  # its start-up and first (empty) lists
        body = minicluster(name, size)
        cpu0, t0 = cpu_seconds(operator.pid), time.monotonic()
        created = await kube.create(MC_PATH.format(ns=ns), body)
        children = reconcile._children(MiniCluster.from_body(created))

        async def rendered() -> bool:
            return all([await kube.get(path_of(kind, ns, child)) for kind, child in children])
        await until(rendered, 60, every=0.02)
        render = time.monotonic() - t0, cpu_seconds(operator.pid) - cpu0
        if direct:
            await make_pods(kube, ns, name, size)

        async def pods_are(compare: Any) -> bool:
            return bool(compare(await count_pods(kube, ns), size))
        await until(lambda: pods_are(operator_mod.ge), 120 + size / 10, every=0.2)
        pods_created = time.monotonic() - t0
        # The Job controller's extra pods gone before measuring.
        await until(lambda: pods_are(operator_mod.eq), 120 + size / 10, every=1)
        while True:
            mc = await kube.get(MC_PATH.format(ns=ns) + f"/{name}")
            cpu = cpu_seconds(operator.pid)
            await asyncio.sleep(interval)
            if ready_reason(mc) and cpu_seconds(operator.pid) - cpu < interval / 5:
                break
        settled = time.monotonic() - t0
        before, cpu0, t1 = request_counts(cluster), cpu_seconds(operator.pid), time.monotonic()
        await asyncio.sleep(window)
        after, cpu1, t2 = request_counts(cluster), cpu_seconds(operator.pid), time.monotonic()
        rss_mb = status_kib(operator.pid, "VmRSS") / 1024
        latency = await pod_change_latency(kube, ns, name, 60 + 4 * interval)
        operator.terminate()
        await asyncio.wait_for(operator.wait(), 30)
        operator = None
        minutes = (t2 - t1) / 60
        per_minute = await operator_requests_per_minute(cluster, after - before, window, minutes)
        return {"size": size, "pods_by": "benchmark" if direct else "job controller",
                "render_wall_s": round(render[0], 2), "render_operator_cpu_s": round(render[1], 2),
                "pods_created_s": round(pods_created, 1), "settled_s": round(settled, 1),
                "window_s": round(t2 - t1, 1), "operator_cpu_s_per_minute": round((cpu1 - cpu0) / minutes, 2),
                "operator_rss_mb": round(rss_mb, 1), "requests_per_minute": round(sum(per_minute.values()), 1),
                "by_verb_resource": per_minute, "pod_change_to_status_s": latency}
    finally:
        if operator is not None:
            operator.kill()
            await operator.wait()
        await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sizes", default="1000,10000", help="ranks of the MiniCluster, comma-separated")
    parser.add_argument("--direct-from", type=int, default=0,
                        help="from this size on the benchmark makes the pods too (0: never; see the docstring)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per measuring window")
    parser.add_argument("--interval", type=float, default=5.0, help="the operator's status poll interval")
    args = parser.parse_args()
    # Bounded from outside by timeout(1): its SIGTERM still stops the cluster and the operator (the finally's).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: list[dict[str, Any]] = []
    with control_plane() as (cluster, token, broker_port):
        for size in [int(s) for s in args.sizes.split(",")]:
            result = asyncio.run(measure(cluster, token, broker_port, size, 0 < args.direct_from <= size,
                                         args.window, args.interval))
            results.append(result)
            if not args.json:
                print(json.dumps(result), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
