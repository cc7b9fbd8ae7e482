"""What the queue holds and hands out (broker/sched/queue.py): a queued job (SchedJob), its entry while elements of
it wait (Pending), and the Scheduler's answers, a Start or a Preemption. Their own module, so that one scheduling
pass (cycle.py) and the queue share them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .alloc import Allocation
from .ordering import OrderKey
from .policies import check_policy
from .request import Request


@dataclass(frozen=True, slots=True)
class SchedJob:
    """A queued job; count > 1 makes it an array of independent elements."""

    job_id: int
    urgency: int = 16
    submit_time: float = 0.0
    request: Request = field(default_factory=Request)
    time_limit: float | None = None
    policy: str | None = None
    count: int = 1
    # Elements are numbered first_element .. first_element+count-1: an array's indexes queued again (a retry,
    # a release after a hold) continue the numbering, so they never collide with elements still running.
    first_element: int = 0
    # Sharing: the queue, the submitting user and the bank charged; together the job's bucket.
    queue: str = ""
    user: int = -1
    project: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.urgency <= 31:
            raise ValueError(f"urgency must be 0-31, got {self.urgency}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ValueError(f"time_limit must be > 0, got {self.time_limit}")
        if self.policy is not None:
            check_policy(self.policy)

    @property
    def order_key(self) -> tuple[int, float, int]:
        return (-self.urgency, self.submit_time, self.job_id)

    @property
    def bucket(self) -> tuple[str, int, str]:
        return (self.queue, self.user, self.project)

    @property
    def cores(self) -> int:
        """Cores of one element (the whole job unless it is an array)."""
        return self.request.total_cores

    @property
    def gpus(self) -> int:
        return self.request.nslots * self.request.gpus_per_slot


class Preemption(NamedTuple):
    """Preempt element `element` of job `job_id` (SIGTERM, then the kill grace) so that job `by` can start."""

    job_id: int
    element: int
    by: int


class Start(NamedTuple):
    """Run element `element` of job `job_id` on `allocation` now.

    A NamedTuple (immutable, compared by value) rather than a frozen
    dataclass: one is built per array element and construction is ~4x
    cheaper.
    """

    job_id: int
    element: int
    allocation: Allocation


class Pending:
    """Queue entry: the job plus how many of its elements have started."""

    __slots__ = ("job", "started", "batch", "key")

    def __init__(self, job: SchedJob, key: OrderKey, fast: bool = True) -> None:
        self.job = job
        self.key = key
        self.started = job.first_element
        req = job.request
        # Array fast path (graph.alloc_array): elements that are one flat
        # CPU-only, non-exclusive slot are started many per pass.
        self.batch = fast and job.count > 1 and req.batchable

    @property
    def remaining(self) -> int:
        return self.job.first_element + self.job.count - self.started
