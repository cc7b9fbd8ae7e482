"""MPI programs shared by the MPI tests (MPICH over PMI-1, Open MPI over PMIx)."""
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from tests.host import skip_unless_ready

# Every rank prints one JSON line: the results of seven collectives and what it knows of its node.
COLLECTIVES = """
import json, os
from mpi4py import MPI
c = MPI.COMM_WORLD
r, n = c.rank, c.size
for _ in range(3):
    c.Barrier()
root = c.bcast({"from": 0, "n": n} if r == 0 else None, root=0)
gathered = c.allgather(r * r)
swapped = c.alltoall([r * 100 + d for d in range(n)])
ring = c.sendrecv(r, dest=(r + 1) % n, source=(r - 1) % n)
total = c.reduce(r, op=MPI.SUM, root=n - 1)
scanned = c.scan(r)
node = c.Split_type(MPI.COMM_TYPE_SHARED)
print(json.dumps({"rank": r, "size": n, "root": root, "gathered": gathered, "swapped": swapped, "ring": ring,
                  "total": total, "scan": scanned, "node_size": node.size, "lib": MPI.Get_library_version()[:40],
                  "tmpdir": os.environ.get("OMPI_MCA_btl_sm_backing_directory")}), flush=True)
"""

# Each rank passes its rank to the next, all meet in a barrier, and each prints one JSON line; with Debian's
# MPICH 4.0 and UCX_TLS=tcp,self, 6 ranks on 3 nodes hung in MPI_Finalize in about a third to a half of the runs.
RING = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, token = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Sendrecv(&rank, 1, MPI_INT, (rank + 1) % size, 0, &token, 1, MPI_INT, (rank + size - 1) % size, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("{\"rank\": %d, \"size\": %d, \"token\": %d}\n", rank, size, token);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
"""

# The MPICH builds the tests run C programs of, each by its compiler driver: PyPI's wheel (this venv's mpicc)
# and Debian's (apt mpich libmpich-dev: mpicc.mpich, called by name as Open MPI's mpicc may own plain mpicc).
# Every rank prints its rank, the world size and the sum of all ranks (an allreduce), as one JSON line.
C_HELLO = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("{\"rank\": %d, \"size\": %d, \"sum\": %d}\n", rank, size, sum);
    MPI_Finalize();
    return 0;
}
"""

MPICH_BUILDS = {
    "mpich-wheel": str(Path(sysconfig.get_path("scripts")) / "mpicc"),
    "mpich-debian": shutil.which("mpicc.mpich") or "/usr/bin/mpicc.mpich",
}


def build_c(mpi: str, source: str, workdir: Path, name: str = "prog") -> str:
    """Compile `source` with the compiler driver of `mpi` (a key of MPICH_BUILDS); skip when it is missing."""
    mpicc = MPICH_BUILDS[mpi]
    if not os.access(mpicc, os.X_OK) or shutil.which("cc") is None:
        skip_unless_ready(f"{mpi}: {mpicc} or a C compiler is missing (.ci/run installs them)")
    (workdir / f"{name}.c").write_text(source)
    subprocess.run([mpicc, "-O2", "-o", str(workdir / name), str(workdir / f"{name}.c")], check=True,
                   timeout=120)
    return str(workdir / name)
