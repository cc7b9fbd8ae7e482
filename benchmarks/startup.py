"""Join time and submit-loop rate (issue "Runtime core").

  python benchmarks/startup.py [--json] [--runs N] [--sizes 8,128] [--only join|submit]
  python benchmarks/startup.py --only submit --installs main=/work/main,new=. [--runs 5] [--submits 40]

join: from launching `mc start --size N` until every rank has joined (the broker runs the command only then),
measured with the launcher's fork path (`mc start`) and with one interpreter per rank (LocalCluster, as
pods do). submit loop: `mc-submit true` run back to back from a shell loop, the way a user script would,
against a 2-rank instance: each call pays a Python start, so this is the per-command latency users feel.  With
it, the CPU time (user + system) the loop's processes spent per call: the robust figure on a shared machine.
`python -X importtime -c 'import minicluster.cli.submit'` shows what the import part of it is made of.

--installs: the submit loop with the `mc-submit` of regular (non-editable) installs, as users get them from
`pip install .` (an editable install's path finder imports pathlib, urllib and re into every process): each
checkout is copied, installed into a throwaway venv, and the installs take turns run by run against one
instance of this checkout, with medians and run-by-run ratios over the first (benchmarks/trees.py).
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

from trees import parse_trees, summarize
from minicluster.testing import LocalCluster


def join_mc_start(size: int, fanout: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        stamp = os.path.join(tmp, "up")
        t0 = time.time()
        subprocess.run(["mc", "start", "--size", str(size), "--fanout", str(fanout), "--test-exec", "--",
                        sys.executable, "-c", f"import time; open({stamp!r}, 'w').write(repr(time.time()))"],
                       check=True, timeout=300)
        with open(stamp) as f:
            return float(f.read()) - t0


def join_processes(size: int, fanout: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(tmp, size=size, fanout=fanout, test_exec=True)
        t0 = time.time()
        for rank in range(size):
            cluster.start_rank(rank)
        try:
            cluster.wait_up(timeout=300)
            return time.time() - t0
        finally:
            cluster.stop()


def submit_loop(count: int) -> tuple[float, float]:
    """Calls per second, and CPU ms per call of the shell loop's processes (mc-submit, sh, seq)."""
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, size=2, test_exec=True) as cluster:
        return timed_loop(count, dict(os.environ, MC_URI=cluster.uri))


def timed_loop(count: int, env: dict[str, str], command: str = "mc-submit true") -> tuple[float, float]:
    """The shell loop of `count` calls of `command` (by default mc-submit, the one `env`'s PATH finds)."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run(["sh", "-c", f"for i in $(seq {count}); do {command} >/dev/null || exit 1; done"],
                   env=env, check=True, timeout=600)
    rate = count / (time.time() - t0)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return rate, 1000 * cpu / count


def regular_install(tree: str, where: str) -> str:
    """`pip install` of a copy of checkout `tree` into a new venv under `where`; the venv's bin directory.

    A copy, because pip builds in the source directory (build/, *.egg-info) and the checkout is not ours to write.
    """
    source = os.path.join(where, "src")
    shutil.copytree(tree, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                                  "__pycache__", ".mypy_cache", ".ruff_cache"))
    venv = os.path.join(where, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", source], check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    return os.path.join(venv, "bin")


def installs_loop(installs: dict[str, str], runs: int, count: int) -> dict[str, object]:
    """The submit loop of each regular install, taking turns run by run against one 2-rank instance.

    Each run also times the same loop of `python -c pass` of that install, right before: the floor of any
    Python client, on the machine as loaded as it is then.  With valgrind, the instructions of one call of each
    (user space, the process only): a figure the machine's load does not move."""
    with tempfile.TemporaryDirectory() as tmp:
        bins = {}
        for name, tree in installs.items():
            bins[name] = regular_install(tree, os.path.join(tmp, name))
        names = list(installs)
        results: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in names}
        with LocalCluster(os.path.join(tmp, "instance"), size=2, test_exec=True) as cluster:
            for i in range(runs):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    env = dict(os.environ, MC_URI=cluster.uri, PATH=f"{bins[name]}:{os.environ['PATH']}")
                    floor, floor_cpu = timed_loop(count, env, "python -c pass")
                    rate, cpu = timed_loop(count, env)
                    results[name].append({"submit": {"calls_per_s": rate, "cpu_ms_per_call": cpu,
                                                     "share_of_python_pass_rate": rate / floor},
                                          "python_pass": {"calls_per_s": floor, "cpu_ms_per_call": floor_cpu}})
                    print(f"run {i + 1}/{runs} {name}: {rate:.1f} calls/s, {cpu:.1f} ms CPU per call "
                          f"(python -c pass: {floor:.1f}/s, {floor_cpu:.1f} ms)", file=sys.stderr, flush=True)
            counted = {name: instructions(bins[name], dict(os.environ, MC_URI=cluster.uri)) for name in names}
        return {**summarize(installs, results), "instructions_per_call": counted}


def instructions(bin_dir: str, env: dict[str, str]) -> dict[str, int] | None:
    """Instructions of one `mc-submit true` and one `python -c pass` of this install (valgrind), or None."""
    if shutil.which("valgrind") is None:
        return None
    out = {}
    for label, argv in (("mc_submit_true", [os.path.join(bin_dir, "mc-submit"), "true"]),
                        ("python_pass", [os.path.join(bin_dir, "python"), "-c", "pass"])):
        run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True, timeout=300)
        out[label] = int(run.stderr.rsplit("Collected : ", 1)[1].split()[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="8,128")
    parser.add_argument("--submits", type=int, default=50)
    parser.add_argument("--only", choices=("join", "submit"), help="run one of the two experiments")
    parser.add_argument("--installs", metavar="NAME=DIR,...",
                        help="submit loop only: regular installs of these checkouts, interleaved (first = base)")
    args = parser.parse_args()
    results: dict[str, object] = {"load_average": os.getloadavg()[0]}
    if args.installs:
        results.update(installs_loop(parse_trees(args.installs), args.runs, args.submits))
        results["load_average_after"] = os.getloadavg()[0]
        print(json.dumps(results, indent=2))
        return
    sizes = [] if args.only == "submit" else [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        fanout = 2 if size <= 8 else 8
        fork = [join_mc_start(size, fanout) for _ in range(args.runs)]
        results[f"join_mc_start_{size}"] = {"median_s": statistics.median(fork), "runs": fork, "fanout": fanout}
        if size <= 8:
            procs = [join_processes(size, fanout) for _ in range(args.runs)]
            results[f"join_processes_{size}"] = {"median_s": statistics.median(procs), "runs": procs}
    if args.only != "join":
        loops = [submit_loop(args.submits) for _ in range(args.runs)]
        rates, cpu = [rate for rate, _ in loops], [ms for _, ms in loops]
        results["mc_submit_loop_jobs_per_s"] = {"median": statistics.median(rates), "runs": rates}
        results["mc_submit_loop_cpu_ms_per_call"] = {"median": statistics.median(cpu), "runs": cpu}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:32} {value}")


if __name__ == "__main__":
    main()
