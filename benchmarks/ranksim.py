"""Rank 0 at 1,000+ ranks, measured with the rank simulator (minicluster/testing/ranksim.py; issue 29).

    python benchmarks/ranksim.py [--ranks 1000,4000] [--processes 4] [--tasks 100000] [--idle 20] [--fanout 32]
                                 [--nice 10] [--interior-first] [--json]

Rank 0 is the real broker process (test executor, journal on, 64 cores a rank); every other rank is a simulated
leaf: the real WorkerAgent with the test executor on its own CURVE DEALER, many to a process. What is left out:
process start, and the per-task process work of a real worker (spawn, cgroups, output pipes). The simulator
processes share this machine's cores with rank 0, so rates are lower bounds; CPU per task and per second are
rank 0's own (utime + stime from /proc).

For each size N: the time until every rank has joined, from the first simulator's first connect (polled through
`status` every 0.2 s); rank 0's CPU per second while idle (heartbeats every 1 s only); rank 0's settled RSS, and
per rank against a small instance (`--base` ranks); an array of `--tasks` elements over all ranks: tasks/s and
rank 0's CPU per task; the answer times of `status`, `resources` and HTTP `/status` (medians of 5; `mc status` and
`mc resources` as commands, medians of 3); one exclusive
job on `--gang` nodes from submit to its end (median of 3). The same array at `--base` ranks gives the ratio the
issue asks for (≥ 90 % of the small rate); so does an array at `--base` ranks with as many tasks per core as the
big instance's (`array_rate_vs_base_same_tasks_per_core`), since 100,000 tasks queue on a small instance's cores
but all start at once on a big one's. With `--fanout`, the interior ranks are real workers; `--nice` runs them and
the simulators at a lower priority than rank 0, which would have a node to itself; `--interior-first` starts the
simulators once the interior ranks are up, so that join_s does not count hundreds of Python start-ups one after
another on this machine's cores (`interior_up_s` says how long those took).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from procstat import cpu_seconds, status_kib
from throughput import loadavg, progress, run_all, settled_rss, spec

from minicluster.testing.ranksim import SimulatedCluster, raise_fd_limit

GOALS = {  # name: (goal, "min" | "max"), from issue 29 (10,000 ranks)
    "join_s": (10.0, "max"),
    "idle_cpu_fraction": (0.02, "max"),
    "rss_kb_per_rank": (20.0, "max"),
    "array_rate_vs_base": (0.90, "min"),
    "status_ms": (100.0, "max"),
    "resources_ms": (100.0, "max"),
    "http_status_ms": (100.0, "max"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answer_ms(call: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def command_ms(uri: str, command: str) -> float:
    """`mc COMMAND` as a user types it: a new process, which prints the table."""
    argv = [sys.executable, "-m", "minicluster", command]
    env = {**os.environ, "MC_URI": uri}
    return answer_ms(lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True), repeats=3)


def array_rate(sim: SimulatedCluster, tasks: int) -> dict[str, float]:
    """Tasks/s, and the CPU per task of rank 0, of the interior ranks together and of the simulators together: on
    one machine the rate is bound by their sum, not by rank 0's alone."""
    parts = {"broker": [sim.broker_pid], "interior": [sim.local.procs[r].pid for r in sim.interior],
             "simulators": [proc.pid for proc in sim.simulators]}
    with sim.local.client() as client:
        run_all(client, [client.submit(spec(["true"], array="1-100"))])  # warm-up
        cpu0, start = {k: sum(map(cpu_seconds, pids)) for k, pids in parts.items()}, time.perf_counter()
        run_all(client, [client.submit(spec(["true", "{cc}"], array=f"1-{tasks}"))])
        elapsed = time.perf_counter() - start
    out = {"array_tasks_per_s": tasks / elapsed}
    for part, pids in parts.items():
        out[f"array_{part}_cpu_us_per_task"] = (sum(map(cpu_seconds, pids)) - cpu0[part]) / tasks * 1e6
    return out


def gang_times(sim: SimulatedCluster, nodes: int, repeats: int = 3) -> dict[str, float]:
    """One exclusive task on each of `nodes` nodes, submit to end: matching, `run` to each rank, their `done`."""
    walls, cpus = [], []
    with sim.local.client() as client:
        for _ in range(repeats):
            cpu0, start = cpu_seconds(sim.broker_pid), time.perf_counter()
            run_all(client, [client.submit(spec(["true"], ntasks=nodes, nnodes=nodes, exclusive=True))])
            walls.append(time.perf_counter() - start)
            cpus.append(cpu_seconds(sim.broker_pid) - cpu0)
    return {"gang_nodes": nodes, "gang_ms": statistics.median(walls) * 1000,
            "gang_broker_cpu_ms": statistics.median(cpus) * 1000}


def rss_mb(pids: list[int]) -> float:
    return sum(status_kib(pid, "VmRSS") for pid in pids) / 1024


def mem_available_mb() -> float:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")) / 1024


def measure(size: int, processes: int, tasks: list[int], idle_s: float, fanout: int | None, stagger: float,
            join_timeout: float, nice: int, gang: int, interior_first: bool) -> dict[str, Any]:
    """One instance of `size` ranks; an array for each of `tasks` (the first is the main one, the rest are the
    base instance's arrays with the big ones' tasks per core)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mc-ranksim-") as state_dir, \
            SimulatedCluster(state_dir, size=size, processes=processes, fanout=fanout, stagger=stagger,
                             nice=nice, wait_interior=join_timeout if interior_first else 0.0,
                             status_port=port) as sim:
        out: dict[str, Any] = {"ranks": size, "processes": len(sim.simulators), "interior_ranks": len(sim.interior),
                               "broker_pid": sim.broker_pid, "interior_up_s": sim.interior_up_s,
                               "load_before": loadavg()}
        progress(f"{size} ranks: rank 0 is pid {sim.broker_pid}, {len(sim.interior)} interior workers")
        interior = [sim.local.procs[r].pid for r in sim.interior]
        simulators = [proc.pid for proc in sim.simulators]
        # Each part's CPU for the joins (rank 0's, unlike join_s, hardly depends on what else runs on the machine);
        # the interior ranks' so far is their start (Python, imports) and, with --interior-first, their own joins.
        join_cpu0, interior_cpu0 = cpu_seconds(sim.broker_pid), sum(map(cpu_seconds, interior))
        out["interior_start_cpu_s"] = interior_cpu0
        try:
            out["join_s"] = sim.wait_joined(timeout=join_timeout)
            progress(f"{size} ranks joined in {out['join_s']:.2f}s")
        except TimeoutError as exc:
            # Measured all the same, on the ranks that did join: how many is itself the finding.
            out["join_s"], out["joined_at_timeout"] = None, sim.joined()
            progress(str(exc))
        out["join_broker_cpu_s"] = cpu_seconds(sim.broker_pid) - join_cpu0
        out["interior_join_cpu_s"] = sum(map(cpu_seconds, interior)) - interior_cpu0
        out["simulators_join_cpu_s"] = sum(map(cpu_seconds, simulators))
        out["load_joined"] = loadavg()
        time.sleep(2.0)  # let the joins' journal writes settle before the idle window
        cpu0, inner0, start = cpu_seconds(sim.broker_pid), sum(map(cpu_seconds, interior)), time.perf_counter()
        time.sleep(idle_s)
        elapsed = time.perf_counter() - start
        out["idle_cpu_fraction"] = (cpu_seconds(sim.broker_pid) - cpu0) / elapsed
        if interior:
            interior_cpu = sum(map(cpu_seconds, interior)) - inner0
            out["interior_idle_cpu_fraction_each"] = interior_cpu / elapsed / len(interior)
        out["rss_mb"] = settled_rss(sim.broker_pid) / 2**20
        out["interior_rss_mb"], out["simulators_rss_mb"] = rss_mb(interior), rss_mb(simulators)
        out["mem_available_mb"] = mem_available_mb()
        out["load_idle"] = loadavg()
        with sim.local.client() as client:
            out["status_ms"] = answer_ms(client.status)
            out["resources_ms"] = answer_ms(client.resources)
        url = f"http://127.0.0.1:{port}/status"
        out["http_status_ms"] = answer_ms(lambda: urllib.request.urlopen(url, timeout=30).read())
        for command in ("status", "resources"):
            out[f"mc_{command}_command_ms"] = command_ms(sim.local.uri, command)
        progress(f"{size} ranks: idle {out['idle_cpu_fraction']:.1%} of a core, RSS {out['rss_mb']:.0f} MB, "
                 f"status {out['status_ms']:.0f} ms")
        if gang:
            out.update(gang_times(sim, min(gang, size)))
            progress(f"{size} ranks: {out['gang_nodes']}-node gang {out['gang_ms']:.0f} ms")
        for i, count in enumerate(tasks):
            rate = array_rate(sim, count)
            if i == 0:
                out.update(rate)
            out.setdefault("arrays", {})[count] = rate
            progress(f"{size} ranks, {count:,} tasks: {rate['array_tasks_per_s']:,.0f} tasks/s, "
                     f"{rate['array_broker_cpu_us_per_task']:.0f} µs broker CPU/task")
        out["load_after"] = loadavg()
    return out


def verdicts(result: dict[str, Any]) -> dict[str, bool]:
    met = {}
    for name, (goal, kind) in GOALS.items():
        if result.get(name) is not None:
            met[name] = result[name] <= goal if kind == "max" else result[name] >= goal
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="1000", help="comma-separated instance sizes (default 1000)")
    parser.add_argument("--base", type=int, default=64, help="the small instance to compare with (default 64)")
    parser.add_argument("--processes", type=int, default=4, help="simulator processes (default 4)")
    parser.add_argument("--fanout", type=int, default=0, help="tree fanout (default: flat, every rank under rank 0)")
    parser.add_argument("--tasks", type=int, default=100_000, help="array elements (default 100,000; 0: none)")
    parser.add_argument("--idle", type=float, default=20.0, help="idle window in seconds (default 20)")
    parser.add_argument("--stagger", type=float, default=0.0, help="spread the connects over S seconds (default 0)")
    parser.add_argument("--join-timeout", type=float, default=60.0, help="give up waiting for joins (default 60 s)")
    parser.add_argument("--nice", type=int, default=0, help="run interior ranks and simulators under nice -n N")
    parser.add_argument("--gang", type=int, default=256, help="nodes of the exclusive job timed (default 256; 0: none)")
    parser.add_argument("--interior-first", action="store_true",
                        help="start the simulators once the interior ranks are up (their start is not in join_s)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args()
    raise_fd_limit()
    sizes = [int(n) for n in args.ranks.split(",")]
    fanout = args.fanout or None
    # The base instance's arrays with each big instance's tasks per core.
    same_per_core = {size: max(1, round(args.tasks * args.base / size)) for size in sizes} if args.tasks else {}
    base_tasks = list(dict.fromkeys([args.tasks, *same_per_core.values()])) if args.tasks else []
    base = measure(args.base, min(args.processes, 2), base_tasks, args.idle, fanout, 0.0, args.join_timeout,
                   args.nice, args.gang, args.interior_first)
    results = []
    for size in sizes:
        result = measure(size, args.processes, [args.tasks] if args.tasks else [], args.idle, fanout, args.stagger,
                         args.join_timeout, args.nice, args.gang, args.interior_first)
        result["rss_kb_per_rank"] = (result["rss_mb"] - base["rss_mb"]) * 1024 / (size - args.base)
        if args.tasks:
            result["array_rate_vs_base"] = result["array_tasks_per_s"] / base["array_tasks_per_s"]
            small = base["arrays"][same_per_core[size]]
            result["base_tasks_same_per_core"] = same_per_core[size]
            result["array_rate_vs_base_same_tasks_per_core"] = result["array_tasks_per_s"] / small["array_tasks_per_s"]
        result["goals_met"] = verdicts(result)
        results.append(result)
    doc = {"benchmark": "ranksim", "machine": {"cpus": len(os.sched_getaffinity(0)),
                                                 "python": platform.python_version()},
           "tasks": args.tasks, "idle_s": args.idle, "stagger_s": args.stagger, "fanout": args.fanout or "flat",
           "nice": args.nice, "processes": args.processes, "interior_first": args.interior_first,
           "base": base,
           "sizes": results, "goals": {k: list(v) for k, v in GOALS.items()}}
    print(json.dumps(doc, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
