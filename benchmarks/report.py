"""`mc report` on big arrays: its wall time and peak memory (issue 30's bound: a 100,000-element array in under
10 s and under 200 MB; not a timed test).

    python benchmarks/report.py [--sizes 10000,100000] [--runs 3] [--json]

One test-executor MiniCluster (4 ranks, 64 cores each) runs one array of each size, with a few failed and retried
elements so every kind of mark is drawn.  Then `mc report ID -o FILE` runs as the user runs it, a new process each
time, sizes interleaved, the order rotating run by run.  Its wall time is from the spawn to its exit; its peak RSS
is the child's own (wait4).  Every size is compared with the smallest, run by run (time per element).  The broker's
CPU while it served the report's pages is read from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procstat import cpu_seconds
from sizesweep import in_turns, on_this_machine, sizes_of

from minicluster.testing import LocalCluster

MC = shutil.which("mc") or str(Path(sys.executable).with_name("mc"))
LIMITS = {"seconds": 10.0, "peak_rss_mb": 200.0}  # issue 30, for 100,000 elements


def one_report(cluster: LocalCluster, job: int, out: Path) -> dict[str, Any]:
    broker = cluster.procs[0].pid
    cpu0, t0 = cpu_seconds(broker), time.monotonic()
    child = subprocess.Popen([MC, "report", str(job), "-o", str(out)], env={**os.environ, "MC_URI": cluster.uri},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(child.pid, 0)  # not child.wait(): wait4 gives the child's own peak RSS
    wall = time.monotonic() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"mc report {job} failed: {child.communicate()[1].decode()}")
    return {"seconds": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "file_kb": out.stat().st_size / 1024,
            "broker_cpu_s": cpu_seconds(broker) - cpu0, "client_cpu_s": usage.ru_utime + usage.ru_stime}


def sweep(sizes: list[int], runs: int) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="mc-report-bench-"))
    per_size: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    try:
        with LocalCluster(state / "state", size=4, resources="cores=64", test_exec=True) as cluster, \
                cluster.client() as c:
            jobs = {}
            for n in sizes:
                jobs[n] = c.submit({"argv": ["true"], "cwd": "/tmp", "array": f"0-{n - 1}", "max_retries_per_index": 1,
                                    "env": {"MC_TEST_RUN_DURATION": "0.001", "MC_TEST_FAIL_ONCE": "5,17"}})
                next(c.wait([jobs[n]]))
            for i, n in in_turns(sizes, runs):
                per_size[n].append(one_report(cluster, jobs[n], state / f"report-{n}.html"))
                print(f"run {i + 1}/{runs}: {n:,} elements: {per_size[n][-1]['seconds']:.2f} s, "
                      f"{per_size[n][-1]['peak_rss_mb']:.0f} MB, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    smallest = sizes[0]
    ratios = {f"{n}_vs_{smallest}_per_element": [a["seconds"] / n / (b["seconds"] / smallest)
                                                 for a, b in zip(per_size[n], per_size[smallest], strict=True)]
              for n in sizes[1:]}
    return {
        "sizes": {str(n): {"median": {k: statistics.median(r[k] for r in rs) for k in rs[0]}, "runs": rs}
                  for n, rs in per_size.items()},
        "time_ratio": {k: {"runs": v, "median": statistics.median(v)} for k, v in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="array sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args()
    sizes = sizes_of(parser, args.sizes, args.runs)
    results = on_this_machine(lambda: sweep(sizes, args.runs), limits_at_100000=LIMITS)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for n, entry in results["sizes"].items():
        med = entry["median"]
        print(f"{int(n):>9,} elements: {med['seconds']:.2f} s, peak {med['peak_rss_mb']:.0f} MB, "
              f"file {med['file_kb']:.0f} kB, client CPU {med['client_cpu_s']:.2f} s, "
              f"broker CPU {med['broker_cpu_s']:.2f} s")
    for name, ratio in results["time_ratio"].items():
        print(f"{name}: {ratio['median']:.2f} (runs {', '.join(f'{r:.2f}' for r in ratio['runs'])})")


if __name__ == "__main__":
    main()
