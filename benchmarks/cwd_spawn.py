"""What a task with a cwd costs to start, with and without a seccomp filter that refuses unshare (issue 25, item 2).

    python benchmarks/cwd_spawn.py [--runs N] [--tasks N]
    python benchmarks/cwd_spawn.py --trees before=/path/to/old/checkout,after=.   # interleaved comparison

An interactive `mc start --size 1`, plain ("plain") and under tests/integration/nounshare.c ("seccomp"), built
here with cc: the filter answers unshare(2) with EPERM, as a container runtime's RuntimeDefault profile does
without CAP_SYS_ADMIN.  A client submits an array of --tasks `/bin/true` with a cwd and waits for it (after a
warm-up array of 50); the figure is the wall time from the submit to the array's end, per task.  Plain, the loop
thread has its own cwd (unshare(CLONE_FS)) and spawns the tasks itself; under the filter it cannot, so since issue
25 a spawn helper spawns them (before, the loop thread entered each cwd where the worker's other threads saw it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trees

from minicluster import config
from minicluster.client import Client, ClientError

LAUNCHER_SOURCE = Path(__file__).resolve().parents[1] / "tests" / "integration" / "nounshare.c"


def build_launcher(directory: str) -> str:
    cc = shutil.which("cc")
    if cc is None:
        raise SystemExit("needs a C compiler (cc) for the seccomp launcher")
    launcher = os.path.join(directory, "nounshare")
    subprocess.run([cc, "-O", "-o", launcher, str(LAUNCHER_SOURCE)], check=True)
    return launcher


def array_seconds(uri: str, tasks: int, cwd: str) -> float:
    client = Client(uri)
    start = time.perf_counter()
    job = client.submit({"argv": ["/bin/true"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": cwd,
                         "array": f"0-{tasks - 1}"})
    results = list(client.wait([job]))
    if len(results) != 1 or results[0]["status"] != 0:
        raise RuntimeError(f"the array failed: {results}")
    return time.perf_counter() - start


def measure(prefix: list[str], tasks: int, cwd: str) -> float:
    """ms per task of one array on a fresh instance started with `prefix` before `mc start`."""
    proc = subprocess.Popen([*prefix, "mc", "start", "--size", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # type: ignore[union-attr]
        uri = f"unix://{config.load(Path(first.rstrip().rsplit('state in ', 1)[1]) / 'config.toml').socket_path}"
        deadline = time.time() + 60
        while True:
            try:
                if [r["state"] for r in Client(uri).status()["ranks"]] == ["up"]:
                    break
            except (ClientError, OSError):
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("the instance did not come up")
            time.sleep(0.05)
        array_seconds(uri, 50, cwd)  # warm-up: a helper starts, the caches fill
        return array_seconds(uri, tasks, cwd) / tasks * 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def run_once(tasks: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="mc-cwd-spawn-") as scratch:
        launcher = build_launcher(scratch)
        return {mode: {"ms_per_task": measure(prefix, tasks, scratch)}
                for mode, prefix in (("plain", []), ("seccomp", [launcher]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--trees", help="name=DIR,name=DIR: compare checkouts, interleaved")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one run, for --trees
    args = parser.parse_args()
    if args.once:
        print(json.dumps(run_once(args.tasks)))
        return
    if args.trees:
        script = os.path.abspath(__file__)
        print(json.dumps(trees.interleave(trees.parse_trees(args.trees), args.runs,
                                          lambda _name, _i: [script, "--once", "--tasks", str(args.tasks)],
                                          json.loads), indent=1))
        return
    runs = [run_once(args.tasks) for _ in range(args.runs)]
    print(json.dumps({"tasks": args.tasks, "runs": runs, "median_ms_per_task": {
        mode: statistics.median(r[mode]["ms_per_task"] for r in runs) for mode in runs[0]}}))


if __name__ == "__main__":
    main()
