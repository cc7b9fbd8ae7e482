"""Time to get N MPI ranks through MPI_Init on this machine: PMIJobServer vs mpiexec.

Each rank reports CLOCK_MONOTONIC (shared by all processes of one Linux
host) right after MPI_Init; the figure for a run is the latest of those
minus the moment before the first rank was spawned.  Both launchers run the
same program with the same environment (``mpi_env_defaults()``); mpiexec is
the Hydra launcher shipped in the ``mpich`` wheel.

    python benchmarks/mpi_launch_local.py --json [--ranks 2 4 8] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.pmi import PMIJobServer, mpi_env_defaults, process_mapping  # noqa: E402

PY_PROG = """
import time
from mpi4py import MPI
print(f"T{time.monotonic():.6f}", flush=True)
MPI.COMM_WORLD.Barrier()
"""

C_PROG = r"""
#include <mpi.h>
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    struct timespec ts;
    MPI_Init(&argc, &argv);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("T%.6f\n", ts.tv_sec + ts.tv_nsec / 1e9);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"""


STAMP = re.compile(rb"T(\d+\.\d{6})")


class LocalExchange:
    """One worker: the merged set is just the local puts."""

    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        return dict(local_kvs)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_"))}
    return {**env, **mpi_env_defaults()}


def latest_init(stdout: bytes, n: int) -> float:
    # mpiexec may interleave the ranks' lines, so match stamps, not lines.
    stamps = [float(m) for m in STAMP.findall(stdout)]
    if len(stamps) != n:
        raise RuntimeError(f"expected {n} init stamps, got {len(stamps)}: {stdout[:200]!r}")
    return max(stamps)


async def run_pmi(argv: list[str], n: int) -> float:
    server = PMIJobServer(
        kvsname=f"mc-bench-{uuid.uuid4().hex[:12]}",
        universe_size=n,
        local_ranks=list(range(n)),
        process_mapping=process_mapping([n]),
        exchange=LocalExchange(),
        on_abort=lambda rank, code, msg: None,
    )
    env = base_env()
    start = time.monotonic()
    procs = []
    try:
        for rank in range(n):
            fd = server.socket_for(rank)
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv, env={**env, **server.env_for(rank, fd)}, pass_fds=(fd,),
                    stdout=subprocess.PIPE,
                )
            )
        server.close_child_fds()
        outs = await asyncio.gather(*(p.communicate() for p in procs))
    finally:
        server.close()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"PMIJobServer run failed: {[p.returncode for p in procs]}")
    return max(latest_init(out, 1) for out, _ in outs) - start


def run_mpiexec(mpiexec: str, argv: list[str], n: int) -> float:
    start = time.monotonic()
    done = subprocess.run(
        [mpiexec, "-n", str(n), *argv], env=base_env(), stdout=subprocess.PIPE, check=True, timeout=120
    )
    return latest_init(done.stdout, n) - start


def build_c(workdir: Path) -> list[str] | None:
    mpicc = Path(sysconfig.get_path("scripts")) / "mpicc"
    if not mpicc.exists() or shutil.which("cc") is None:
        return None
    source = workdir / "init.c"
    source.write_text(C_PROG)
    subprocess.run([str(mpicc), "-O2", "-o", str(workdir / "init"), str(source)], check=True)
    return [str(workdir / "init")]


def measure(programs: dict[str, list[str]], ranks: list[int], runs: int) -> dict:
    mpiexec = Path(sysconfig.get_path("scripts")) / "mpiexec"
    results: dict = {}
    for name, argv in programs.items():
        for n in ranks:
            pmi = [asyncio.run(run_pmi(argv, n)) for _ in range(runs)]
            row = {"pmi_server_s": round(statistics.median(pmi), 4)}
            if mpiexec.exists():
                hydra = [run_mpiexec(str(mpiexec), argv, n) for _ in range(runs)]
                row["mpiexec_s"] = round(statistics.median(hydra), 4)
                row["ratio_pmi_over_mpiexec"] = round(row["pmi_server_s"] / row["mpiexec_s"], 3)
            results[f"{name}/n={n}"] = row
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "init.py").write_text(PY_PROG)
        programs = {"python": [sys.executable, str(workdir / "init.py")]}
        c_argv = build_c(workdir)
        if c_argv:
            programs["c"] = c_argv
        results = measure(programs, args.ranks, args.runs)
    report = {"cpus": os.cpu_count(), "runs": args.runs, "median_seconds_to_all_past_init": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, row in results.items():
            print(key, row)


if __name__ == "__main__":
    main()
