"""The tree healing around a lost interior rank (protocol.md §2.4.1, issue 29 item 3), timed.

    python benchmarks/healing.py [--runs 3] [--ranks 1000] [--processes 2] [--json]

Two setups, both with the default liveness settings (heartbeat 1 s, unresponsive after 3 s, lost after 10 s):

- `local`: seven real ranks (fanout 2). Interior rank 1, the parent of ranks 3 and 4, is killed (`kill`,
  SIGKILL) or stopped (`stop`, SIGSTOP) and later restarted or continued.
- `sim`: `--ranks` ranks (fanout 32) from the rank simulator: rank 0 and the interior ranks are real processes,
  the leaves simulated (their `Uplink` is the real worker's). Interior rank 1, parent of 32 simulated leaves, is
  killed and then restarted.

What is measured, from rank 0's `/status` polled every 50 ms:
- `link_s`: from the fault until rank 0 has taken in every child of rank 1 (its `overlay_adoptions` counter);
- `worst_child_state`: the worst state a child of rank 1 was in during the following `lost_after` + 2 s (up,
  unresponsive or lost: lost would mean its tasks were taken back);
- `home_s`: from the restart (or SIGCONT) until rank 0 has sent every child `home` (`overlay_homes_sent`).
Medians over `--runs`; the machine's load is printed with each result.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from throughput import loadavg, progress

from minicluster.proto import topology
from minicluster.testing import LocalCluster
from minicluster.testing.ranksim import SimulatedCluster, raise_fd_limit

LIVENESS: dict[str, Any] = {"heartbeat_interval": 1.0, "unresponsive_after": 3.0, "lost_after": 10.0}
WORST = {"up": 0, "unresponsive": 1, "lost": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as reply:
        return dict(json.load(reply))


def seconds_until(check: Callable[[], bool], timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def worst_state(local: LocalCluster, ranks: list[int], during: float) -> str:
    worst = "up"
    end = time.monotonic() + during
    while time.monotonic() < end:
        states = local.rank_states()
        for rank in ranks:
            if WORST.get(states.get(rank, "lost"), 2) > WORST[worst]:
                worst = states.get(rank, "lost")
        time.sleep(0.05)
    return worst


def heal(local: LocalCluster, port: int, fault: str) -> dict[str, Any]:
    """Fault rank 1, time the healing, bring it back, time the call home."""
    children = list(topology.children(1, local.config.fanout, local.config.tree_size))
    before = status(port)["counters"]
    proc = local.procs[1]
    proc.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    link_s = seconds_until(lambda: status(port)["counters"]["overlay_adoptions"]
                           - before["overlay_adoptions"] >= len(children))
    worst = worst_state(local, children, local.config.lost_after + 2.0)
    sent = status(port)["counters"]["overlay_homes_sent"]
    if fault == "kill":
        proc.wait(10)
        local.start_rank(1)
    else:
        proc.send_signal(signal.SIGCONT)
    home_s = seconds_until(lambda: status(port)["counters"]["overlay_homes_sent"] - sent >= len(children))
    return {"link_s": round(link_s, 2), "worst_child_state": worst, "home_s": round(home_s, 2),
            "children": len(children), "load": loadavg()}


def run_local(fault: str) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mc-heal-") as state_dir:
        local = LocalCluster(state_dir, size=7, fanout=2, resources="cores=1", status_port=port, **LIVENESS)
        try:
            local.start()
            return heal(local, port, fault)
        finally:
            local.stop()


def run_sim(size: int, processes: int) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mc-heal-sim-") as state_dir, \
            SimulatedCluster(state_dir, size=size, processes=processes, fanout=32, status_port=port,
                             **LIVENESS) as sim:
        sim.wait_joined(timeout=300)
        return heal(sim.local, port, "kill")


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"link_s_median": statistics.median(r["link_s"] for r in runs),
            "home_s_median": statistics.median(r["home_s"] for r in runs),
            "worst_child_state": max((r["worst_child_state"] for r in runs), key=WORST.__getitem__),
            "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=1000, help="size of the simulated MiniCluster (0: skip)")
    parser.add_argument("--processes", type=int, default=2, help="simulator processes")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args()
    raise_fd_limit()
    doc: dict[str, Any] = {"liveness": LIVENESS, "cpus": os.cpu_count()}
    for fault in ("kill", "stop"):
        runs = []
        for i in range(args.runs):
            progress(f"local, {fault}, run {i + 1}")
            runs.append(run_local(fault))
        doc[f"local_{fault}"] = summary(runs)
    if args.ranks:
        runs = []
        for i in range(args.runs):
            progress(f"sim, {args.ranks} ranks, kill, run {i + 1}")
            runs.append(run_sim(args.ranks, args.processes))
        doc[f"sim_{args.ranks}_kill"] = summary(runs)
    print(json.dumps(doc, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
