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


class InvalidJobspec(ValueError):
    """The jobspec breaks a rule; the message names the field."""
