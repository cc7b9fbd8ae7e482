"""MPI programs shared by the MPI tests (MPICH over PMI-1, Open MPI over PMIx)."""

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
