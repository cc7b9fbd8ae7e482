"""The worker agent's CPU time per spawned task (issue 17 item 2): a benchmark, not a timed test.

    python benchmarks/spawn_cpu.py [--json] [--runs N] [--tasks N] [--cores N]
    python benchmarks/spawn_cpu.py --trees before=/path/to/old/checkout,after=.   # interleaved comparison

A `LocalCluster` of 2 ranks with broker_runs_tasks = false, so rank 1 runs every task and its process is the
worker agent alone.  After a warm-up array, one array of --tasks `/bin/true` (real executor, --cores slots) runs
to completion; the figure is rank 1's utime + stime (/proc/PID/stat) over that array divided by the tasks: CPU
time, which the other tenants of a shared machine disturb much less than the wall clock.  The same for the thread
that runs the worker's event loop alone (/proc/PID/task/PID/stat): what spawning costs the loop.  Two output modes:
`streamed` (no `output`: stdout and stderr go back to rank 0 through the worker's pipes) and `to_file`
(`output = /dev/null`: no pipes).

With --trees each run is a fresh interpreter whose PYTHONPATH is that tree (started in a scratch directory, so
the tree decides which minicluster the ranks run), the trees taking turns run by run; ratios are run by run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import trees

from minicluster.testing import LocalCluster

CLK_TCK = os.sysconf("SC_CLK_TCK")
MODES = {"streamed": {}, "to_file": {"output": "/dev/null"}}


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of process `pid`, or of its thread `tid` alone."""
    with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def measure(tasks: int, cores: int, mode: str) -> dict[str, float]:
    """Rank 1's CPU µs per task (all of it, and its event loop's thread alone) and the wall-clock tasks/s of one
    `tasks`-element /bin/true array."""
    spec: dict[str, Any] = {"argv": ["/bin/true"], "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp", **MODES[mode]}
    with (tempfile.TemporaryDirectory(prefix="mc-spawn-") as state_dir,
          LocalCluster(state_dir, size=2, resources=f"cores={cores}", broker_runs_tasks=False) as cluster,
          cluster.client() as client):
        worker = cluster.procs[1].pid
        for count in (50, tasks):
            cpu0, loop0, start = cpu_seconds(worker), cpu_seconds(worker, worker), time.perf_counter()
            job = client.submit({**spec, "array": f"1-{count}"})
            bad = [r for r in client.wait([job]) if r["status"] != 0]
            if bad:
                raise RuntimeError(f"array failed: {bad[0]}")
            wall, cpu = time.perf_counter() - start, cpu_seconds(worker) - cpu0
            loop = cpu_seconds(worker, worker) - loop0
    return {"worker_cpu_us_per_task": 1e6 * cpu / tasks, "loop_thread_cpu_us_per_task": 1e6 * loop / tasks,
            "tasks_per_s": tasks / wall}


def one_run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    return {mode: measure(args.tasks, args.cores, mode) for mode in MODES}


def interleaved(args: argparse.Namespace) -> dict[str, Any]:
    def argv(_name: str, _i: int) -> list[str]:
        return [os.path.abspath(__file__), "--runs", "1", "--json", "--tasks", str(args.tasks),
                "--cores", str(args.cores)]

    return trees.interleave(trees.parse_trees(args.trees), args.runs, argv,
                            lambda stdout: json.loads(stdout)["runs"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--cores", type=int, default=4, help="slots of the task-running rank")
    parser.add_argument("--trees", help="name=DIR,name=DIR: compare these checkouts, interleaved")
    args = parser.parse_args()
    results: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()], "tasks": args.tasks,
                               "cores": args.cores}
    if args.trees:
        results.update(interleaved(args))
    else:
        runs = [one_run(args) for _ in range(args.runs)]
        results["runs"] = runs
        results["median"] = {mode: {k: statistics.median(r[mode][k] for r in runs) for k in runs[0][mode]}
                             for mode in MODES}
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2) if args.json else json.dumps(results.get("median")))


if __name__ == "__main__":
    main()
