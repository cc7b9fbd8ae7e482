"""End-to-end throughput and memory of a real local MiniCluster (not a timed test).

    python benchmarks/throughput.py [--json] [--quick] [--runs N]

Three experiments, each on fresh `LocalCluster`s (one process per rank, journal on):

control   test executor (tasks end instantly), 4 ranks of 64 cores: one 100k-task array and
          20k individual jobs (pipelined submit-many), submit -> all complete.  Besides the
          wall-clock rate, the broker's CPU time per task (utime+stime from /proc/PID/stat),
          which does not depend much on the load of this shared machine.
spawn     `/bin/true` tasks, 8 in flight, four spawners interleaved run by run: a MiniCluster
          array on 2 ranks of 4 cores (real executor), the same with broker_runs_tasks = false
          (a third rank, rank 0, runs no task), a bare `os.posix_spawn` loop that keeps 8
          children alive (the machine's limit), and HyperQueue 0.27 (one worker of 8 CPUs, its
          server and worker run inside this process).  Ratios are taken run by run.
memory    broker VmRSS with 1,000,000 queued array tasks (every rank drained first), and RSS
          growth per retained finished job over 20k jobs.

Cluster start-up is never timed.  Medians of --runs runs are reported; --quick runs small sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procstat import cpu_seconds, status_kib

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minicluster.client import Client
from minicluster.testing import LocalCluster


@dataclass(frozen=True)
class Sizes:
    array_tasks: int
    jobs: int
    spawn_tasks: int
    queued_tasks: int
    retained_jobs: int
    sweep: tuple[int, ...]  # array sizes whose per-task cost is compared; the last two give the ratio


FULL = Sizes(array_tasks=100_000, jobs=20_000, spawn_tasks=4_000, queued_tasks=1_000_000, retained_jobs=20_000,
             sweep=(10_000, 100_000, 1_000_000))
QUICK = Sizes(array_tasks=10_000, jobs=2_000, spawn_tasks=400, queued_tasks=100_000, retained_jobs=2_000,
              sweep=(1_000, 10_000, 100_000))
IN_FLIGHT = 8
RETAIN_CHUNK = 1000
TARGETS = {  # name: (target, "min" | "max")
    "array_tasks_per_s": (20_000.0, "min"),
    "sweep_largest_vs_middle": (0.90, "min"),
    "spawn_vs_raw": (0.85, "min"),
    "spawn_vs_hyperqueue": (1.0, "min"),
    "queued_1m_rss_mb": (300.0, "max"),
    "bytes_per_retained_job": (2048.0, "max"),
}
PUBLISHED = {
    "Kubernetes": "~45-52 pods/s",
    "Kueue": "~43-51 admissions/s",
    "Flux": "~140 jobs/s end-to-end (mock execution); 20-32 KB per retained job",
    "HyperQueue": "86-191k tasks/s zero-worker mode on 128-core nodes; 200k tasks in ~120 MiB",
}


# --- helpers ---------------------------------------------------------------------------------------------


def settled_rss(pid: int, quiet: float = 1.0, timeout: float = 60.0) -> int:
    """VmRSS once it has not moved by more than 1% for `quiet` seconds (the broker finished its work)."""
    deadline = time.time() + timeout
    last, since = status_kib(pid, "VmRSS") * 1024, time.time()
    while time.time() < deadline:
        time.sleep(0.2)
        now = status_kib(pid, "VmRSS") * 1024
        if abs(now - last) > last / 100:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            return now
    return status_kib(pid, "VmRSS") * 1024


def spec(argv: list[str], **fields: Any) -> dict[str, Any]:
    """A jobspec map, as tests/integration/conftest.py:job() builds them."""
    return {"argv": argv, "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp", **fields}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def progress(message: str) -> None:
    """One line on stderr, so that a long run shows where it is without disturbing --json on stdout."""
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {message}", file=sys.stderr, flush=True)


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    """`runs` plus the median of each metric."""
    return {"runs": runs, "median": {k: statistics.median(r[k] for r in runs) for k in runs[0]}}


@contextlib.contextmanager
def local_cluster(size: int, **settings: Any) -> Iterator[LocalCluster]:
    with (tempfile.TemporaryDirectory(prefix="mc-bench-") as state_dir,
          LocalCluster(state_dir, size=size, **settings) as cluster):
        yield cluster


@contextlib.contextmanager
def silenced_fds() -> Iterator[None]:
    """Send fds 1 and 2 to /dev/null (HyperQueue's server prints a banner and a progress bar)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def run_all(client: Client, job_ids: list[int]) -> None:
    """Wait for every job of `job_ids`; raise unless each ended with status 0."""
    bad = [r for r in client.wait(job_ids) if r["status"] != 0]
    if bad:
        raise RuntimeError(f"{len(bad)} job(s) failed, first: {bad[0]}")


def submit_ids(client: Client, specs: list[dict[str, Any]]) -> list[int]:
    ids = client.submit_many(specs)
    errors = [e for e in ids if not isinstance(e, int)]
    if errors:
        raise RuntimeError(f"{len(errors)} submission(s) refused, first: {errors[0]!r}")
    return [i for i in ids if isinstance(i, int)]


# --- control plane ---------------------------------------------------------------------------------------

def array_run(cluster: LocalCluster, client: Client, n: int) -> dict[str, float]:
    """One n-task test-executor array, submit -> complete: its rate and the CPU time per task of the broker and of
    all ranks."""
    pids = [p.pid for p in cluster.procs.values()]
    broker = cluster.procs[0].pid
    cpu0, all0, start = cpu_seconds(broker), sum(map(cpu_seconds, pids)), time.perf_counter()
    run_all(client, [client.submit(spec(["true", "{cc}"], array=f"1-{n}"))])
    elapsed = time.perf_counter() - start
    return {
        "array_tasks_per_s": n / elapsed,
        "array_broker_cpu_us_per_task": (cpu_seconds(broker) - cpu0) / n * 1e6,
        "array_all_ranks_cpu_us_per_task": (sum(map(cpu_seconds, pids)) - all0) / n * 1e6,
    }


def control_plane_run(sizes: Sizes) -> dict[str, float]:
    """One 4-rank test-executor cluster: a big array, then many single jobs."""
    with local_cluster(4, test_exec=True, resources="cores=64") as cluster, cluster.client() as client:
        broker = cluster.procs[0].pid
        run_all(client, submit_ids(client, [spec(["true"])] * 100))  # warm-up
        array = array_run(cluster, client, sizes.array_tasks)

        cpu0, start = cpu_seconds(broker), time.perf_counter()
        ids = submit_ids(client, [spec(["true"])] * sizes.jobs)
        submitted_s = time.perf_counter() - start
        run_all(client, ids)
        jobs_s = time.perf_counter() - start
        jobs_cpu = cpu_seconds(broker) - cpu0
    return {
        **array,
        "jobs_per_s": sizes.jobs / jobs_s,
        "jobs_submit_per_s": sizes.jobs / submitted_s,
        "jobs_broker_cpu_us_per_job": jobs_cpu / sizes.jobs * 1e6,
    }


def control_plane(sizes: Sizes, runs: int) -> dict[str, Any]:
    per_run = []
    for i in range(runs):
        per_run.append(control_plane_run(sizes))
        progress(f"control run {i + 1}/{runs}: {per_run[-1]['array_tasks_per_s']:,.0f} array tasks/s, "
                 f"{per_run[-1]['jobs_per_s']:,.0f} jobs/s")
    result = summary(per_run)
    med = result["median"]
    # What one dedicated broker core could sustain at the measured CPU cost: robust to the machine's load.
    med["array_cpu_bound_tasks_per_s"] = 1e6 / med["array_broker_cpu_us_per_task"]
    med["jobs_cpu_bound_per_s"] = 1e6 / med["jobs_broker_cpu_us_per_job"]
    return {"array_tasks": sizes.array_tasks, "jobs": sizes.jobs, "ranks": 4, "cores_per_rank": 64, **result}


def array_sweep(sizes: Sizes, runs: int) -> dict[str, Any]:
    """Arrays of each size of `sizes.sweep` on fresh 4-rank test-executor clusters, interleaved run by run (the
    order rotates); the largest size's rate over the middle one's is taken run by run."""
    rates: dict[int, list[dict[str, float]]] = {n: [] for n in sizes.sweep}
    for i in range(runs):
        order = sizes.sweep[i % len(sizes.sweep):] + sizes.sweep[:i % len(sizes.sweep)]
        for n in order:
            with local_cluster(4, test_exec=True, resources="cores=64") as cluster, cluster.client() as client:
                run_all(client, submit_ids(client, [spec(["true"])] * 100))  # warm-up
                rates[n].append(array_run(cluster, client, n))
            progress(f"sweep run {i + 1}/{runs}: array of {n:,}: {rates[n][-1]['array_tasks_per_s']:,.0f} tasks/s")
    middle, largest = sizes.sweep[-2], sizes.sweep[-1]
    ratio = [big["array_tasks_per_s"] / mid["array_tasks_per_s"]
             for big, mid in zip(rates[largest], rates[middle], strict=True)]
    cpu_ratio = [big["array_broker_cpu_us_per_task"] / mid["array_broker_cpu_us_per_task"]
                 for big, mid in zip(rates[largest], rates[middle], strict=True)]
    return {
        "ranks": 4, "cores_per_rank": 64,
        "sizes": {str(n): summary(r) for n, r in rates.items()},
        "largest_vs_middle": {"runs": ratio, "median": statistics.median(ratio)},
        "broker_cpu_largest_vs_middle": {"runs": cpu_ratio, "median": statistics.median(cpu_ratio)},
    }


# --- real processes --------------------------------------------------------------------------------------

def spawn_minicluster(n: int, broker_runs_tasks: bool = True) -> float:
    """Tasks/s of an n-task /bin/true array on 2 task-running ranks x IN_FLIGHT/2 cores (real executor); without
    broker_runs_tasks rank 0 is a third rank that runs none."""
    size = 2 if broker_runs_tasks else 3
    with (local_cluster(size, resources=f"cores={IN_FLIGHT // 2}", broker_runs_tasks=broker_runs_tasks) as cluster,
          cluster.client() as client):
        run_all(client, [client.submit(spec(["/bin/true"], array="1-50"))])  # warm-up
        start = time.perf_counter()
        run_all(client, [client.submit(spec(["/bin/true"], array=f"1-{n}"))])
        return n / (time.perf_counter() - start)


def spawn_raw(n: int) -> float:
    """Tasks/s of a bare posix_spawn loop keeping IN_FLIGHT children, each reaped as it ends."""
    actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    env = {"PATH": os.environ["PATH"]}
    running: set[int] = set()
    started = 0
    start = time.perf_counter()
    while started < n or running:
        while started < n and len(running) < IN_FLIGHT:
            running.add(os.posix_spawn("/bin/true", ["/bin/true"], env, file_actions=actions))
            started += 1
        pid, status = os.wait()
        if pid not in running or os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"unexpected child {pid} status {status}")
        running.discard(pid)
    return n / (time.perf_counter() - start)


def spawn_hyperqueue(n: int) -> float:
    """Tasks/s of an n-task /bin/true job on HyperQueue, one worker of IN_FLIGHT CPUs."""
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster as HqCluster, WorkerConfig

    def job(count: int) -> Job:
        hq_job = Job(default_workdir="/tmp", default_env={"PATH": os.environ["PATH"]})
        for _ in range(count):
            hq_job.program(["/bin/true"], stdout=os.devnull, stderr=os.devnull)
        return hq_job

    def run(client: Any, hq_job: Job) -> None:
        submitted = client.submit(hq_job)
        if client.connection.wait_for_jobs((submitted.id,), lambda _: None):
            raise RuntimeError("HyperQueue job failed")

    with (tempfile.TemporaryDirectory(prefix="hq-bench-") as server_dir, silenced_fds(),
          HqCluster(server_dir=server_dir, worker_config=WorkerConfig(cores=IN_FLIGHT)) as cluster):
        client = cluster.client()
        run(client, job(50))  # warm-up, and the worker has registered
        big = job(n)
        start = time.perf_counter()
        run(client, big)
        return n / (time.perf_counter() - start)


SPAWNERS: dict[str, Callable[[int], float]] = {
    "minicluster": spawn_minicluster, "raw_posix_spawn": spawn_raw, "hyperqueue": spawn_hyperqueue,
    "minicluster_broker_free": lambda n: spawn_minicluster(n, broker_runs_tasks=False),
}


def real_processes(sizes: Sizes, runs: int) -> dict[str, Any]:
    """The three spawners interleaved; each run rotates their order so none always goes first."""
    names = list(SPAWNERS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            rates[name].append(SPAWNERS[name](sizes.spawn_tasks))
            progress(f"spawn run {i + 1}/{runs}: {name} {rates[name][-1]:,.0f} tasks/s")
    mc = rates["minicluster"]
    vs_raw = [m / r for m, r in zip(mc, rates["raw_posix_spawn"], strict=True)]
    vs_hq = [m / h for m, h in zip(mc, rates["hyperqueue"], strict=True)]
    free_vs_raw = [m / r for m, r in zip(rates["minicluster_broker_free"], rates["raw_posix_spawn"], strict=True)]
    return {
        "tasks": sizes.spawn_tasks, "in_flight": IN_FLIGHT,
        "tasks_per_s": {name: {"runs": r, "median": statistics.median(r)} for name, r in rates.items()},
        "spawn_vs_raw": {"runs": vs_raw, "median": statistics.median(vs_raw)},
        "spawn_vs_hyperqueue": {"runs": vs_hq, "median": statistics.median(vs_hq)},
        "broker_free_spawn_vs_raw": {"runs": free_vs_raw, "median": statistics.median(free_vs_raw)},
    }


# --- memory ----------------------------------------------------------------------------------------------

def memory_queued(n: int) -> dict[str, float]:
    """Broker RSS with an n-task array queued on a cluster whose every rank is drained."""
    with local_cluster(2, test_exec=True, resources="cores=64") as cluster, cluster.client() as client:
        broker = cluster.procs[0].pid
        client.drain(range(cluster.config.size), "benchmark: keep the array queued")
        before = settled_rss(broker)
        start = time.perf_counter()
        job_id = client.submit(spec(["true", "{cc}"], array=f"1-{n}"))
        submit_s = time.perf_counter() - start
        after = settled_rss(broker)
        cpu0 = cpu_seconds(broker)
        time.sleep(2.0)
        idle_cpu = (cpu_seconds(broker) - cpu0) / 2.0
        pending = client.job(job_id)["counts"]["pending"]
        client.cancel([job_id])
    if pending != n:
        raise RuntimeError(f"expected {n} pending tasks, have {pending}")
    return {"tasks": n, "rss_before_mb": before / 2**20, "rss_mb": after / 2**20, "submit_s": submit_s,
            "broker_cpu_while_queued_pct": idle_cpu * 100}


def memory_retained(n: int) -> dict[str, float]:
    """Broker RSS growth per finished job kept in memory, over n jobs (after a warm-up)."""
    with local_cluster(2, test_exec=True, resources="cores=64") as cluster, cluster.client() as client:
        broker = cluster.procs[0].pid
        run_all(client, submit_ids(client, [spec(["true"])] * 500))  # warm-up: sqlite page cache, pools
        before = settled_rss(broker)
        # In chunks, so that the transient peak of one huge submit/wait does not count as retained memory.
        for _ in range(n // RETAIN_CHUNK):
            run_all(client, submit_ids(client, [spec(["true"])] * RETAIN_CHUNK))
        after = settled_rss(broker)
        retained = len(client.jobs(all=True, limit=n + 10_000))
    return {"jobs": n, "retained": retained, "rss_before_mb": before / 2**20, "rss_after_mb": after / 2**20,
            "bytes_per_retained_job": (after - before) / n}


def memory(sizes: Sizes) -> dict[str, Any]:
    queued = memory_queued(sizes.queued_tasks)
    progress(f"memory: {queued['rss_mb']:.0f} MB with {queued['tasks']:,} queued tasks")
    retained = memory_retained(sizes.retained_jobs)
    progress(f"memory: {retained['bytes_per_retained_job']:,.0f} B per retained job")
    return {"queued": queued, "retained": retained}


# --- report ----------------------------------------------------------------------------------------------

def target_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the experiments that ran."""
    paths = {  # target: (experiment, keys to its value)
        "array_tasks_per_s": ("control", ("median", "array_tasks_per_s")),
        "sweep_largest_vs_middle": ("sweep", ("largest_vs_middle", "median")),
        "spawn_vs_raw": ("spawn", ("spawn_vs_raw", "median")),
        "spawn_vs_hyperqueue": ("spawn", ("spawn_vs_hyperqueue", "median")),
        "queued_1m_rss_mb": ("memory", ("queued", "rss_mb")),
        "bytes_per_retained_job": ("memory", ("retained", "bytes_per_retained_job")),
    }
    values = {}
    for name, (experiment, keys) in paths.items():
        if experiment in results:
            value = results[experiment]
            for key in keys:
                value = value[key]
            values[name] = value
    return compare(values, {name: target for name, target in TARGETS.items() if name in values})


def compare(values: dict[str, float], targets: dict[str, tuple[float, str]]) -> list[dict[str, Any]]:
    """One row per target: the value, the target, and their ratio (>= 1 when met)."""
    rows = []
    for name, (target, kind) in targets.items():
        value = values[name]
        ratio = value / target if kind == "min" else target / value if value > 0 else float("inf")
        rows.append({"name": name, "value": value, "target": target, "kind": kind,
                     "ratio": ratio, "met": ratio >= 1.0})
    return rows


def control_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    cm = c["median"]
    return [
        (f"array of {c['array_tasks']:,}, test exec, 4 ranks", f"{cm['array_tasks_per_s']:,.0f} tasks/s"),
        ("  broker CPU per task", f"{cm['array_broker_cpu_us_per_task']:.1f} us "
                                  f"(one core: {cm['array_cpu_bound_tasks_per_s']:,.0f} tasks/s)"),
        ("  all ranks CPU per task", f"{cm['array_all_ranks_cpu_us_per_task']:.1f} us"),
        (f"{c['jobs']:,} jobs, submit-many -> complete", f"{cm['jobs_per_s']:,.0f} jobs/s"),
        ("  submit-many acknowledged", f"{cm['jobs_submit_per_s']:,.0f} jobs/s"),
        ("  broker CPU per job", f"{cm['jobs_broker_cpu_us_per_job']:.1f} us "
                                 f"(one core: {cm['jobs_cpu_bound_per_s']:,.0f} jobs/s)"),
    ]


def sweep_rows(w: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for n, r in w["sizes"].items():
        med = r["median"]
        rows.append((f"array of {int(n):,}, test exec, 4 ranks (sweep)", f"{med['array_tasks_per_s']:,.0f} tasks/s, "
                     f"broker {med['array_broker_cpu_us_per_task']:.1f} us/task"))
    cpu = w["broker_cpu_largest_vs_middle"]["median"]
    rows.append(("  largest / middle (run by run)",
                 f"{w['largest_vs_middle']['median']:.2f} (broker CPU per task {cpu:.2f})"))
    return rows


def spawn_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(f"/bin/true x {s['tasks']:,}, {s['in_flight']} in flight: {name}", f"{rate['median']:,.0f} tasks/s")
            for name, rate in s["tasks_per_s"].items()]
    return [
        *rows,
        ("  minicluster / raw (run by run)", f"{s['spawn_vs_raw']['median']:.2f}"),
        ("  minicluster / hyperqueue (run by run)", f"{s['spawn_vs_hyperqueue']['median']:.2f}"),
        ("  minicluster, broker runs no tasks / raw", f"{s['broker_free_spawn_vs_raw']['median']:.2f}"),
    ]


def memory_rows(mem: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f"broker RSS, {mem['queued']['tasks']:,} queued tasks", f"{mem['queued']['rss_mb']:.0f} MB "
                                                                 f"(empty {mem['queued']['rss_before_mb']:.0f} MB)"),
        (f"broker RSS per retained job ({mem['retained']['jobs']:,})",
         f"{mem['retained']['bytes_per_retained_job']:,.0f} B"),
    ]


def print_table(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(f"load average at start {m['loadavg_start']}, at end {m['loadavg_end']}, {m['cpus']} CPUs, "
          f"{m['runs']} runs{' (quick)' if m['quick'] else ''}")
    rows = [row for name, (_, show) in EXPERIMENTS.items() if name in results for row in show(results[name])]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print()
    for row in results["targets"]:
        op = ">=" if row["kind"] == "min" else "<="
        print(f"{row['name']:<{width}}  {row['value']:,.2f} vs {op} {row['target']:,.2f}: "
              f"{'met' if row['met'] else 'MISSED'} (x{row['ratio']:.2f})")


Rows = list[tuple[str, str]]
# name: (run(sizes, runs), table rows of its result)
EXPERIMENTS: dict[str, tuple[Callable[[Sizes, int], dict[str, Any]], Callable[[dict[str, Any]], Rows]]] = {
    "control": (control_plane, control_rows),
    "sweep": (array_sweep, sweep_rows),
    "spawn": (real_processes, spawn_rows),
    "memory": (lambda sizes, _runs: memory(sizes), memory_rows),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds per experiment")
    parser.add_argument("--runs", type=int, default=None, help="runs per timed experiment (3, or 2 with --quick)")
    parser.add_argument("--only", action="append", choices=list(EXPERIMENTS),
                        help="run this experiment only (repeatable); all of them by default")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (2 if args.quick else 3)
    if runs < 1:
        parser.error("--runs must be at least 1")

    machine: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": loadavg(), "quick": args.quick,
                               "runs": runs, "python": platform.python_version()}
    results: dict[str, Any] = {"machine": machine}
    for name, (run, _) in EXPERIMENTS.items():
        if not args.only or name in args.only:
            results[name] = run(sizes, runs)
    machine["loadavg_end"] = loadavg()
    results["targets"] = target_rows(results)
    results["published"] = PUBLISHED
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
