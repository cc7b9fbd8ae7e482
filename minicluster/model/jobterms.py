"""What the client tools need of the jobspec's rules without the jobspec model itself: the error it raises and
the fixed vocabularies of its fields.

A module of its own so that `mc-submit`, run once per job from shell loops, can offer these as choices and raise
the jobspec's error while importing none of minicluster/model/jobspec.py and minicluster/config.py (dataclasses,
tomllib, the resource-tree and sharing parsers).  tests/unit/test_client_imports.py pins that path.
"""
from __future__ import annotations

# The node-match policies (broker/sched/policies.py orders candidates by each): a jobspec's `policy`, the config's.
POLICIES = ("first-fit", "pack", "spread", "low-id", "high-id", "locality-first")
# A jobspec's `mpi`: the PMI a worker serves its tasks (docs/mpi.md).
MPI_MODES = ("pmi1", "pmix", "auto", "none")

# The integer fields of a jobspec and their ranges, both ends included: the jobspec's parser checks them, and the
# client tools check each option against its field's range before anything is sent (msgpack cannot even carry
# an integer beyond 64 bits).
MAX_COUNT = 1 << 24  # nodes, tasks, cores, GPUs, and a resource tree's vertex counts
MAX_RETRIES = 1_000_000
INT_RANGES: dict[str, tuple[int, int]] = {
    "ntasks": (1, MAX_COUNT), "nnodes": (0, MAX_COUNT), "tasks_per_node": (0, MAX_COUNT),
    "cores_per_task": (1, MAX_COUNT), "gpus_per_task": (0, MAX_COUNT), "mem_per_task": (0, 1 << 40),
    "urgency": (0, 31), "retries": (0, MAX_RETRIES), "max_retries_per_index": (0, MAX_RETRIES),
    "max_failed_indexes": (0, MAX_RETRIES * 100), "success_count": (1, MAX_RETRIES * 100),
    "success_task": (0, 1 << 20), "umask": (0, 0o777),
}


class InvalidJobspec(ValueError):
    """The jobspec breaks a rule; the message names the field."""
