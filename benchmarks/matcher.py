"""Benchmark of the broker.sched matcher and EASY scheduler (not a timed test).

    python benchmarks/matcher.py [--json] [--quick]
    python benchmarks/matcher.py --scale 10000:256   # one graph of 10,000 nodes, a 256-node gang (issue 29)

Each graph size runs in its own subprocess so its RSS is not polluted by the
others.  Per size: graph build time and RSS, single-core match+alloc rate
while the graph fills up (wall and CPU time: this machine is shared), latency
of a 64-node exclusive gang match, and one EASY scheduling cycle with a
queue of mixed jobs.  A separate case runs a 100,000-element array of 1-core
tasks on 4 nodes x 64 cores that complete at once (schedule -> release every
started element -> repeat) and reports CPU microseconds per element.

Topology cases (benchmarks/topology_bench.py): a 16,384-node graph in 512
racks of 32 in 8 zones (build, gangs with --locality/--spread on a half-busy
cluster), node[2]>socket[1]>{core[8],gpu[1]} on 4,096 nodes, and the EASY
cycle with 10 % tree requests in the queue on graphs with racks.  The same
cycle without trees is run in the same invocation on the code before the
graph matcher (git BASELINE_REF, extracted to a temporary directory) for the
side-by-side ratio; --baseline REF picks another commit, --baseline none
skips it.  --quick runs small sizes in a few seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
# MC_BENCH_CODE: run against another checkout of broker/ and minicluster/ (the baseline child)
sys.path.insert(0, os.environ.get("MC_BENCH_CODE") or str(ROOT))

from broker.sched import (Allocation, InfeasibleRequest, RankAlloc, Request,  # noqa: E402
                          ResourceGraph, SchedJob, Scheduler, Slot)

FULL = [  # name, nodes, cores per node, gpus per node, fill ops cap, queued jobs
    ("256x32", 256, 32, 0, None, 10_000),
    ("1024x64", 1024, 64, 0, None, 10_000),
    ("16384x64x4gpu", 16384, 64, 4, 200_000, 10_000),
]
QUICK = [("64x32", 64, 32, 0, None, 1_000), ("1024x64", 1024, 64, 4, 20_000, 1_000)]
TARGETS = [  # (description, size, metric path, target, "min" | "max")
    ("single-core match+alloc/s (CPU time)", "1024x64", ("fill", "cpu_rate_median"), 50_000, "min"),
    ("64-node exclusive gang match, ms", "16384x64x4gpu", ("gang", "match_ms_median"), 20.0, "max"),
    ("16,384-node graph build, s", "16384x64x4gpu", ("build", "seconds"), 30.0, "max"),
    ("16,384-node graph RSS, MB", "16384x64x4gpu", ("build", "rss_mb"), 2048.0, "max"),
    ("EASY cycle, 10,000 queued jobs, s", "1024x64", ("cycle", "first_seconds"), 1.0, "max"),
]
TOPOLOGY = {"nodes": 16384, "per_rack": 32, "zones": 8, "cores": 64, "gpus": 4}
TOPOLOGY_QUICK = {"nodes": 1024, "per_rack": 32, "zones": 4, "cores": 64, "gpus": 4}
SOCKETS = {"nodes": 4096, "cores": 64, "gpus": 4}  # 2 sockets x 32 cores, 2 GPUs per socket
SOCKETS_QUICK = {"nodes": 256, "cores": 64, "gpus": 4}
MIXED = ("1024x64", "16384x64x4gpu")  # sizes of FULL whose EASY cycle is rerun with trees
MIXED_QUICK = ("1024x64",)
TREE_SHARE = 0.10
BASELINE_REF = "165bb75"  # main before the graph matcher: the "today" of issue 15
TOPOLOGY_TARGETS = [  # (description, case, metric path, target, "min" | "max")
    ("64-node excl. gang --locality zone, 16,384 nodes/512 racks, half-busy, ms CPU", "topology",
     ("half_busy", "zone_locality_64_exclusive", "match_ms"), 20.0, "max"),
    ("32-node excl. gang --locality rack (whole rack), half-busy, ms CPU", "topology",
     ("half_busy", "rack_locality_32_exclusive", "match_ms"), 20.0, "max"),
    ("64-node gang --spread rack, half-busy, ms CPU", "topology",
     ("half_busy", "spread_rack_64", "match_ms"), 20.0, "max"),
    ("graph build with levels, 16,384 nodes, s", "topology", ("build", "seconds"), 10.0, "max"),
    ("graph RSS with levels, 16,384 nodes, MB", "topology", ("build", "rss_mb"), 1024.0, "max"),
    ("node[2]>socket[1]>{core[8],gpu[1]} match+alloc/s CPU, 4,096 nodes", "sockets",
     ("cpu_rate_median",), 10_000, "min"),
]
ARRAY = {"nodes": 4, "cores": 64, "count": 100_000}  # the broker's throughput workload
ARRAY_QUICK = {"nodes": 4, "cores": 64, "count": 20_000}
ARRAY_TARGET_US = 5.0  # scheduler share of the broker's 20,000 tasks/s budget on 2 cores
FLUXION = {"1-core match, 256x32": "15-22 ms per job", "match, 16,384 nodes": "1.8 s",
           "load 16,384-node graph": "70 s"}


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(nodes: int, cores: int, gpus: int) -> ResourceGraph:
    graph = ResourceGraph()
    half = cores // 2
    sockets = {0: tuple(range(half)), 1: tuple(range(half, cores))}
    for rank in range(nodes):
        graph.add_rank(rank, hostname=f"node{rank:05d}", sockets=sockets,
                       gpus=tuple(range(gpus)), memory_mb=256_000,
                       properties={"zone": "ab"[rank % 2]})
    return graph


def bench_build(nodes: int, cores: int, gpus: int) -> tuple[ResourceGraph, dict]:
    before = rss_mb()
    start = time.perf_counter()
    graph = build(nodes, cores, gpus)
    seconds = time.perf_counter() - start
    return graph, {"seconds": seconds, "rss_mb": rss_mb(), "rss_delta_mb": rss_mb() - before,
                   "vertices": graph.graph.number_of_nodes()}


def bench_fill(graph: ResourceGraph, cap: int | None) -> dict:
    """Single-core match+alloc until full (or cap), timed in 10 chunks; then free all."""
    total = cap or graph.cluster.free_cores
    chunk = max(1, total // 10)
    req, key = Request(), 0
    wall_rates, cpu_rates = [], []
    while key < total:
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(min(chunk, total - key)):
            alloc = graph.match(req)
            assert alloc is not None, "the fill stops at the free cores"
            graph.alloc(key, alloc)
            key += 1
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        wall_rates.append(chunk / wall)
        cpu_rates.append(chunk / max(cpu, 1e-9))
    w0 = time.perf_counter()
    for k in range(key):
        graph.free(k)
    return {"ops": key, "wall_rate_median": statistics.median(wall_rates),
            "wall_rate_min": min(wall_rates), "cpu_rate_median": statistics.median(cpu_rates),
            "free_rate": key / (time.perf_counter() - w0)}


def median_ms(fn, repeats: int = 21, clock=time.process_time) -> float:
    """Median of `repeats` calls of fn, in ms of `clock` (CPU time unless told)."""
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1000)
    return statistics.median(times)


def bench_gang(graph: ResourceGraph, repeats: int = 21, width: int = 64) -> dict:
    """`width`-node exclusive gang: on the empty graph, and with every other node busy."""
    nnodes = min(width, len(graph.nodes) // 2)
    req = Request(nslots=nnodes, nnodes=nnodes, exclusive=True)

    def match_alloc_free() -> None:
        alloc = graph.match(req)
        assert alloc is not None, "half the nodes are idle"
        graph.alloc("gang", alloc)
        graph.free("gang")

    empty = median_ms(lambda: graph.match(req), repeats, time.perf_counter)
    cycle = median_ms(match_alloc_free, repeats, time.perf_counter)
    for rank in range(0, len(graph.nodes), 2):
        graph.alloc(("busy", rank), Allocation({rank: RankAlloc((Slot((0,)),))}))
    fragmented = median_ms(lambda: graph.match(req), repeats, time.perf_counter)
    for rank in range(0, len(graph.nodes), 2):
        graph.free(("busy", rank))
    return {"nnodes": nnodes, "match_ms_median": empty, "match_alloc_free_ms_median": cycle,
            "match_ms_median_half_busy": fragmented}


def mixed_jobs(count: int, gpus: bool, seed: int = 7) -> list[SchedJob]:
    """A queue shaped like a busy site: mostly small jobs, some wide, a few huge."""
    rng = random.Random(seed)
    shapes = [
        (60, Request()),
        (15, Request(nslots=2, cores_per_slot=4)),
        (10, Request(nslots=16, nnodes=1)),
        (5, Request.from_strings(["zone=a"], nslots=32, nnodes=2)),
        (4, Request(nslots=2, nnodes=2, exclusive=True)),
        (4, Request(nslots=4, gpus_per_slot=1, nnodes=1) if gpus else Request(nslots=8)),
        (1, Request(nslots=64, nnodes=64, exclusive=True)),
        (1, Request(nslots=4096)),
    ]
    weights = [w for w, _ in shapes]
    jobs = []
    for job_id in range(count):
        req = rng.choices([r for _, r in shapes], weights)[0]
        jobs.append(SchedJob(job_id, urgency=rng.choice([8, 16, 16, 16, 24]),
                             submit_time=float(job_id), request=req,
                             time_limit=float(rng.randrange(60, 7200))))
    return jobs


def queue_of(queued: int, gpus: bool, trees: float) -> list[SchedJob]:
    jobs = mixed_jobs(queued, gpus)
    if trees:
        from topology_bench import mixed_with_trees

        jobs = mixed_with_trees(jobs, gpus, trees)
    return jobs


def bench_cycle(graph: ResourceGraph, queued: int, gpus: bool, trees: float = 0.0) -> dict:
    """First EASY cycle on an empty graph with `queued` jobs, then a steady-state one."""
    sched = Scheduler(graph)
    rejected = 0
    for job in queue_of(queued, gpus, trees):
        try:
            graph.check_feasible(job.request)  # as the broker does at submit
        except InfeasibleRequest:
            rejected += 1
            continue
        sched.enqueue(job)
    t0, c0 = time.perf_counter(), time.process_time()
    starts = sched.schedule(0.0)
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    head = next((j for j in range(queued) if sched.estimated_start(j) is not None), None)
    reserved_at = sched.estimated_start(head) if head is not None else None
    rng = random.Random(3)
    for start in rng.sample(starts, len(starts) // 10):
        sched.release(start.job_id, start.element, 30.0)
    t0 = time.perf_counter()
    again = sched.schedule(30.0)
    second = time.perf_counter() - t0
    t0 = time.perf_counter()
    sched.schedule(31.0)
    quiet = time.perf_counter() - t0
    running = sched.running_count()
    for start in starts + again:  # leave the graph empty for the next measurement
        if graph.holds((start.job_id, start.element)):
            sched.release(start.job_id, start.element, 40.0)
    return {"queued": queued - rejected, "rejected": rejected,
            "first_seconds": first, "first_cpu_seconds": first_cpu, "first_starts": len(starts),
            "first_tasks": sum(a.allocation.nslots for a in starts),
            "reserved_head": head, "reserved_start": reserved_at,
            "steady_seconds": second, "steady_starts": len(again),
            "quiet_seconds": quiet, "running": running,
            "pending": sched.pending_count()}


def bench_busy_cycle(graph: ResourceGraph, queued: int, gpus: bool, trees: float = 0.0) -> dict:
    """EASY cycle when 90% of nodes run whole-node jobs: exercises the reservation search."""
    sched = Scheduler(graph)
    rng = random.Random(5)
    cores = next(iter(graph.nodes.values())).total_cores
    busy = int(len(graph.nodes) * 0.9)
    for job_id in range(busy):
        sched.enqueue(SchedJob(job_id, urgency=31, request=Request(nslots=cores, nnodes=1),
                               time_limit=float(rng.randrange(600, 36_000))))
    prefill = len(sched.schedule(0.0))
    for job in queue_of(queued, gpus, trees):
        try:
            graph.check_feasible(job.request)
        except InfeasibleRequest:
            continue
        sched.enqueue(SchedJob(busy + job.job_id, job.urgency, job.submit_time, job.request,
                               job.time_limit))
    t0, c0 = time.perf_counter(), time.process_time()
    starts = sched.schedule(1.0)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    head = next((j for j in range(busy, busy + queued) if sched.estimated_start(j) is not None),
                None)
    return {"running_before": prefill, "seconds": seconds, "cpu_seconds": cpu,
            "starts": len(starts),
            "reserved_start": sched.estimated_start(head) if head is not None else None}


def bench_array(nodes: int, cores: int, count: int, repeats: int = 3) -> dict:
    """An array of `count` 1-core elements whose tasks complete immediately.

    Loop: schedule(now) -> release every started element -> repeat until the
    array is done.  Reported: CPU (and wall) microseconds per element for the
    whole start + release cycle, best and median of `repeats` runs, plus the
    cost of the broker's per-start read of allocation.task_slots().
    """
    cpu_us, wall_us, cycles = [], [], 0
    for _rep in range(repeats):
        graph = build(nodes, cores, 0)
        sched = Scheduler(graph)
        sched.enqueue(SchedJob(1, request=Request(nslots=1, cores_per_slot=1), count=count))
        before = graph.snapshot()
        now, done, cycles = 0.0, 0, 0
        w0, c0 = time.perf_counter(), time.process_time()
        while True:
            starts = sched.schedule(now)
            if not starts:
                break
            cycles += 1
            for st in starts:
                sched.release(st.job_id, st.element, now)
            done += len(starts)
            now += 1.0
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        assert done == count and sched.pending_count() == 0 and sched.running_count() == 0
        assert graph.snapshot() == before, "array run did not free exactly"
        cpu_us.append(cpu / count * 1e6)
        wall_us.append(wall / count * 1e6)
    # what the broker additionally pays per start to read the binding
    graph = build(nodes, cores, 0)
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(2, count=nodes * cores))
    starts = sched.schedule(0.0)
    c0 = time.process_time()
    for _ in range(20):
        for st in starts:
            ((_rank, _slot),) = st.allocation.task_slots()
    slots_us = (time.process_time() - c0) / (20 * len(starts)) * 1e6
    return {"nodes": nodes, "cores_per_node": cores, "count": count, "cycles": cycles,
            "cpu_us_per_element_best": min(cpu_us),
            "cpu_us_per_element_median": statistics.median(cpu_us),
            "wall_us_per_element_median": statistics.median(wall_us),
            "task_slots_us": slots_us}


def run_case(name: str, quick: bool) -> dict:
    if name == "array":
        return bench_array(**(ARRAY_QUICK if quick else ARRAY))
    if name in ("topology", "sockets"):
        import topology_bench

        if name == "sockets":
            return topology_bench.bench_sockets(**(SOCKETS_QUICK if quick else SOCKETS))
        return topology_bench.bench_topology(**(TOPOLOGY_QUICK if quick else TOPOLOGY),
                                             rss_mb=rss_mb)
    if name.startswith("scale:"):
        scale_nodes, _, scale_width = name.removeprefix("scale:").partition(":")
        return scale_case(int(scale_nodes), int(scale_width))
    kind, _, size = name.rpartition(":")
    _, nodes, cores, gpus, cap, queued = next(c for c in (QUICK if quick else FULL) if c[0] == size)
    if kind:  # "mixed:SIZE" (trees, racks) or "baseline:SIZE" (the code before, no trees)
        return mixed_cycles(kind, nodes, cores, gpus, queued)
    graph, built = bench_build(nodes, cores, gpus)
    result = {"nodes": nodes, "cores_per_node": cores, "gpus_per_node": gpus, "build": built}
    result["fill"] = bench_fill(graph, cap)
    result["gang"] = bench_gang(graph)
    result["cycle"] = bench_cycle(graph, queued, bool(gpus))
    result["busy_cycle"] = bench_busy_cycle(graph, queued, bool(gpus))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def scale_case(nodes: int, width: int, cores: int = 64, queued: int = 10_000) -> dict:
    """One graph of `nodes` nodes: its build, a `width`-node exclusive gang, and the EASY cycles (a pass)."""
    graph, built = bench_build(nodes, cores, 0)
    gc.freeze()  # as the broker does once the ranks joined
    return {"nodes": nodes, "cores_per_node": cores, "build": built, "gang": bench_gang(graph, width=width),
            "cycle": bench_cycle(graph, queued, False), "busy_cycle": bench_busy_cycle(graph, queued, False),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def mixed_cycles(kind: str, nodes: int, cores: int, gpus: int, queued: int) -> dict:
    """The EASY cycles of one size: with TREE_SHARE trees on racks ("mixed"), or as before."""
    if kind == "mixed":
        from topology_bench import build_racks

        graph, trees = build_racks(nodes, 32, max(1, nodes // 256), cores, gpus), TREE_SHARE
    else:
        graph, trees = build(nodes, cores, gpus), 0.0
    gc.freeze()  # as the broker does once the ranks joined (docs/scheduling.md)
    return {"cycle": bench_cycle(graph, queued, bool(gpus), trees),
            "busy_cycle": bench_busy_cycle(graph, queued, bool(gpus), trees), "trees": trees}


def baseline_code(ref: str) -> tempfile.TemporaryDirectory | None:
    """broker/ and minicluster/ of git ref in a temporary directory, or None without git."""
    tmp = tempfile.TemporaryDirectory(prefix="mc-bench-baseline-")
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "broker", "minicluster"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp.name], input=archive, check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        tmp.cleanup()
        return None
    return tmp


def evaluate_topology(results: dict, mixed: dict) -> list[dict]:
    rows = []
    for desc, case, path, target, kind in TOPOLOGY_TARGETS:
        value = results[case]
        for key in path:
            value = value[key]
        ratio = value / target if kind == "min" else target / max(value, 1e-9)
        rows.append({"target": desc, "size": case, "goal": target, "measured": value,
                     "ratio": ratio, "met": ratio >= 1.0})
    for size, pair in mixed.items():
        if "baseline" not in pair:
            continue
        for cycle in ("cycle", "busy_cycle"):
            key = "first_cpu_seconds" if cycle == "cycle" else "cpu_seconds"
            now, before = pair["mixed"][cycle][key], pair["baseline"][cycle][key]
            value = now / max(before, 1e-9)
            rows.append({"target": f"EASY {cycle.replace('_', ' ')} with 10% trees / baseline,"
                                   " CPU ratio", "size": size, "goal": 2.0, "measured": value,
                         "ratio": 2.0 / max(value, 1e-9), "met": value <= 2.0,
                         "before_s": before, "after_s": now})
    return rows


def evaluate(results: dict) -> list[dict]:
    rows = []
    for desc, size, path, target, kind in TARGETS:
        if size not in results:
            continue
        value = results[size][path[0]][path[1]]
        ratio = value / target if kind == "min" else target / max(value, 1e-9)
        rows.append({"target": desc, "size": size, "goal": target, "measured": value,
                     "ratio": ratio, "met": ratio >= 1.0})
    return rows


def report(results: dict, array: dict | None = None) -> None:
    for name, r in results.items():
        b, f, g, c = r["build"], r["fill"], r["gang"], r["cycle"]
        print(f"== {name}: {r['nodes']} nodes x {r['cores_per_node']} cores"
              f" x {r['gpus_per_node']} gpus")
        print(f"  build {b['seconds']:.2f} s, RSS {b['rss_mb']:.0f} MB"
              f" (+{b['rss_delta_mb']:.0f}), {b['vertices']} vertices")
        print(f"  1-core match+alloc: {f['cpu_rate_median']:,.0f}/s CPU,"
              f" {f['wall_rate_median']:,.0f}/s wall (min {f['wall_rate_min']:,.0f}),"
              f" {f['ops']} ops; free {f['free_rate']:,.0f}/s")
        print(f"  {g['nnodes']}-node exclusive gang: match {g['match_ms_median']:.3f} ms,"
              f" match+alloc+free {g['match_alloc_free_ms_median']:.3f} ms,"
              f" half nodes busy {g['match_ms_median_half_busy']:.3f} ms")
        print(f"  EASY cycle, {c['queued']} queued: {c['first_seconds'] * 1000:.0f} ms"
              f" ({c['first_cpu_seconds'] * 1000:.0f} ms CPU; {c['first_starts']} starts,"
              f" {c['first_tasks']} tasks), after 10% releases"
              f" {c['steady_seconds'] * 1000:.0f} ms ({c['steady_starts']} starts),"
              f" unchanged {c['quiet_seconds'] * 1e6:.0f} us")
        u = r["busy_cycle"]
        print(f"  EASY cycle with {u['running_before']} whole-node jobs running:"
              f" {u['seconds'] * 1000:.0f} ms ({u['cpu_seconds'] * 1000:.0f} ms CPU;"
              f" {u['starts']} starts,"
              f" head reserved at t={u['reserved_start']})")
    if array:
        a = array
        print(f"== array: {a['count']:,} x 1-core elements on {a['nodes']} nodes x"
              f" {a['cores_per_node']} cores, immediate completion ({a['cycles']} cycles)")
        print(f"  schedule+release: {a['cpu_us_per_element_median']:.2f} us/element CPU"
              f" (best {a['cpu_us_per_element_best']:.2f}),"
              f" {a['wall_us_per_element_median']:.2f} us wall;"
              f" allocation.task_slots() {a['task_slots_us']:.2f} us")


def child(case: str, quick: bool, code: str | None = None) -> dict:
    """Run one case in its own process (clean RSS); `code`: another checkout to import from."""
    cmd = [sys.executable, __file__, "--case", case] + (["--quick"] if quick else [])
    env = dict(os.environ, MC_BENCH_CODE=code) if code else None
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env=env).stdout)


def run_topology(quick: bool, baseline: str) -> tuple[dict, dict]:
    """The topology, sockets and mixed-queue cases, with the baseline cycles side by side."""
    topo = {name: child(name, quick) for name in ("topology", "sockets")}
    mixed: dict[str, dict] = {}
    code = baseline_code(baseline) if baseline != "none" else None
    try:
        for size in MIXED_QUICK if quick else MIXED:
            mixed[size] = {"mixed": child(f"mixed:{size}", quick)}
            if code is not None:
                mixed[size]["baseline"] = child(f"baseline:{size}", quick, code.name)
    finally:
        if code is not None:
            code.cleanup()
    return topo, mixed


def report_topology(topo: dict, mixed: dict) -> None:
    t = topo["topology"]
    b = t["build"]
    print(f"== topology: {t['nodes']} nodes in {b['racks']} racks, {b['zones']} zones:"
          f" build {b['seconds']:.2f} s ({b['cpu_seconds']:.2f} s CPU), RSS {b['rss_mb']:.0f} MB"
          f" (+{b['rss_delta_mb']:.0f}), {b['vertices']} vertices")
    for state in ("half_busy", "fragmented"):
        for name, r in t[state].items():
            found = f"found in {r['racks']} racks" if r["found"] else "no fit"
            print(f"  {state} {name}: match {r['match_ms']:.3f} ms CPU, match+alloc+free"
                  f" {r['match_alloc_free_ms']:.3f} ms, {found}")
    ref = t["locality_rack_64_refused"]
    print(f"  64 nodes --locality rack refused at submit in {ref['ms']:.3f} ms: {ref['reason']}")
    s = topo["sockets"]
    print(f"== sockets: node[2]>socket[1]>{{core[8],gpu[1]}} on {s['nodes']} nodes:"
          f" {s['cpu_rate_median']:,.0f} match+alloc/s CPU, {s['matches']} matches"
          f" (expected {s['expected_matches']}), empty match {s['empty_match_ms']:.3f} ms")
    for size, pair in mixed.items():
        for kind, r in pair.items():
            c, u = r["cycle"], r["busy_cycle"]
            print(f"== {kind} {size} ({r['trees']:.0%} trees): first cycle"
                  f" {c['first_cpu_seconds'] * 1000:.0f} ms CPU ({c['first_starts']} starts),"
                  f" busy cycle {u['cpu_seconds'] * 1000:.0f} ms CPU ({u['starts']} starts)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--only", choices=("classic", "topology"),
                        help="only the cases of before the topology work, or only the new ones")
    parser.add_argument("--baseline", default=BASELINE_REF, metavar="REF",
                        help=f"git commit for the side-by-side cycles (default {BASELINE_REF}; none)")
    parser.add_argument("--scale", metavar="NODES:WIDTH",
                        help="only one graph of NODES x 64 cores: build, a WIDTH-node gang, the EASY cycles (JSON)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one size, in a child process
    args = parser.parse_args()
    if args.case or args.scale:
        print(json.dumps(run_case(args.case or f"scale:{args.scale}", args.quick)))
        return 0
    results, array, rows = {}, None, []
    topo: dict[str, Any] = {}
    mixed: dict[str, Any] = {}
    if args.only != "topology":
        for name, *_ in (QUICK if args.quick else FULL):
            results[name] = child(name, args.quick)
        array = child("array", args.quick)
        if not args.quick:
            rows = evaluate(results)
            value = array["cpu_us_per_element_median"]
            rows.append({"target": "array element schedule+release, us CPU", "size": "array4x64",
                         "goal": ARRAY_TARGET_US, "measured": value,
                         "ratio": ARRAY_TARGET_US / max(value, 1e-9),
                         "met": value <= ARRAY_TARGET_US})
    if args.only != "classic":
        topo, mixed = run_topology(args.quick, args.baseline)
        if not args.quick:
            rows += evaluate_topology(topo, mixed)
    load = os.getloadavg()
    doc = {"quick": args.quick, "cpus": os.cpu_count(), "loadavg": load,
           "python": sys.version.split()[0], "results": results, "array": array,
           "topology": topo, "mixed": mixed, "baseline_ref": args.baseline, "targets": rows,
           "fluxion_published": FLUXION}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        if results:
            report(results, array)
        if topo:
            report_topology(topo, mixed)
        for row in rows:
            print(f"target {row['target']} [{row['size']}]: {row['measured']:.3g} vs"
                  f" {row['goal']:g} -> x{row['ratio']:.2f} {'MET' if row['met'] else 'MISSED'}")
        print(f"(load average {load[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
