"""Per-queue and per-user-in-queue limits (docs/scheduling.md, "Limits"), with the counts they are checked against.

Counts are kept for every queue and every (queue, user), limited or not: the same numbers feed `mc queue status`
and the broker's gauges.  An array element counts as one job, as an array task does in Slurm.  Reasons read like
Slurm's pending reasons (`(AssocMaxJobsLimit)`), with the numbers that explain them.  Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from minicluster.model.sharing import Limits


@dataclass(slots=True)
class Usage:
    """What one queue, or one user in one queue, holds right now."""

    running: int = 0   # jobs (array elements) running
    cores: int = 0
    gpus: int = 0
    pending: int = 0   # jobs (array elements) waiting

    def to_wire(self) -> dict[str, int]:
        return {"running": self.running, "cores": self.cores, "gpus": self.gpus, "pending": self.pending}


@dataclass(frozen=True, slots=True)
class QueueLimits:
    limits: Limits = field(default_factory=Limits)
    user_limits: Limits = field(default_factory=Limits)


_NO_LIMITS = Limits()
# (reason, what is limited, the Usage field, the Limits field)
_CHECKS = (("MaxRunningJobs", "jobs", "running", "running_jobs"),
           ("MaxCores", "cores", "cores", "cores"),
           ("MaxGpus", "GPUs", "gpus", "gpus"))


class LimitCounters:
    """Counts per queue and per (queue, user); `room()` says how many more elements of a job may start."""

    def __init__(self, queues: Mapping[str, QueueLimits] | None = None) -> None:
        self.queues = dict(queues or {})
        self.by_queue: dict[str, Usage] = {}
        self.by_user: dict[tuple[str, int], Usage] = {}

    @property
    def queues(self) -> dict[str, QueueLimits]:
        return self._queues

    @queues.setter
    def queues(self, queues: dict[str, QueueLimits]) -> None:
        self._queues = queues
        # Only these need looking at when elements start (`room`); the others are only counted.
        self._limited = {name: q for name, q in queues.items()
                         if q.limits != _NO_LIMITS or q.user_limits != _NO_LIMITS}

    def _pair(self, queue: str, user: int) -> tuple[Usage, Usage]:
        q = self.by_queue.get(queue)
        if q is None:
            q = self.by_queue[queue] = Usage()
        u = self.by_user.get((queue, user))
        if u is None:
            u = self.by_user[(queue, user)] = Usage()
        return q, u

    # --- counting -----------------------------------------------------------------------------------------

    def queued(self, queue: str, user: int, n: int) -> None:
        for usage in self._pair(queue, user):
            usage.pending += n

    def started(self, queue: str, user: int, n: int, cores: int, gpus: int, from_queue: bool = True) -> None:
        """n elements of `cores`/`gpus` each started (from the queue, or adopted after a restart)."""
        for usage in self._pair(queue, user):
            usage.running += n
            usage.cores += n * cores
            usage.gpus += n * gpus
            if from_queue:
                usage.pending -= n

    def released(self, queue: str, user: int, n: int, cores: int, gpus: int) -> None:
        for usage in self._pair(queue, user):
            usage.running -= n
            usage.cores -= n * cores
            usage.gpus -= n * gpus

    # --- checking -----------------------------------------------------------------------------------------

    def limited(self, queue: str) -> bool:
        """Whether the queue has a limit of its own or per user (others are only counted)."""
        return queue in self._limited

    def room(self, queue: str, user: int, cores: int, gpus: int, want: int) -> tuple[int, str | None]:
        """How many of `want` elements (of `cores`/`gpus` each) may start now, and the limit that stops the rest."""
        config = self._limited.get(queue)
        if config is None:
            return want, None
        q, u = self._pair(queue, user)
        best, why = want, None
        for scope, limits, usage in (("Queue", config.limits, q), ("User", config.user_limits, u)):
            for reason, what, used, limit in _CHECKS:
                cap = getattr(limits, limit)
                if not cap:
                    continue
                per = 1 if used == "running" else (cores if used == "cores" else gpus)
                if not per:
                    continue
                fits = max(0, cap - getattr(usage, used)) // per
                if fits < best:
                    best = fits
                    owner = f"queue {queue}" if scope == "Queue" else f"uid {user} in queue {queue}"
                    why = f"{scope}{reason}: {owner} has {getattr(usage, used)} of {cap} {what} in use"
        return best, why

    def refuse(self, queue: str, user: int, cores: int, gpus: int, count: int) -> str | None:
        """Why a job can never run or may not be queued under the limits; None when it may."""
        config = self.queues.get(queue)
        if config is None:
            return None
        q, u = self._pair(queue, user)
        for scope, limits, usage in (("queue", config.limits, q), ("per-user", config.user_limits, u)):
            for ask, cap, what in ((cores, limits.cores, "cores"), (gpus, limits.gpus, "GPUs")):
                if cap and ask > cap:
                    return f"asks {ask} {what}, more than the {scope} limit of {cap} in queue {queue}"
            if limits.queued_jobs and usage.pending + count > limits.queued_jobs:
                who = f"queue {queue}" if scope == "queue" else f"uid {user} in queue {queue}"
                return (f"{who} has {usage.pending} jobs waiting; {count} more would exceed the "
                        f"{scope} limit of {limits.queued_jobs} (max queued jobs)")
        return None
