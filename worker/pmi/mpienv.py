"""Environment defaults for MPI tasks in a container.

Not part of Flux RFC 13: these are MPICH/UCX settings found necessary or
prudent for the PyPI ``mpich`` wheel (ch4 with UCX and OFI netmods) inside
Kubernetes pods.  See docs/mpi.md, "Containers".
"""

from __future__ import annotations

_DEFAULTS: dict[str, str] = {
    # Ranks on different workers live in different pods: the only path
    # between them is TCP.  UCX's default transport list also tries cma
    # (needs ptrace rights pods lack) and sysv/posix shared memory (breaks
    # across pod IPC namespaces).  Ranks inside one pod still use MPICH's own
    # shared memory, chosen from PMI_process_mapping, not UCX.
    "UCX_TLS": "tcp,self",
}


def mpi_env_defaults() -> dict[str, str]:
    """Variables the worker sets for MPI tasks unless the job already sets them."""
    return dict(_DEFAULTS)
