"""Broker CPU per task of two checkouts, interleaved run by run (not a timed test).

    python benchmarks/trees_cpu.py --trees base=/path/to/old/checkout,new=. [--runs N] [--cases array0,jobs]
                                   [--profile DIR]

Three cases on fresh `LocalCluster`s of 4 ranks x 2 cores with the test executor (a task ends as soon as it
starts), 8 slots (`--cores 64 --array-tasks 100000`: issue 17's 256-slot case):

array0   one array, `dispatch_window = 0` (a core is reused only after a round trip through rank 0)
array    one array, the tree's default configuration (the dispatch window where the tree has one)
jobs     a stream of plain (non-array) jobs sent with `submit_many`

Each figure is the broker's utime + stime (/proc/PID/stat) over the timed part divided by its tasks, and the
same summed over all ranks.  Where the wall time went: `broker_main_run_us_per_task` and
`broker_main_runqueue_us_per_task` (/proc/PID/schedstat of rank 0's main thread: on a CPU, and runnable but waiting
for one; their sum near the wall time per task means rank 0 never waited for a worker), `machine_busy_cpus` (the
CPUs the whole machine kept busy, /proc/stat; near the CPU count means the run was bound by CPU, not latency) and
`ranks_cpus` (the CPUs the ranks used themselves).  Each run of each tree is a fresh interpreter whose PYTHONPATH
is that tree (started in a scratch directory, so the tree decides which minicluster the ranks run); the trees take turns
run by run and the ratios are taken run by run: the machine may be shared.  --profile DIR writes a cProfile of
every rank (MC_PROFILE) of each tree's last run to DIR/<tree>-<case>-rank<N>.prof.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import trees
from procstat import CLK_TCK, cpu_seconds

CASES = ("array0", "array", "jobs")


def main_thread_sched(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread ran and waited runnable for a CPU (/proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        ran, waited, _ = f.read().split()
    return int(ran) / 1e9, int(waited) / 1e9


def machine_busy_seconds() -> float:
    """CPU seconds all of the machine's CPUs spent on anything but idling, since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(field) for field in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK  # all but idle and iowait


def spec(**fields: Any) -> dict[str, Any]:
    return {"argv": ["true"], "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp", **fields}


def measure(case: str, tasks: int, cores: int, profile: str | None) -> dict[str, float]:
    """CPU µs per task (broker, all ranks) and tasks/s of one case on a fresh cluster."""
    from minicluster.config import InstanceConfig
    from minicluster.testing import LocalCluster

    has_window = "dispatch_window" in InstanceConfig.__dataclass_fields__  # not in trees older than the window
    settings: dict[str, Any] = {"dispatch_window": 0 if case == "array0" else 32} if has_window else {}
    with tempfile.TemporaryDirectory(prefix="mc-trees-") as state_dir:
        cluster = LocalCluster(state_dir, size=4, test_exec=True, resources=f"cores={cores}", **settings)
        try:
            for rank in range(4):
                cluster.start_rank(rank, env={"MC_PROFILE": f"{profile}-rank{rank}.prof"} if profile else None)
            cluster.wait_up(timeout=60)
            with cluster.client() as client:
                # Warm-up. `wait` is a generator that waits only as it is consumed: unconsumed, the timed array
                # was queued behind the warm-up, and the dispatch window (no chains while another job waits)
                # stayed off for some runs and not others.
                list(client.wait([client.submit(spec(array="1-200"))]))
                pids = [p.pid for p in cluster.procs.values()]
                broker0, all0, start = cpu_seconds(pids[0]), sum(map(cpu_seconds, pids)), time.perf_counter()
                sched0, busy0 = main_thread_sched(pids[0]), machine_busy_seconds()
                if case == "jobs":
                    ids = [i for chunk in range(0, tasks, 1000)
                           for i in client.submit_many([spec()] * min(1000, tasks - chunk)) if isinstance(i, int)]
                else:
                    ids = [client.submit(spec(array=f"1-{tasks}"))]
                bad = [r for r in client.wait(ids) if r["status"] != 0]
                if bad:
                    raise RuntimeError(f"{len(bad)} job(s) failed, first: {bad[0]}")
                wall = time.perf_counter() - start
                broker, total = cpu_seconds(pids[0]) - broker0, sum(map(cpu_seconds, pids)) - all0
                (ran, waited), busy = main_thread_sched(pids[0]), machine_busy_seconds() - busy0
        finally:
            cluster.stop()
    return {"broker_cpu_us_per_task": 1e6 * broker / tasks, "all_ranks_cpu_us_per_task": 1e6 * total / tasks,
            "tasks_per_s": tasks / wall, "broker_main_run_us_per_task": 1e6 * (ran - sched0[0]) / tasks,
            "broker_main_runqueue_us_per_task": 1e6 * (waited - sched0[1]) / tasks,
            "machine_busy_cpus": busy / wall, "ranks_cpus": total / wall}


def interleaved(args: argparse.Namespace) -> dict[str, Any]:
    def argv(name: str, i: int) -> list[str]:
        one = [os.path.abspath(__file__), "--one", "--array-tasks", str(args.array_tasks), "--jobs", str(args.jobs),
               "--cases", args.cases, "--cores", str(args.cores)]
        if args.profile and i == args.runs - 1:
            one += ["--profile", os.path.join(os.path.abspath(args.profile), name)]
        return one

    return trees.interleave(trees.parse_trees(args.trees), args.runs, argv, json.loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", help="name=DIR,name=DIR: the checkouts to compare, the first is the base")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--array-tasks", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--cores", type=int, default=2, help="cores per rank")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of " + ", ".join(CASES))
    parser.add_argument("--profile", help="a directory for the cProfiles of the last run")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps({case: measure(case, args.jobs if case == "jobs" else args.array_tasks, args.cores,
                                        f"{args.profile}-{case}" if args.profile else None)
                          for case in args.cases.split(",")}))
        return
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    results: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()]}
    results.update(interleaved(args))
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
