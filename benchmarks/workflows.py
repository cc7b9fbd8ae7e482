"""Workflow costs on a real local MiniCluster, test executor on 4 ranks (not a timed test).

    python benchmarks/workflows.py [--json] [--quick] [--runs N]

chain     1,000 jobs, each `afterok` the one before, held behind a gate job: from the gate's release to the last
          job's end. Per link: wall time and broker CPU (utime+stime), the latter little affected by the load
          of this shared machine. Goal: <= 2 ms of broker time per link.
fan-out   10,000 jobs `afterok` one parent: from the parent's end to the last dependant's start.
fan-in    1 job `afterok` 10,000 parents: from the last parent's end to the dependant's start.
retries   a 100,000-element array where 1 % of the indexes fail their first attempt and succeed on retry
          (`--max-retries-per-index 1`; the test executor's MC_TEST_FAIL_ONCE) against the plain array, run by
          run in the same session, each on a fresh cluster, order alternating: throughput ratio, and the ratio
          of broker CPU per task. Goal: >= 0.90.

Times come from the broker's job records (t_run, t_inactive). Medians of --runs runs; --quick runs small sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import cpu_seconds
from throughput import compare, loadavg, local_cluster, progress, run_all, spec, submit_ids

from minicluster.client import Client


@dataclass(frozen=True)
class Sizes:
    chain: int
    fan: int
    array: int


FULL = Sizes(chain=1_000, fan=10_000, array=100_000)
QUICK = Sizes(chain=200, fan=2_000, array=20_000)
FAIL_EVERY = 100   # 1 % of the indexes fail once
TARGETS = {"chain_broker_cpu_ms_per_link": (2.0, "max"), "retry_vs_plain_array": (0.90, "min")}
PUBLISHED = {
    "Slurm": "dependent jobs start at the next scheduling pass after the parent ends: seconds per link",
    "Flux": "dependency plugins release a job at its parent's end; a chain link costs job-manager event "
            "round trips plus scheduling, typically tens of ms to seconds",
    "Kubernetes Job": "pod failure policy and backoffLimitPerIndex retry with a 10 s exponential backoff; each "
                      "attempt is a new pod (~45-52 pods/s)",
}


def cluster() -> Any:
    return local_cluster(4, test_exec=True, resources="cores=64")


def gate(client: Client) -> int:
    return client.submit(spec(["true"], name="gate", hold=True))


def summaries(client: Client, ids: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for start in range(0, len(ids), 10_000):
        out += client.jobs(ids=ids[start:start + 10_000], limit=10_000)
    return out


def release_and_wait(client: Client, gate_id: int, ids: list[int], broker: int) -> tuple[float, float]:
    """Release the gate, wait for `ids`; returns the broker CPU seconds and wall seconds it took."""
    cpu0, t0 = cpu_seconds(broker), time.perf_counter()
    client.release([gate_id])
    run_all(client, ids)
    return cpu_seconds(broker) - cpu0, time.perf_counter() - t0


# --- experiments ------------------------------------------------------------------------------------------

def chain_run(n: int) -> dict[str, float]:
    with cluster() as c, c.client() as client:
        run_all(client, submit_ids(client, [spec(["true"])] * 100))    # warm-up
        g = gate(client)
        specs = [spec(["true"], dependencies=[{"type": "afterok", "jobs": [g + k]}]) for k in range(n)]
        ids = submit_ids(client, specs)
        if ids != list(range(g + 1, g + n + 1)):
            raise RuntimeError("chain ids were not consecutive (another client submitted meanwhile)")
        cpu, wall = release_and_wait(client, g, ids, c.procs[0].pid)
        first, last = summaries(client, [g, ids[-1]])
    return {"chain_wall_ms_per_link": (last["t_inactive"] - first["t_inactive"]) / n * 1e3,
            "chain_broker_cpu_ms_per_link": cpu / n * 1e3, "chain_client_wall_s": wall}


def fan_out_run(n: int) -> dict[str, float]:
    with cluster() as c, c.client() as client:
        run_all(client, submit_ids(client, [spec(["true"])] * 100))
        g = gate(client)
        ids = submit_ids(client, [spec(["true"], dependencies=[{"type": "afterok", "jobs": [g]}])] * n)
        cpu, _ = release_and_wait(client, g, ids, c.procs[0].pid)
        jobs = summaries(client, [g, *ids])
    parent_end = jobs[0]["t_inactive"]
    last_start = max(j["t_run"] for j in jobs[1:])
    return {"fan_out_s": last_start - parent_end, "fan_out_broker_cpu_us_per_job": cpu / n * 1e6}


def fan_in_run(n: int) -> dict[str, float]:
    with cluster() as c, c.client() as client:
        run_all(client, submit_ids(client, [spec(["true"])] * 100))
        g = gate(client)
        parents = submit_ids(client, [spec(["true"], dependencies=[{"type": "afterok", "jobs": [g]}])] * n)
        t0 = time.perf_counter()
        child = client.submit(spec(["true"], dependencies=[{"type": "afterok", "jobs": parents}]))
        submit_s = time.perf_counter() - t0
        release_and_wait(client, g, [*parents, child], c.procs[0].pid)
        jobs = summaries(client, [*parents, child])
    last_parent_end = max(j["t_inactive"] for j in jobs[:-1])
    return {"fan_in_ms": (jobs[-1]["t_run"] - last_parent_end) * 1e3, "fan_in_submit_s": submit_s}


def array_rate(client: Client, broker: int, n: int, retries: bool) -> tuple[float, float]:
    """Tasks/s of an n-element array, and the broker's CPU microseconds per task."""
    # Both arrays carry MC_TEST_FAIL_ONCE (the plain one names an index it does not have), so the test
    # executor's own check costs both the same and only the retries and their policy differ.
    failing = f"0-{n - 1}:{FAIL_EVERY}" if retries else str(n)
    fields: dict[str, Any] = {"array": f"0-{n - 1}", "env": {"PATH": os.environ["PATH"], "MC_TEST_FAIL_ONCE": failing}}
    if retries:
        fields.update(max_retries_per_index=1)
    cpu0, t0 = cpu_seconds(broker), time.perf_counter()
    job_id = client.submit(spec(["true", "{cc}"], **fields))
    run_all(client, [job_id])
    rate, cpu = n / (time.perf_counter() - t0), (cpu_seconds(broker) - cpu0) / n * 1e6
    if retries and client.job(job_id)["retries"] != n // FAIL_EVERY:
        raise RuntimeError(f"expected {n // FAIL_EVERY} retries, got {client.job(job_id)['retries']}")
    return rate, cpu


def retries_run(n: int, first_plain: bool) -> dict[str, float]:
    """The plain and the retried array, each on a fresh cluster (a journal already holding 100,000 results
    costs more to write to), in alternating order run by run."""
    rates = {}
    for kind in ([False, True] if first_plain else [True, False]):
        with cluster() as c, c.client() as client:
            run_all(client, [client.submit(spec(["true"], array="1-1000"))])   # warm-up
            rates[kind] = array_rate(client, c.procs[0].pid, n, kind)
    return {"plain_array_tasks_per_s": rates[False][0], "retry_array_tasks_per_s": rates[True][0],
            "retry_vs_plain_array": rates[True][0] / rates[False][0],
            "plain_array_broker_cpu_us_per_task": rates[False][1],
            "retry_array_broker_cpu_us_per_task": rates[True][1],
            "retry_vs_plain_array_cpu_bound": rates[False][1] / rates[True][1]}


def repeat(name: str, runs: int, fn: Any, *args: Any) -> dict[str, Any]:
    per_run = []
    for i in range(runs):
        call: Any = fn  # retries_run also takes the run's order
        per_run.append(call(*args) if fn is not retries_run else call(*args, i % 2 == 0))
        progress(f"{name} run {i + 1}/{runs}: " + ", ".join(f"{k} {v:,.3f}" for k, v in per_run[-1].items()))
    return {"runs": per_run, "median": {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}}


# --- report -----------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--runs", type=int, default=None, help="runs per experiment (3, or 1 with --quick)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (1 if args.quick else 3)
    if runs < 1:
        parser.error("--runs must be at least 1")
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": loadavg(), "quick": args.quick,
                               "runs": runs, "python": platform.python_version(), "ranks": 4,
                               "cores_per_rank": 64, "executor": "test"}
    results: dict[str, Any] = {"machine": machine, "sizes": sizes.__dict__}
    results["chain"] = repeat("chain", runs, chain_run, sizes.chain)
    results["fan_out"] = repeat("fan-out", runs, fan_out_run, sizes.fan)
    results["fan_in"] = repeat("fan-in", runs, fan_in_run, sizes.fan)
    results["retries"] = repeat("retries", 2 * runs, retries_run, sizes.array)
    machine["loadavg_end"] = loadavg()
    median = {k: v for part in ("chain", "fan_out", "fan_in", "retries") for k, v in results[part]["median"].items()}
    results["targets"] = compare(median, TARGETS)
    results["published"] = PUBLISHED
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"load average {machine['loadavg_start']} -> {machine['loadavg_end']}, {machine['cpus']} CPUs, "
          f"{runs} runs{' (quick)' if args.quick else ''}")
    for key, value in median.items():
        print(f"{key:<36} {value:,.3f}")
    for row in results["targets"]:
        op = ">=" if row["kind"] == "min" else "<="
        print(f"{row['name']:<36} {row['value']:,.3f} vs {op} {row['target']}: "
              f"{'met' if row['met'] else 'MISSED'} (x{row['ratio']:.2f})")


if __name__ == "__main__":
    main()
