"""The dispatch window (protocol.md §2.10) on and off, interleaved run by run (not a timed test).

    python benchmarks/window.py [--runs N] [--quick] [--windows 0,4] [--only slots8|jobs8|real|realjobs] [--jobs N]

Two experiments on fresh `LocalCluster`s, each run trying every `dispatch_window` setting (0 is the dispatch of
before the window: every core reused only after a round trip through rank 0) in a rotating order:

slots8   the test executor (tasks end at once) on 4 ranks of 2 cores, 8 slots: one array, submit -> all done.
jobs8    the same 8 slots, N single `true` jobs sent with `submit_many` (small single jobs go ahead: §2.10),
         submit -> all done; the rate counts from the first submit, so it includes the submissions.
real     `/bin/true` on 2 ranks of 4 cores (real executor), 8 in flight, and in the same run the bare
         `os.posix_spawn` loop of benchmarks/throughput.py: the ratio is taken run by run.
realjobs the same with N single `/bin/true` jobs through `submit_many` instead of one array.

Prints one JSON document: every run, the medians, and the ratios to window 0 (and to the raw loop) run by run.
The machine may be shared: compare ratios measured in one run, not absolute rates across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import cpu_seconds
from throughput import IN_FLIGHT, local_cluster, loadavg, progress, run_all, spawn_raw, spec, submit_ids


def slots8(n: int, window: int, cpu: dict[str, list[float]]) -> float:
    """Tasks/s of an n-element test-executor array on 4 ranks x 2 cores; appends the broker's and all ranks' CPU
    time per task (µs, utime + stime: little affected by the machine's load) to `cpu`."""
    with (local_cluster(4, test_exec=True, resources="cores=2", dispatch_window=window) as cluster,
          cluster.client() as client):
        run_all(client, [client.submit(spec(["true"], array="1-200"))])  # warm-up
        pids = [p.pid for p in cluster.procs.values()]
        broker0, all0 = cpu_seconds(pids[0]), sum(map(cpu_seconds, pids))
        start = time.perf_counter()
        run_all(client, [client.submit(spec(["true", "{cc}"], array=f"1-{n}"))])
        rate = n / (time.perf_counter() - start)
        cpu.setdefault(f"window{window}_broker_cpu_us_per_task", []).append((cpu_seconds(pids[0]) - broker0) / n * 1e6)
        cpu.setdefault(f"window{window}_all_ranks_cpu_us_per_task", []).append(
            (sum(map(cpu_seconds, pids)) - all0) / n * 1e6)
        return rate


def jobs8(n: int, window: int, cpu: dict[str, list[float]]) -> float:
    """Jobs/s of n single test-executor `true` jobs on 4 ranks x 2 cores; appends the broker's CPU time per job
    (µs) to `cpu`. The warm-up's jobs have the same argv: their run times make the shape known as small."""
    with (local_cluster(4, test_exec=True, resources="cores=2", dispatch_window=window) as cluster,
          cluster.client() as client):
        run_all(client, submit_ids(client, [spec(["true"])] * 200))
        broker = cluster.procs[0].pid
        broker0 = cpu_seconds(broker)
        start = time.perf_counter()
        run_all(client, submit_ids(client, [spec(["true"])] * n))
        rate = n / (time.perf_counter() - start)
        cpu.setdefault(f"window{window}_broker_cpu_us_per_job", []).append((cpu_seconds(broker) - broker0) / n * 1e6)
        return rate


def realjobs(n: int, window: int) -> float:
    """Jobs/s of n single /bin/true jobs on 2 ranks x IN_FLIGHT/2 cores (real executor), submissions included."""
    with (local_cluster(2, resources=f"cores={IN_FLIGHT // 2}", dispatch_window=window) as cluster,
          cluster.client() as client):
        run_all(client, submit_ids(client, [spec(["/bin/true"])] * 50))  # warm-up: the shape's run time
        start = time.perf_counter()
        run_all(client, submit_ids(client, [spec(["/bin/true"])] * n))
        return n / (time.perf_counter() - start)


def real(n: int, window: int) -> float:
    """Tasks/s of an n-element /bin/true array on 2 ranks x IN_FLIGHT/2 cores."""
    with (local_cluster(2, resources=f"cores={IN_FLIGHT // 2}", dispatch_window=window) as cluster,
          cluster.client() as client):
        run_all(client, [client.submit(spec(["/bin/true"], array="1-50"))])  # warm-up
        start = time.perf_counter()
        run_all(client, [client.submit(spec(["/bin/true"], array=f"1-{n}"))])
        return n / (time.perf_counter() - start)


def interleaved(runs: int, contenders: dict[str, Any]) -> dict[str, list[float]]:
    names = list(contenders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            rates[name].append(contenders[name]())
            progress(f"run {i + 1}/{runs}: {name} {rates[name][-1]:,.0f} tasks/s")
    return rates


def report(rates: dict[str, list[float]], base: str) -> dict[str, Any]:
    out: dict[str, Any] = {name: {"runs": r, "median": statistics.median(r)} for name, r in rates.items()}
    for name, r in rates.items():
        if name != base:
            ratios = [a / b for a, b in zip(r, rates[base], strict=True)]
            out[f"{name}_vs_{base}"] = {"runs": ratios, "median": statistics.median(ratios)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small arrays")
    parser.add_argument("--windows", default="0,4", help="dispatch_window settings, comma-separated")
    parser.add_argument("--only", choices=("slots8", "jobs8", "real", "realjobs"), default=None)
    parser.add_argument("--jobs", type=int, default=None, help="single jobs of the jobs8 case (default 20,000)")
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    n8, nreal, njobs = (5_000, 500, 2_000) if args.quick else (40_000, 4_000, 20_000)
    njobs = args.jobs or njobs
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "loadavg_start": loadavg(), "runs": args.runs}}
    if args.only in (None, "slots8"):
        cpu: dict[str, list[float]] = {}
        rates = interleaved(args.runs, {f"window{w}": (lambda w=w: slots8(n8, w, cpu)) for w in windows})
        results["slots8"] = {"tasks": n8, **report(rates, f"window{windows[0]}"),
                             "cpu": {name: {"runs": r, "median": statistics.median(r)} for name, r in cpu.items()}}
    if args.only in (None, "jobs8"):
        cpu = {}
        rates = interleaved(args.runs, {f"window{w}": (lambda w=w: jobs8(njobs, w, cpu)) for w in windows})
        results["jobs8"] = {"jobs": njobs, **report(rates, f"window{windows[0]}"),
                            "cpu": {name: {"runs": r, "median": statistics.median(r)} for name, r in cpu.items()}}
    if args.only in (None, "realjobs"):
        rates = interleaved(args.runs, {f"window{w}": (lambda w=w: realjobs(nreal, w)) for w in windows})
        results["realjobs"] = {"jobs": nreal, **report(rates, f"window{windows[0]}")}
    if args.only in (None, "real"):
        contenders: dict[str, Any] = {f"window{w}": (lambda w=w: real(nreal, w)) for w in windows}
        contenders["raw_posix_spawn"] = lambda: spawn_raw(nreal)
        rates = interleaved(args.runs, contenders)
        results["real"] = {"tasks": nreal, **report(rates, f"window{windows[0]}")}
        for w in windows:
            ratios = [a / b for a, b in zip(rates[f"window{w}"], rates["raw_posix_spawn"], strict=True)]
            results["real"][f"window{w}_vs_raw"] = {"runs": ratios, "median": statistics.median(ratios)}
    results["machine"]["loadavg_end"] = loadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
