"""Time to get N MPI ranks through MPI_Init on this machine: PMIJobServer vs mpiexec.

Each rank stamps CLOCK_MONOTONIC (shared by all processes of one Linux
host) when it starts and right after MPI_Init.  Two medians per launcher:
``launch`` = first rank spawned -> last rank past MPI_Init, and ``init`` =
last rank started -> last rank past MPI_Init (the PMI wire-up, without
process start-up).  Both launchers run the same program with the same
environment (``mpi_env_defaults()``), alternating run by run; mpiexec is the
Hydra launcher shipped in the ``mpich`` wheel.

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
print(f"S{time.monotonic():.6f}", flush=True)
from mpi4py import MPI
print(f"I{time.monotonic():.6f}", flush=True)
MPI.COMM_WORLD.Barrier()
"""

C_PROG = r"""
#include <mpi.h>
#include <stdio.h>
#include <time.h>
int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("S%.6f\n", ts.tv_sec + ts.tv_nsec / 1e9);
    fflush(stdout);
    MPI_Init(&argc, &argv);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("I%.6f\n", ts.tv_sec + ts.tv_nsec / 1e9);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"""


STAMP = re.compile(rb"([SI])(\d+\.\d{6})")


class LocalExchange:
    """One worker: the merged set is just the local puts."""

    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        return dict(local_kvs)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_"))}
    return {**env, **mpi_env_defaults()}


def stamps(stdout: bytes, n: int, start: float) -> tuple[float, float]:
    """(spawn -> last rank past MPI_Init, last rank started -> last past MPI_Init)."""
    # mpiexec may interleave the ranks' lines, so match stamps, not lines.
    found: dict[bytes, list[float]] = {b"S": [], b"I": []}
    for kind, value in STAMP.findall(stdout):
        found[kind].append(float(value))
    if len(found[b"S"]) != n or len(found[b"I"]) != n:
        raise RuntimeError(f"expected {n} stamps of each kind: {stdout[:200]!r}")
    return max(found[b"I"]) - start, max(found[b"I"]) - max(found[b"S"])


async def run_pmi(argv: list[str], n: int) -> tuple[float, float]:
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
    return stamps(b"".join(out for out, _ in outs), n, start)


def run_mpiexec(mpiexec: str, argv: list[str], n: int) -> tuple[float, float]:
    start = time.monotonic()
    done = subprocess.run(
        [mpiexec, "-n", str(n), *argv], env=base_env(), stdout=subprocess.PIPE, check=True, timeout=120
    )
    return stamps(done.stdout, n, start)


def build_c(workdir: Path) -> list[str] | None:
    mpicc = Path(sysconfig.get_path("scripts")) / "mpicc"
    if not mpicc.exists() or shutil.which("cc") is None:
        return None
    source = workdir / "init.c"
    source.write_text(C_PROG)
    subprocess.run([str(mpicc), "-O2", "-o", str(workdir / "init"), str(source)], check=True)
    return [str(workdir / "init")]


def summarize(samples: list[tuple[float, float]], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_launch_s": round(statistics.median(s[0] for s in samples), 4),
        f"{prefix}_init_s": round(statistics.median(s[1] for s in samples), 4),
    }


def measure(programs: dict[str, list[str]], ranks: list[int], runs: int) -> dict:
    mpiexec = Path(sysconfig.get_path("scripts")) / "mpiexec"
    results: dict = {}
    for name, argv in programs.items():
        for n in ranks:
            pmi, hydra = [], []
            # Alternate the launchers so drifting machine load hits both alike.
            for _ in range(runs):
                pmi.append(asyncio.run(run_pmi(argv, n)))
                if mpiexec.exists():
                    hydra.append(run_mpiexec(str(mpiexec), argv, n))
            row = summarize(pmi, "pmi_server")
            if hydra:
                row.update(summarize(hydra, "mpiexec"))
                row["launch_ratio"] = round(row["pmi_server_launch_s"] / row["mpiexec_launch_s"], 3)
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
    report = {
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "runs": args.runs,
        # launch: spawn of the first rank -> last rank past MPI_Init;
        # init: last rank started -> last rank past MPI_Init (the PMI wire-up).
        "medians": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, row in results.items():
            print(key, row)


if __name__ == "__main__":
    main()
