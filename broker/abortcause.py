"""Which failure ended an MPI job: the earliest cause seen while its aborts settle (protocol.md §2.8, "Aborts").

Open MPI ranks call abort by themselves once a peer's connection breaks, so the first `abort` to reach rank 0
is often a reaction, not the cause.  Rank 0 therefore collects, for ABORT_SETTLE seconds after the first abort,
every abort and every failed exit of the job, each with the time the worker saw it, and names the earliest.
"""

from __future__ import annotations

# status, note: what the job's `abort` exception carries.
Cause = tuple[int, str]


class AbortSettlement:
    """The aborts and failed exits of one job within its settle window."""

    def __init__(self) -> None:
        self.aborts: dict[int, tuple[float, int, str]] = {}
        self.exits: dict[int, tuple[float, int, str]] = {}

    def abort(self, task: int, when: float, cause: Cause) -> None:
        self.aborts.setdefault(task, (when, *cause))

    def exit(self, task: int, ended: float, cause: Cause) -> None:
        self.exits.setdefault(task, (ended, *cause))

    def cause(self) -> Cause:
        """The earliest cause.  A task's own abort precedes its exit whatever the stamps say (a worker may read
        the abort after it noticed the exit), and an abort wins a tie with an exit."""
        candidates = []
        for task, (when, status, note) in self.aborts.items():
            ended = self.exits.get(task, (when,))[0]
            candidates.append((min(when, ended), 0, status, note))
        for task, (ended, status, note) in self.exits.items():
            if task not in self.aborts:
                candidates.append((ended, 1, status, note))
        _, _, status, note = min(candidates)
        return status, note
