"""EASY backfill planning: the head job's reservation and the backfill test.

The reservation is computed on the real graph, not on core counts: running
allocations are detached in order of their expected end (start + time
limit) until the blocked head job matches; the end time of the last one
detached is the shadow time and that match is the reserved allocation.
Matching is monotone in freed resources, so the prefix length is found by
exponential + binary search: O(log R) matches and O(R) cheap detach/attach
steps for R running allocations.  Everything is re-attached afterwards.

A later job may then start if it fits without touching the reserved
resources (the part of them free now is held under a phantom key while it
is matched), or if it fits at all and ends before the shadow time.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from .alloc import Allocation
from .graph import ResourceGraph
from .request import Request
from .sockets import Hold

PHANTOM = ("__sched_reservation__",)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Where and when the blocked head job is expected to start."""

    job_id: int
    start: float
    allocation: Allocation
    # The running allocation whose expected end sets `start` (its time limit makes the estimate).
    after: Hashable = None


def plan_reservation(graph: ResourceGraph, job_id: int, request: Request, policy: str,
                     ends: Mapping[tuple[int, int], float], now: float) -> Reservation | None:
    """Reservation for a job that does not fit now, or None if it never will.

    ends maps running allocation keys to expected end times; overdue ones are
    taken to end now.
    """
    order = sorted(ends, key=ends.__getitem__)
    with DetachedPrefix(graph, order) as prefix:
        count = prefix.shortest_fitting(request, policy)
        if count is None:
            return None
        found = graph.match(request, policy)
        assert found is not None, "fits() and match() disagree"
        return Reservation(job_id, max(now, ends[order[count - 1]]), found, order[count - 1])


K = TypeVar("K", bound=Hashable)


class DetachedPrefix(Generic[K]):
    """Running allocations detached from the graph in a given order, the first `count` of them at a time;
    everything is attached again on leaving the `with` block.  Also the preemption search's tool."""

    def __init__(self, graph: ResourceGraph, order: Sequence[K]) -> None:
        self.graph = graph
        self.order = order
        self.detached: list[tuple[K, dict[int, Hold]]] = []

    def __enter__(self) -> DetachedPrefix[K]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.move_to(0)

    def move_to(self, count: int) -> None:
        detached, graph = self.detached, self.graph
        while len(detached) < count:
            key = self.order[len(detached)]
            detached.append((key, graph.detach(key)))
        while len(detached) > count:
            graph.attach(*detached.pop())

    def shortest_fitting(self, request: Request, policy: str) -> int | None:
        """The fewest allocations, in order, whose ending lets `request` fit (left detached), or None.

        Fitting is monotone in freed resources: exponential, then binary search.
        """
        graph, total = self.graph, len(self.order)
        low, high = 0, 1
        while True:
            if high > total:
                return None
            self.move_to(high)
            if graph.fits(request, policy):
                break
            low, high = high, min(high * 2, total) if high < total else high + 1
        while high - low > 1:
            mid = (low + high) // 2
            self.move_to(mid)
            if graph.fits(request, policy):
                high = mid
            else:
                low = mid
        self.move_to(high)
        return high
