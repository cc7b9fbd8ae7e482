"""One scheduling pass of the Scheduler (broker/sched/queue.py): in-order starts by priority, then EASY backfill
behind the blocked head job, within the bounds docs/scheduling.md describes."""

from __future__ import annotations

from typing import Protocol

from .alloc import Allocation
from .backfill import PHANTOM, Reservation
from .graph import ResourceGraph
from .jobs import Pending, SchedJob, Start
from .ordering import Ordering
from .request import Request


class Queue(Protocol):
    """What a pass uses of the Scheduler (queue.py), which builds one per schedule(): its state and the steps that
    start, reserve and preempt. Declared here so that the pass does not import the queue that runs it."""

    graph: ResourceGraph
    policy: str
    backfill_depth: int
    _ordering: Ordering
    _pending: dict[int, Pending]
    _reservation: Reservation | None
    _reservation_stamp: tuple[int, int, int] | None

    def _time_limit(self, job: SchedJob) -> float: ...
    def _limit_room(self, job: SchedJob, want: int) -> tuple[int, str | None]: ...
    def _start(self, entry: Pending, allocation: Allocation, now: float) -> Start: ...
    def _start_batch(self, entry: Pending, policy: str, now: float, room: int) -> list[Start]: ...
    def _preempt_for(self, entry: Pending, policy: str, now: float) -> None: ...
    def _reserve(self, entry: Pending, now: float) -> Reservation | None: ...


class Cycle:
    """One schedule() pass: in-order starts, then backfill behind the head."""

    def __init__(self, sched: Queue, now: float, limit: int | None) -> None:
        self.s, self.now, self.limit = sched, now, limit
        self.starts: list[Start] = []
        self.truncated = False
        self.reservation: Reservation | None = None
        self.phantom_cores = 0  # cores held for the reservation right now
        self.failed: set[tuple[object, ...]] = set()
        self.held: str | None = None  # why the job being looked at may not start (a limit, a stopped queue)

    def run(self) -> None:
        s = self.s
        examined = 0
        merge = s._ordering.merged()
        s._ordering.clear_reasons()
        try:
            for bucket, job_id in merge:
                entry = s._pending.get(job_id)
                if entry is None or not entry.remaining:
                    continue
                if self.reservation is not None:
                    examined += 1
                    if examined > s.backfill_depth or self._nothing_free():
                        break
                self.held = None
                if self.reservation is None:
                    self._start_in_order(entry)
                else:
                    self._backfill(entry)
                if self.held is not None:
                    # A limit or a stopped queue holds this job, and so every later job of its bucket.
                    bucket.reason = self.held
                    merge.drop(bucket)
                if self._limit_reached():
                    break
        finally:
            if self.reservation is not None:
                s.graph.free(PHANTOM)
        s._reservation = self.reservation

    def _room(self, entry: Pending | None = None) -> int:
        """How many more starts this cycle may make (of `entry`: within its queue's limits too)."""
        room = (1 << 62) if self.limit is None else self.limit - len(self.starts)
        if entry is not None:
            allowed, why = self.s._limit_room(entry.job, min(room, entry.remaining))
            if allowed <= 0:
                self.held = why
            room = min(room, allowed)
        return room

    def _limit_reached(self) -> bool:
        if self.limit is not None and len(self.starts) >= self.limit:
            self.truncated = True
        return self.truncated

    def _nothing_free(self) -> bool:
        return self.s.graph.cluster.free_cores + self.phantom_cores == 0

    def _start_in_order(self, entry: Pending) -> None:
        """Start elements while they fit; reserve for the job if it blocks (preempting first if it may)."""
        s, job = self.s, entry.job
        policy = job.policy or s.policy
        while entry.remaining and not self._limit_reached():
            room = self._room(entry)
            if room <= 0:
                return  # held by a limit: not the head, reserves nothing
            if entry.batch:
                started = s._start_batch(entry, policy, self.now, room)
                if not started:
                    break
                self.starts += started
            else:
                alloc = s.graph.match(job.request, policy)
                if alloc is None:
                    break
                self.starts.append(s._start(entry, alloc, self.now))
            s._reservation_stamp = None  # in-order starts may occupy what it counted on
        if not entry.remaining or self.truncated:
            return
        # Unreservable: can never run with the current ranks, so it must not
        # block others; the same shape is not planned twice in one cycle.
        shape = (job.request, policy, "unreservable")
        if shape in self.failed:
            return
        s._preempt_for(entry, policy, self.now)
        self.reservation = s._reserve(entry, self.now)
        if self.reservation is None:
            self.failed.add(shape)
        if self.reservation is not None:
            self._hold_phantom()

    def _hold_phantom(self) -> None:
        graph, res = self.s.graph, self.reservation
        assert res is not None
        graph.hold_free_part(PHANTOM, res.allocation)
        self.phantom_cores = graph.held_cores(PHANTOM)

    def _backfill(self, entry: Pending) -> None:
        """Start elements that leave the reservation alone or end before it."""
        s, job = self.s, entry.job
        policy = job.policy or s.policy
        assert self.reservation is not None
        short = self.now + s._time_limit(job) <= self.reservation.start
        disjoint = (job.request, policy, "disjoint")
        while entry.remaining and not self._limit_reached():
            room = self._room(entry)
            if room <= 0:
                return
            if entry.batch and disjoint not in self.failed:
                started = s._start_batch(entry, policy, self.now, room)
                if started:
                    self.starts += started
                    continue
                self.failed.add(disjoint)
            alloc = self._match(job.request, policy, "disjoint")
            if alloc is not None:
                self.starts.append(s._start(entry, alloc, self.now))
            elif not (short and self._start_over_phantom(entry, policy)):
                return

    def _match(self, request: Request, policy: str, mode: str) -> Allocation | None:
        shape = (request, policy, mode)
        if shape in self.failed:
            return None
        alloc = self.s.graph.match(request, policy)
        if alloc is None:
            self.failed.add(shape)
        return alloc

    def _start_over_phantom(self, entry: Pending, policy: str) -> bool:
        """Start one element ignoring the reservation (it ends before the shadow).

        A shape that already failed this way in this cycle is not tried again; the phantom's
        holds are put back (less what the start took) rather than recomputed.
        """
        shape = (entry.job.request, policy, "any")
        if shape in self.failed:
            return False
        graph = self.s.graph
        holds = graph.detach(PHANTOM)
        alloc = graph.match(entry.job.request, policy)
        if alloc is None:
            self.failed.add(shape)
            graph.attach(PHANTOM, holds)
            return False
        try:
            self.starts.append(self.s._start(entry, alloc, self.now))
        finally:
            # what is still free of the old holds is exactly the free part of the reservation
            graph.hold_free_of(PHANTOM, holds)
            self.phantom_cores = graph.held_cores(PHANTOM)
        return True
