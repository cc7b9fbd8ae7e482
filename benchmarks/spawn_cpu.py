"""The worker agent's CPU time per spawned task (issue 17 item 2): a benchmark, not a timed test.

    python benchmarks/spawn_cpu.py [--json] [--runs N] [--tasks N] [--cores N] [--helpers 0,1,2]
    python benchmarks/spawn_cpu.py --trees before=/path/to/old/checkout,after=.   # interleaved comparison

A `LocalCluster` of 2 ranks with broker_runs_tasks = false, so rank 1 runs every task and its process is the
worker agent alone.  After a warm-up array, one array of --tasks `/bin/true` (real executor, --cores slots) runs
to completion; the figure is rank 1's utime + stime (/proc/PID/stat) over that array divided by the tasks: CPU
time, which the other tenants of a shared machine disturb much less than the wall clock.  The same for the thread
that runs the worker's event loop alone (/proc/PID/task/PID/stat): what spawning costs the loop.  Two output modes:
`streamed` (no `output`: stdout and stderr go back to rank 0 through the worker's pipes) and `to_file`
(`output = /dev/null`: no pipes).

--helpers lists `spawn_helpers` settings to compare (docs/architecture.md, "Spawn helpers"), interleaved run by
run in this one invocation: then `helpers_cpu_us_per_task` is the helper processes' own CPU (not their tasks'),
`total_cpu_us_per_task` the agent's and the helpers' together, and `ratio_over_helpers_0` each setting's figures
over inline spawning's, median of the run-by-run ratios.

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
from procstat import cpu_seconds

from minicluster.testing import LocalCluster

MODES = {"streamed": {}, "to_file": {"output": "/dev/null"}}


def helpers_of(pid: int) -> list[int]:
    """The spawn helpers among a process's children."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = f.read().split()
    found = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"worker.spawnhelper" in f.read():
                found.append(int(child))
    return found


def measure(tasks: int, cores: int, mode: str, helpers: int | None = None) -> dict[str, float]:
    """Rank 1's CPU µs per task (all of it, and its event loop's thread alone; with `helpers` set, also its spawn
    helpers') and the wall-clock tasks/s of one `tasks`-element /bin/true array."""
    spec: dict[str, Any] = {"argv": ["/bin/true"], "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp", **MODES[mode]}
    settings: dict[str, Any] = {} if helpers is None else {"spawn_helpers": helpers}
    with (tempfile.TemporaryDirectory(prefix="mc-spawn-") as state_dir,
          LocalCluster(state_dir, size=2, resources=f"cores={cores}", broker_runs_tasks=False, **settings) as cluster,
          cluster.client() as client):
        worker = cluster.procs[1].pid
        for count in (50, tasks):  # the warm-up starts the helpers
            spawners = helpers_of(worker)
            cpu0, loop0, start = cpu_seconds(worker), cpu_seconds(worker, worker), time.perf_counter()
            helpers0 = sum(cpu_seconds(pid) for pid in spawners)
            job = client.submit({**spec, "array": f"1-{count}"})
            bad = [r for r in client.wait([job]) if r["status"] != 0]
            if bad:
                raise RuntimeError(f"array failed: {bad[0]}")
            wall, cpu = time.perf_counter() - start, cpu_seconds(worker) - cpu0
            loop = cpu_seconds(worker, worker) - loop0
            helper_cpu = sum(cpu_seconds(pid) for pid in spawners) - helpers0
    figures = {"worker_cpu_us_per_task": 1e6 * cpu / tasks, "loop_thread_cpu_us_per_task": 1e6 * loop / tasks,
               "tasks_per_s": tasks / wall}
    if helpers is not None:
        figures.update(helpers_cpu_us_per_task=1e6 * helper_cpu / tasks,
                       total_cpu_us_per_task=1e6 * (cpu + helper_cpu) / tasks)
    return figures


def one_run(args: argparse.Namespace, turn: int = 0) -> dict[str, dict[str, float]]:
    if not args.helpers:
        return {mode: measure(args.tasks, args.cores, mode) for mode in MODES}
    settings = [int(n) for n in args.helpers.split(",")]
    order = settings[turn % len(settings):] + settings[:turn % len(settings)]  # each setting goes first in turn
    run = {f"{mode} helpers={n}": measure(args.tasks, args.cores, mode, n) for n in order for mode in MODES}
    return {group: run[group] for group in sorted(run)}


def ratios_over_inline(runs: list[dict[str, dict[str, float]]], settings: list[int]) -> dict[str, Any]:
    """Each helpers setting's figures over helpers=0's of the same run and mode, median over the runs."""
    out: dict[str, Any] = {}
    for n in settings[1:]:
        for mode in MODES:
            base, group = f"{mode} helpers={settings[0]}", f"{mode} helpers={n}"
            out[group] = {k: statistics.median(r[group][k] / r[base][k] for r in runs)
                          for k in runs[0][group] if r_has(runs, base, k)}
    return out


def r_has(runs: list[dict[str, dict[str, float]]], group: str, key: str) -> bool:
    return all(run[group].get(key) for run in runs)


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
    parser.add_argument("--helpers", help="spawn_helpers settings to compare, interleaved, the first the base of"
                        " the ratios: 0,1,2")
    args = parser.parse_args()
    results: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()], "tasks": args.tasks,
                               "cores": args.cores}
    if args.trees:
        results.update(interleaved(args))
    else:
        runs = [one_run(args, i) for i in range(args.runs)]
        results["runs"] = runs
        results["median"] = {group: {k: statistics.median(r[group][k] for r in runs) for k in runs[0][group]}
                             for group in runs[0]}
        if args.helpers:
            settings = [int(n) for n in args.helpers.split(",")]
            results[f"ratio_over_helpers_{settings[0]}"] = ratios_over_inline(runs, settings)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2) if args.json else json.dumps(results.get("median")))


if __name__ == "__main__":
    main()
