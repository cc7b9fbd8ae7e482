"""What a guest's task costs to start on a root instance (issue 24 item 1): a benchmark, not a timed test.

    sudo python benchmarks/guest_spawn.py [--runs N] [--tasks N] [--uid UID --gid GID]
    sudo python benchmarks/guest_spawn.py --trees before=/path/to/old/checkout,after=.   # interleaved comparison

A root `LocalCluster` of 1 rank that admits the group `--gid` names (`access_group`); a forked child with the
guest's ids submits an array of --tasks `/bin/true` and waits for it (after one warm-up array); the figure is the
wall time from the submit to the array's end, per task.  Since issue 24 a guest's task is forked by a spawn
helper whose child drops to the guest's ids before it execs (worker/spawn.py); before, the worker posix_spawned
`setpriv` as root with the job's environment.  With --trees each run is a fresh interpreter per tree, the trees
taking turns (benchmarks/trees.py).
"""
from __future__ import annotations

import argparse
import grp
import json
import os
import statistics
import tempfile
import time

import trees

from minicluster.client import Client
from minicluster.testing import LocalCluster


def as_guest(uid: int, gid: int, uri: str, tasks: int) -> float:
    """Submit the array as the guest (a forked child with its ids) and wait for it; its wall seconds."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        client = Client(uri)
        start = time.perf_counter()
        job = client.submit({"argv": ["/bin/true"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/tmp",
                             "array": f"0-{tasks - 1}"})
        results = list(client.wait([job]))
        ok = len(results) == 1 and results[0]["status"] == 0
        os.write(write_end, json.dumps(time.perf_counter() - start if ok else None).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        seconds = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    if seconds is None:
        raise RuntimeError("the guest's array failed")
    return float(seconds)


def run_once(uid: int, gid: int, tasks: int) -> dict[str, dict[str, float]]:
    state = tempfile.mkdtemp(prefix="mc-guest-spawn-")
    os.chmod(state, 0o711)  # the guest traverses to the socket
    with LocalCluster(state, size=1, access_group=grp.getgrgid(gid).gr_name) as cluster:
        as_guest(uid, gid, cluster.uri, min(tasks, 50))  # warm-up: the helper starts, the caches fill
        seconds = as_guest(uid, gid, cluster.uri, tasks)
    return {"guest": {"ms_per_task": seconds / tasks * 1000}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--uid", type=int, default=65533)
    parser.add_argument("--gid", type=int, default=65534)
    parser.add_argument("--trees", help="name=DIR,name=DIR: compare checkouts, interleaved")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one run, for --trees
    args = parser.parse_args()
    if os.getuid() != 0:
        parser.error("needs root: the instance runs a guest's tasks under the guest's ids")
    if args.once:
        print(json.dumps(run_once(args.uid, args.gid, args.tasks)))
        return
    if args.trees:
        script = os.path.abspath(__file__)

        def argv(_name: str, _i: int) -> list[str]:
            return [script, "--once", "--tasks", str(args.tasks), "--uid", str(args.uid), "--gid", str(args.gid)]

        print(json.dumps(trees.interleave(trees.parse_trees(args.trees), args.runs, argv, json.loads), indent=1))
        return
    runs = [run_once(args.uid, args.gid, args.tasks)["guest"]["ms_per_task"] for _ in range(args.runs)]
    print(json.dumps({"tasks": args.tasks, "ms_per_task": runs, "median_ms_per_task": statistics.median(runs)}))


if __name__ == "__main__":
    main()
