"""Environment defaults for MPI tasks in a container.

Not part of Flux RFC 13: these are UCX settings found necessary or prudent
for the PyPI ``mpich`` wheel and Debian's MPICH (both ch4 with UCX) on one
host and inside Kubernetes pods.  See docs/mpi.md, "Containers".
"""

from __future__ import annotations

_DEFAULTS: dict[str, str] = {
    # Everything UCX finds but cma: cross-memory attach needs ptrace rights that containers often lack (UCX
    # then fails with "process_vm_readv ... Operation not permitted").  Shared memory (posix, sysv) stays:
    # Debian's MPICH 4.0 disconnects every UCX endpoint in MPI_Finalize before its last PMI barrier, and a
    # TCP endpoint between ranks of one host may wait there for a peer already blocked in that barrier
    # (6 ranks on 3 workers hung in 12 of 30 runs with "tcp,self", docs/mpi.md "Containers").
    "UCX_TLS": "^cma",
    # The same for MPICH's own intra-node copies: with no Yama ptrace_scope to read, MPICH turns CMA on, and a
    # container runtime's default seccomp profile refuses process_vm_readv (MPI_Init aborts in
    # MPIDI_CMA_copy_data; found on a real kubelet, docs/mpi.md "Containers").
    "MPIR_CVAR_CH4_CMA_ENABLE": "0",
    # UCX's posix shared memory reaches a peer's segment through /proc/PID/fd, which a restricted pod may not
    # open ("open(file_name=/proc/12/fd/13) failed: Permission denied"); named files in /dev/shm work wherever
    # the ranks of one node share it.
    "UCX_POSIX_USE_PROC_LINK": "n",
}


# Where ranks share cores (several ranks of a local instance on one host, or more cores declared than the host
# has), a rank that busy-polls while it waits takes the CPU from the peer it waits for: Open MPI then yields, as
# under `mpirun --oversubscribe` (mpi4py's suite stalled for minutes in test_io without it, issue 32).  MPICH's
# ch4 has no such switch.
_SHARED_CORES: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def mpi_env_defaults(shared_cores: bool = False) -> dict[str, str]:
    """Variables the worker sets for MPI tasks unless the job already sets them."""
    return {**_DEFAULTS, **_SHARED_CORES} if shared_cores else dict(_DEFAULTS)
