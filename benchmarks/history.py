"""Broker memory and restart time with a long history of finished jobs (issue 17 item 4; not a timed test).

    python benchmarks/history.py [--jobs N] [--runs R] [--checkout DIR]      (prints JSON)

A journal is filled with N finished jobs (default 1,000,000) through the store's statements (broker/durable/store.py),
as the broker writes them: the job row, its `submit`, `finish` and `clean` events, and the row's close. Then a
one-rank broker is started on it and on an empty journal, interleaved run by run:

ready_s   from starting the broker process until it answers `status` with rank 0 up;
rss_mb    the broker's VmRSS once settled after that, and again after a walk of a few `jobs -a` pages and
          `job` lookups of old finished jobs (cache misses);
growth    full minus empty, run by run.

Also checked each run: `status` counts N inactive jobs and the oldest job is found. Medians of R runs.
Goals (issue 17): RSS growth <= 50 MB and ready <= 5 s with 1,000,000 retained jobs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.durable import store
from broker.durable.journal import Journal, Statement
from broker.durable.store import pack
from minicluster.testing import LocalCluster
from minicluster.testing.builders import jobspec_wire

BATCH = 50_000
GOALS = {"rss_growth_mb": 50.0, "ready_s": 5.0}
MB = 1024 * 1024
NEW_KEYS = ("finished_cache",)


def fill(state_dir: Path, jobs: int) -> float:
    """Write `jobs` finished jobs into the journal in `state_dir`; returns the seconds it took."""
    t0 = time.monotonic()
    journal = Journal(str(state_dir))
    spec = pack(jobspec_wire(["sh", "-c", "echo a typical job"], name="history", ntasks=2))
    uid, gid = os.getuid(), os.getgid()
    start = time.time() - jobs * 0.001
    for first in range(1, jobs + 1, BATCH):
        rows: list[Statement] = []
        events: list[Statement] = []
        closes: list[Statement] = []
        for job_id in range(first, min(first + BATCH, jobs + 1)):
            t = start + job_id * 0.001
            status = 1 if job_id % 10 == 0 else 0
            rows.append(store.job_submitted(job_id, uid, gid, "NEW", spec, t, job_id + 1)[0])
            events += [store.event(job_id, 0, t, "submit", pack({"uid": uid, "ntasks": 2, "array": None})),
                       store.event(job_id, 1, t, "finish", pack({"status": status, "counts": {"succeeded": 2}})),
                       store.event(job_id, 2, t, "clean", pack({}))]
            closes.append(store.job_closed(job_id, 3, status, None, t, t, pack([2 - status, status, 0, None])))
        journal.execute_now(rows + events + closes)
    journal.execute_now(store.job_submitted(0, uid, gid, "NEW", spec, start, jobs + 1)[1:])
    asyncio.run(journal.close())
    return time.monotonic() - t0


def rss_after(pid: int, pause: float = 1.0) -> float:
    """The broker's VmRSS in MB, `pause` seconds after it answered (its start-up work done)."""
    time.sleep(pause)
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def one_life(cluster: LocalCluster, jobs: int, checkout: str | None) -> dict[str, float]:
    t0 = time.monotonic()
    proc = cluster.start_rank(0, env={"PYTHONPATH": checkout} if checkout else None)
    cluster.wait_up(timeout=120)
    ready = time.monotonic() - t0
    rss = rss_after(proc.pid)
    with cluster.client() as c:
        assert c.status()["queue"]["INACTIVE"] == jobs, c.status()["queue"]
        before = None
        for _ in range(5):
            page = c.call("jobs", all=True, limit=1000, **({"before": before} if before else {}))
            before = page.get("next")  # a checkout from before paging has none: the same first page again
        for job_id in range(1, min(jobs, 2000) + 1, 10):
            assert c.job(job_id)["state"] == "INACTIVE"
    used = rss_after(proc.pid)
    cluster.stop()
    return {"ready_s": ready, "rss_mb": rss, "rss_after_reads_mb": used}


def _without_new_keys(config: Path) -> None:
    """A tree from before this change refuses the config keys it added (they are at their defaults here)."""
    lines = config.read_text().splitlines(keepends=True)
    config.write_text("".join(line for line in lines if not line.startswith(NEW_KEYS)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--checkout", help="run the broker from this source tree (e.g. `git archive main`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mc-history-") as tmp:
        # A broker started with `python -m` puts its working directory first on its path: not this checkout's.
        os.chdir(tmp)
        full_dir, empty_dir = Path(tmp, "full"), Path(tmp, "empty")
        fill_s = fill(full_dir, args.jobs)
        size_mb = os.path.getsize(full_dir / "journal.sqlite") / MB
        settings = {"size": 1, "purge_max_count": 10 * args.jobs + 1, "test_exec": True}
        clusters = {"empty": LocalCluster(empty_dir, **settings), "full": LocalCluster(full_dir, **settings)}
        if args.checkout:
            for cluster in clusters.values():
                _without_new_keys(Path(cluster.config_path))
        runs: dict[str, list[dict[str, float]]] = {"empty": [], "full": []}
        for _ in range(args.runs):
            for name, cluster in clusters.items():
                runs[name].append(one_life(cluster, args.jobs if name == "full" else 0, args.checkout))
    growth = [f["rss_mb"] - e["rss_mb"] for f, e in zip(runs["full"], runs["empty"], strict=True)]
    growth_after = [f["rss_after_reads_mb"] - e["rss_after_reads_mb"]
                    for f, e in zip(runs["full"], runs["empty"], strict=True)]
    result: dict[str, Any] = {
        "jobs": args.jobs, "runs": args.runs, "checkout": args.checkout or "this one", "fill_s": round(fill_s, 1),
        "journal_mb": round(size_mb),
        "median": {
            name: {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
            for name, rows in runs.items()
        },
        "runs_full": runs["full"],
        "rss_growth_mb": round(statistics.median(growth), 1),
        "rss_growth_after_reads_mb": round(statistics.median(growth_after), 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    ready = result["median"]["full"]["ready_s"]
    result["goals"] = {"rss_growth_mb": [GOALS["rss_growth_mb"], result["rss_growth_mb"] <= GOALS["rss_growth_mb"]],
                       "ready_s": [GOALS["ready_s"], ready <= GOALS["ready_s"]]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
