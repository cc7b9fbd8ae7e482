"""Big test-executor arrays timed the way a user times them (issue 33; not a timed test).

    python benchmarks/user_array.py [--sizes 10000,100000,1000000] [--runs 3] [--json]

Each run is a fresh `mc start --size 4 --fanout 2 --test-exec --resources cores=64 --state-dir NEW -- ...`, and
the command it runs times `mc-submit --cc 1-N --wait true` from before the client starts to its return: the
submission, the whole run and the client's wait, nothing of the cluster's start or stop. Sizes are interleaved,
the order rotating run by run, and every size is compared with 100,000 (or the smallest size above it) run by
run, so that the machine's load moves both sides of a ratio alike.

Besides the rate, the command reads what each part of the MiniCluster spent per task (the "profile" of the
issue, from /proc, cheap enough not to change the result): rank 0's threads (the event loop and the journal
writer), the three worker ranks together, and the client; rank 0's RSS before and after, and its peak. The
command's parent is rank 0 (`mc start` runs the command there) and the workers are its siblings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procstat import cpu_seconds, status_kib, threads_cpu
from sizesweep import in_turns, on_this_machine, sizes_of

MC = shutil.which("mc") or str(Path(sys.executable).with_name("mc"))
REFERENCE = 100_000


def inner(n: int) -> dict[str, Any]:
    """Run inside `mc start`: time one array from the user's command, and what each process spent on it."""
    rank0 = os.getppid()
    launcher = int(Path(f"/proc/{rank0}/stat").read_text().rsplit(")", 1)[1].split()[1])
    workers = [int(p) for p in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
               if int(p) != rank0]
    threads0, workers0, rss0 = threads_cpu(rank0), sum(cpu_seconds(w) for w in workers), \
        status_kib(rank0, "VmRSS")
    start = time.perf_counter()
    subprocess.run(["mc-submit", "--cc", f"1-{n}", "--wait", "true"], check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    threads1 = threads_cpu(rank0)
    client = resource.getrusage(resource.RUSAGE_CHILDREN)
    others = sum(threads1[t] - threads0.get(t, 0.0) for t in threads1 if t != "main")
    return {
        "tasks": n, "seconds": elapsed, "tasks_per_s": n / elapsed,
        "rank0_loop_us_per_task": (threads1["main"] - threads0["main"]) / n * 1e6,
        "rank0_other_threads_us_per_task": others / n * 1e6,
        "workers_us_per_task": (sum(cpu_seconds(w) for w in workers) - workers0) / n * 1e6,
        "client_us_per_task": (client.ru_utime + client.ru_stime) / n * 1e6,
        "rank0_rss_growth_bytes_per_task": (status_kib(rank0, "VmRSS") - rss0) * 1024 / n,
        "rank0_peak_rss_mb": status_kib(rank0, "VmHWM") / 1024,
    }


def one_run(n: int) -> dict[str, Any]:
    state = tempfile.mkdtemp(prefix="mc-user-array-")
    try:
        done = subprocess.run([MC, "start", "--size", "4", "--fanout", "2", "--test-exec", "--resources",
                               "cores=64", "--state-dir", state, "--", sys.executable, __file__, "--inner", str(n)],
                              check=True, capture_output=True, text=True)
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["journal_mb"] = sum(f.stat().st_size for f in Path(state).glob("journal.sqlite*")) / 2**20
        return result
    finally:
        shutil.rmtree(state, ignore_errors=True)


def sweep(sizes: list[int], runs: int) -> dict[str, Any]:
    per_size: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for i, n in in_turns(sizes, runs):
        per_size[n].append(one_run(n))
        print(f"run {i + 1}/{runs}: {n:,} tasks: {per_size[n][-1]['tasks_per_s']:,.0f} tasks/s, "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    reference = min((n for n in sizes if n >= REFERENCE), default=sizes[0])
    ratios = {f"{n}_vs_{reference}": [a["tasks_per_s"] / b["tasks_per_s"]
                                      for a, b in zip(per_size[n], per_size[reference], strict=True)]
              for n in sizes if n != reference}
    return {
        "sizes": {str(n): {"median": {k: statistics.median(r[k] for r in rs) for k in rs[0]}, "runs": rs}
                  for n, rs in per_size.items()},
        "rate_ratio": {k: {"runs": v, "median": statistics.median(v)} for k, v in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="array sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)  # what `mc start` runs
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(inner(args.inner)))
        return
    sizes = sizes_of(parser, args.sizes, args.runs)
    results = on_this_machine(lambda: sweep(sizes, args.runs))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for n, entry in results["sizes"].items():
        med = entry["median"]
        print(f"{int(n):>10,} tasks: {med['tasks_per_s']:>8,.0f} tasks/s; per task: rank 0 loop "
              f"{med['rank0_loop_us_per_task']:.1f} µs, journal {med['rank0_other_threads_us_per_task']:.1f} µs, "
              f"workers {med['workers_us_per_task']:.1f} µs, client {med['client_us_per_task']:.2f} µs; "
              f"rank 0 peak RSS {med['rank0_peak_rss_mb']:.0f} MB")
    for name, ratio in results["rate_ratio"].items():
        print(f"rate {name}: median {ratio['median']:.2f} ({', '.join(f'{r:.2f}' for r in ratio['runs'])})")


if __name__ == "__main__":
    main()
