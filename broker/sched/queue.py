"""The queue policy: priority order, array jobs and EASY backfill.

Scheduler owns the allocations it starts (graph keys are (job_id, element))
and is driven by the broker: enqueue/cancel on submissions, schedule(now)
whenever something changed, release(job_id, element, now) when a task set
ends.  It never reads the clock and never blocks.

Bounds that keep a cycle cheap on a long queue (see docs/scheduling.md):
  * a cycle with no change to the graph or the queue since the last
    complete cycle returns at once;
  * the scan stops as soon as no core is free anywhere;
  * within a cycle a (request, policy) that failed to match is not tried
    again: free resources only shrink during a cycle;
  * after the head job is blocked at most `backfill_depth` queued jobs are
    examined for backfill.

Arrays of one-slot CPU-only elements are started many per pass
(graph.alloc_array: one walk over the candidate nodes, accounting once per
node, interned Allocations), with the same result as one match + alloc per
element; their release takes a specialised free.  See docs/scheduling.md.

Sharing (docs/scheduling.md, "Queues, limits and fair share"): the order is
a merge of per-bucket runs (broker/sched/ordering.py), a bucket a limit or a
stopped queue holds is skipped whole (broker/sched/limits.py), and a blocked
head from a higher-priority queue may preempt (broker/sched/preempt.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from itertools import repeat
from typing import Any

from minicluster.model.idset import IdSet

from .alloc import Allocation
from .backfill import Reservation, plan_reservation
from .cycle import Cycle
from .feasible import down_nodes_needed
from .graph import ResourceGraph
from .jobs import Pending, Preemption, SchedJob, Start
from .limits import LimitCounters
from .ordering import OrderKey, Ordering
from .policies import check_policy
from .preempt import choose_victims, lost_work
from .request import Request

DEFAULT_BACKFILL_DEPTH = 1000
# The requests a single job sent ahead may have: one core, nothing else (it takes over another's core).
_ONE_CORE = (Request(), Request(nnodes=1))


# A job's own priority term at a time: the broker's multifactor priority, or, by default, its urgency.
Term = Callable[[SchedJob, float], float]
# Called with (job, +n or -n, now, seconds) when n elements of the job start or end (seconds: their run times
# summed, for ends): the broker's fair-share usage.
UsageHook = Callable[[SchedJob, int, float, float], None]


_new_tuple = tuple.__new__


class Scheduler:
    """Priority queue with EASY backfill over one ResourceGraph."""

    # Start eligible array elements many per pass (graph.alloc_array).  The
    # result is the same as one match + alloc per element; tests turn it off
    # to compare.
    array_fast_path = True

    def __init__(self, graph: ResourceGraph, policy: str = "first-fit",
                 default_time_limit: float = 3600.0,
                 backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
                 term: Term | None = None, limits: LimitCounters | None = None) -> None:
        self.graph = graph
        self.policy = check_policy(policy)
        self.default_time_limit = default_time_limit
        self.backfill_depth = backfill_depth
        self.term: Term = term or (lambda job, now: float(job.urgency))
        self.limits = limits or LimitCounters()
        self.usage_hook: UsageHook | None = None
        # Queues: stopped ones start nothing; base priorities decide who may preempt whom.
        self.stopped: set[str] = set()
        self.queue_priority: dict[str, int] = {}
        self.preemptible: set[str] = set()
        self.preempt_grace = 0.0
        self._pending: dict[int, Pending] = {}
        self._ordering = Ordering(live=lambda job_id: self._pending[job_id].remaining > 0,
                                  runs=lambda job_id: self._pending[job_id].job.queue not in self.stopped)
        # The time every queued job's term is dated at (its age): the last reprioritize, or the first enqueue.
        # Dated at each job's own enqueue, a job whose submission took longer to become durable would count as
        # older than one submitted before it, and overtake it until the next reprioritize.
        self._term_time: float | None = None
        self._running: dict[tuple[int, int], float] = {}  # (job, element) -> expected end
        # Jobs with running elements: the job and how many of its elements run.
        self._active: dict[int, list[Any]] = {}
        self._preemptions: list[Preemption] = []
        self._dying: set[tuple[int, int]] = set()          # preempted, not yet released
        self._preempting: dict[int, set[tuple[int, int]]] = {}
        self._preempt_stamp: tuple[int, ...] | None = None
        self._reservation: Reservation | None = None
        self._reservation_stamp: tuple[int, int, int] | None = None
        self._queue_version = 0
        self._releases = 0
        self._quiet_stamp: tuple[int, int] | None = None
        # Single jobs sent ahead (protocol.md §2.10): out of the queue, not yet running; and whether a job was
        # queued or re-prioritized since `overtaken_ahead` last looked.
        self._ahead_jobs: dict[int, SchedJob] = {}
        self._ahead_check = False
        # Queued jobs whose last element started since the last pass: `schedule` drops them from the queue (looking
        # only at these, not at every queued job: a pass must not cost O(queue)).
        self._exhausted: list[int] = []

    # ------------------------------------------------------------- the queue

    def enqueue(self, job: SchedJob, now: float | None = None) -> None:
        """Queue a job (the broker checks graph.check_feasible at submit); its priority term is dated at the last
        `reprioritize`, or at `now` if there was none yet."""
        if job.job_id in self._pending:
            raise ValueError(f"job {job.job_id} is already queued")
        if self._term_time is None:
            self._term_time = job.submit_time if now is None else now
        key = self._order_key(job, self._term_time)
        self._pending[job.job_id] = Pending(job, key, self.array_fast_path)
        self._ordering.insert(job.bucket, key)
        self.limits.queued(job.queue, job.user, job.count)
        self._queue_version += 1
        self._ahead_check = bool(self._ahead_jobs)

    def _order_key(self, job: SchedJob, now: float) -> OrderKey:
        return (-self.term(job, now), job.submit_time, job.job_id)

    def cancel(self, job_id: int) -> int:
        """Drop the job's pending elements; returns how many were dropped."""
        entry = self._pending.pop(job_id, None)
        if entry is None:
            return 0
        job = entry.job
        self._ordering.remove(job.bucket, entry.key)
        self.limits.queued(job.queue, job.user, -entry.remaining)
        self._queue_version += 1
        self._preempting.pop(job_id, None)
        if self._reservation is not None and self._reservation.job_id == job_id:
            self._reservation = None
        return entry.remaining

    def extend(self, job_id: int, count: int) -> bool:
        """Add `count` elements to a queued array (numbered after its last); False when it is not queued."""
        entry = self._pending.get(job_id)
        if entry is None:
            return False
        job = entry.job
        grown = Pending(dataclasses.replace(job, count=job.count + count), entry.key, self.array_fast_path)
        grown.started = entry.started
        self._pending[job_id] = grown
        self._ordering.touch(job.bucket)
        self.limits.queued(job.queue, job.user, count)
        self._queue_version += 1
        return True

    # -------------------------------------------------------------- sharing

    def reprioritize(self, now: float) -> None:
        """Every pending job's term again (its age moved on): O(queue log queue), for a periodic caller."""
        pending = self._pending
        self._term_time = now
        for entry in pending.values():
            entry.key = self._order_key(entry.job, now)
        self._ordering.resort(lambda job_id: pending[job_id].key)
        self._queue_version += 1
        self._ahead_check = bool(self._ahead_jobs)

    def set_bucket_bases(self, base_of: Callable[[Hashable], float]) -> None:
        """The shared part of each bucket's priority (fair share): O(buckets)."""
        if self._ordering.set_bases(base_of):
            self._queue_version += 1
            self._ahead_check = bool(self._ahead_jobs)

    def pending_job(self, job_id: int) -> SchedJob | None:
        entry = self._pending.get(job_id)
        return entry.job if entry is not None else None

    def priority_of(self, job_id: int) -> float | None:
        """The pending job's priority as the queue orders it now: bucket base + its own term."""
        entry = self._pending.get(job_id)
        if entry is None:
            return None
        return self._ordering.base_of(entry.job.bucket) - entry.key[0]

    def stop_queue(self, queue: str) -> None:
        self.stopped.add(queue)
        self._queue_version += 1

    def start_queue(self, queue: str) -> None:
        self.stopped.discard(queue)
        self._ordering.rebuild_heads()
        self._queue_version += 1

    def reason_of(self, job_id: int) -> str | None:
        """Why a pending job waits, in Slurm's words: a stopped queue, a limit, `Resources` (the blocked head
        job), `NodesDown: RANKS` (only nodes that are down could hold it) or `Priority` (others come first); None
        when the job is not pending."""
        entry = self._pending.get(job_id)
        if entry is None:
            return None
        if entry.job.queue in self.stopped:
            return f"QueueStopped: queue {entry.job.queue} is stopped"
        bucket = self._ordering.buckets.get(entry.job.bucket)
        if bucket is not None and bucket.reason:
            return bucket.reason
        res = self._reservation
        if res is not None and res.job_id == job_id:
            return "Resources"
        down = down_nodes_needed(self.graph, entry.job.request)
        return f"NodesDown: {IdSet.from_ints(down)}" if down else "Priority"

    def take_preemptions(self) -> list[Preemption]:
        """The preemptions decided since the last call: the broker ends those elements."""
        out, self._preemptions = self._preemptions, []
        return out

    def _noted_start(self, job: SchedJob, n: int, now: float, from_queue: bool = True) -> None:
        active = self._active.get(job.job_id)
        if active is None:
            self._active[job.job_id] = [job, n]
        else:
            active[1] += n
        self.limits.started(job.queue, job.user, n, job.cores, job.gpus, from_queue)
        if self.usage_hook is not None:
            self.usage_hook(job, n, now, 0.0)

    def _noted_release(self, job_id: int, n: int, now: float, ends: float) -> None:
        """n elements of the job ended; `ends` is the sum of their planned ends (start + time limit)."""
        active = self._active.get(job_id)
        if active is None:
            return  # adopted without its job (an older caller): nothing was counted
        job = active[0]
        active[1] -= n
        if active[1] <= 0:
            del self._active[job_id]
        self.limits.released(job.queue, job.user, n, job.cores, job.gpus)
        if self.usage_hook is not None:
            self.usage_hook(job, -n, now, max(0.0, n * (now + self._time_limit(job)) - ends))

    def pending_count(self) -> int:
        """Pending elements (an array job counts each element not yet started)."""
        return sum(e.remaining for e in self._pending.values())

    def running_count(self) -> int:
        return len(self._running)

    def estimated_start(self, job_id: int) -> float | None:
        """Reserved start time of the blocked head job; None for any other job."""
        res = self.reservation_of(job_id)
        return res.start if res is not None else None

    def reservation_of(self, job_id: int) -> Reservation | None:
        """The blocked head job's reservation; None for any other job."""
        res = self._reservation
        return res if res is not None and res.job_id == job_id else None

    def holds(self, job_id: int, element: int) -> bool:
        """Whether the element's resources are allocated; a restarted rank 0 adopts them only when settling."""
        return (job_id, element) in self._running

    def release(self, job_id: int, element: int, now: float) -> None:
        """The element's resources are free again (ended, failed or cancelled)."""
        key = (job_id, element)
        self.graph.free(key)
        end = self._running.pop(key)
        self._releases += 1
        self._dying.discard(key)
        self._noted_release(job_id, 1, now, end)

    def release_many(self, elements: Iterable[tuple[int, int]], now: float) -> None:
        """release() each (job_id, element), accounting once per node (graph.free_many).

        Nothing is released if one of them is not running (KeyError).
        """
        keys = [(job_id, element) for job_id, element in elements]
        running = self._running
        missing = next((k for k in keys if k not in running), None)
        if missing is not None:
            raise KeyError(missing)
        self.graph.free_many(keys)
        self._releases += len(keys)
        if self._dying:
            self._dying.difference_update(keys)
        jobs = {job_id for job_id, _ in keys}
        if len(jobs) == 1:  # elements of one array (the common case): sums in C
            self._noted_release(jobs.pop(), len(keys), now, sum(map(running.pop, keys)))
            return
        ends: dict[int, list[float]] = {}
        for key in keys:
            end = running.pop(key)
            found = ends.get(key[0])
            if found is None:
                ends[key[0]] = [1, end]
            else:
                found[0] += 1
                found[1] += end
        for job_id, (n, total) in ends.items():
            self._noted_release(job_id, int(n), now, total)

    def take_ahead(self, job_id: int, count: int) -> range:
        """Up to `count` more elements of a queued array to send ahead of its free cores (protocol.md §2.10):
        taken from the queue without resources; each later takes over a running element's with `pass_on`, or
        comes back with `extend`. None unless the array is the head of the queue (a job that comes first would be
        overtaken; one behind it waits for its elements anyway), for an array off the fast path (one flat CPU-only
        slot per element) or in a stopped queue."""
        entry = self._pending.get(job_id)
        head = self._ordering.head()
        if entry is None or not entry.batch or entry.job.queue in self.stopped or head is None or head[2] != job_id:
            return range(0)
        n = min(count, entry.remaining)
        first = entry.started
        entry.started += n
        if not entry.remaining:
            self._exhausted.append(job_id)
        self.limits.queued(entry.job.queue, entry.job.user, -n)
        self._queue_version += 1
        return range(first, first + n)

    def pass_on(self, job_id: int, passes: list[tuple[int, int]], now: float) -> None:
        """For each (element, to) in order: element `element` ended and element `to` (taken with `take_ahead`) runs
        on its resources from now; a later pair may pass on what an earlier one started. Counted for limits and
        fair share once for all of them: the dispatch window passes on most of a big array's elements."""
        running, dying = self._running, self._dying
        active = self._active.get(job_id)
        until = now + (self._time_limit(active[0]) if active is not None else self.default_time_limit)
        ends = 0.0
        for element, to in passes:
            old, new = (job_id, element), (job_id, to)
            self.graph.rekey(old, new)
            ends += running.pop(old)
            running[new] = until
            if dying:
                dying.discard(old)
        self._releases += len(passes)  # running elements' planned ends moved: reservations are planned again
        self._noted_release(job_id, len(passes), now, ends)
        if active is not None:
            self._noted_start(active[0], len(passes), now, from_queue=False)

    def hand_over(self, job_id: int, element: int, to_job: int, now: float) -> None:
        """Element `element` of job `job_id` ended and the single job `to_job` (taken with `take_ahead_job`) runs
        on its resources from now, as its element 0."""
        old, new = (job_id, element), (to_job, 0)
        self.graph.rekey(old, new)
        end = self._running.pop(old)
        self._dying.discard(old)
        self._releases += 1  # a running element's planned end moved: reservations are planned again
        self._noted_release(job_id, 1, now, end)
        job = self._ahead_jobs.pop(to_job, None)
        if job is not None:
            self._running[new] = now + self._time_limit(job)
            self._noted_start(job, 1, now, from_queue=False)
        else:
            self._running[new] = now + self.default_time_limit

    def take_ahead_job(self, eligible: Callable[[int], bool], after: int) -> SchedJob | None:
        """The job at the head of the queue, to send ahead behind job `after` (running or itself taken) on a busy
        core (protocol.md §2.10), if it is one task on one core (no GPUs, memory, exclusivity or constraints),
        `eligible` says yes and no core is free anywhere; taken out of the queue without resources. In a queue
        with limits only behind a job of the same queue and user: starting in its place keeps the counts. It later
        takes over a running job's resources with `hand_over`, or comes back with `drop_ahead`."""
        if self.graph.cluster.free_cores:
            return None  # it would wait behind a busy core where it could start at once
        head_key = self._ordering.head()
        if head_key is None:
            return None
        head = head_key[2]
        job = self._pending[head].job
        if job.count != 1 or job.request not in _ONE_CORE or not eligible(head):
            return None
        if self.limits.limited(job.queue):
            before = self._ahead_jobs.get(after) or (self._active[after][0] if after in self._active else None)
            if before is None or (before.queue, before.user) != (job.queue, job.user):
                return None
        self.cancel(head)
        self._ahead_jobs[head] = job
        return job

    def drop_ahead(self, job_id: int) -> None:
        """A single job sent ahead came back unstarted (or its job ended): forgotten here."""
        self._ahead_jobs.pop(job_id, None)

    def overtaken_ahead(self) -> list[int]:
        """Single jobs sent ahead and not started that a job waiting in the queue comes before (queued or
        re-prioritized since they were taken): the broker recalls them. Empty unless the queue changed so."""
        if not self._ahead_check:
            return []
        self._ahead_check = False
        head = self._ordering.head()
        if head is None:
            return []
        term_time = self._term_time if self._term_time is not None else 0.0
        out = []
        for job_id, job in self._ahead_jobs.items():
            key = self._order_key(job, term_time)
            if (key[0] - self._ordering.base_for(job.bucket), key[1], key[2]) > head:
                out.append(job_id)
        return out

    def adopt(self, job_id: int, element: int, allocation: Allocation,
              start_time: float, time_limit: float | None = None, job: SchedJob | None = None) -> None:
        """Re-register a running element (broker restart from its journal); `job` counts it for limits."""
        self.graph.alloc((job_id, element), allocation)
        self._running[(job_id, element)] = start_time + (time_limit or self.default_time_limit)
        if job is not None:
            self._noted_start(job, 1, start_time, from_queue=False)

    # ------------------------------------------------------------ scheduling

    def schedule(self, now: float, limit: int | None = None) -> list[Start]:
        """Start what can start now, in priority order, then backfill."""
        if self._quiet_stamp == (self.graph.version, self._queue_version):
            return []
        cycle = Cycle(self, now, limit)
        cycle.run()
        exhausted, self._exhausted = self._exhausted, []
        for jid in exhausted:
            entry = self._pending.get(jid)
            if entry is not None and not entry.remaining:
                self.cancel(jid)
        self._quiet_stamp = None if cycle.truncated else (self.graph.version, self._queue_version)
        return cycle.starts

    def _time_limit(self, job: SchedJob) -> float:
        return job.time_limit or self.default_time_limit

    def _start(self, entry: Pending, allocation: Allocation, now: float) -> Start:
        job = entry.job
        key = (job.job_id, entry.started)
        self.graph.alloc(key, allocation)
        self._running[key] = now + self._time_limit(job)
        entry.started += 1
        if not entry.remaining:
            self._exhausted.append(job.job_id)
        self._noted_start(job, 1, now)
        self._preempting.pop(job.job_id, None)
        return Start(job.job_id, key[1], allocation)

    def _start_batch(self, entry: Pending, policy: str, now: float, room: int) -> list[Start]:
        """Start up to `room` elements of an array in one pass (graph.alloc_array)."""
        job = entry.job
        req = job.request
        cl = self.graph.cluster
        want = min(entry.remaining, room, cl.free_cores // req.cores_per_slot)
        if req.mem_per_slot:
            want = min(want, cl.free_mem // req.mem_per_slot)
        if want <= 0:
            return []
        job_id, first = job.job_id, entry.started
        keys = list(zip(repeat(job_id, want), range(first, first + want), strict=True))
        allocs = self.graph.alloc_array(keys, req, policy)
        n = len(allocs)
        if not n:
            return []
        self._running.update(dict.fromkeys(keys[:n] if n < want else keys,
                                           now + self._time_limit(job)))
        entry.started += n
        if not entry.remaining:
            self._exhausted.append(job_id)
        self._noted_start(job, n, now)
        # Start(job_id, e, alloc) for each, built without a Python-level call per element
        return list(map(_new_tuple, repeat(Start, n), zip(repeat(job_id, n),
                                                          range(first, first + n), allocs, strict=True)))

    def _limit_room(self, job: SchedJob, want: int) -> tuple[int, str | None]:
        if job.queue in self.stopped:
            return 0, f"QueueStopped: queue {job.queue} is stopped"
        return self.limits.room(job.queue, job.user, job.cores, job.gpus, want)

    def _preempt_for(self, entry: Pending, policy: str, now: float) -> None:
        """Preempt running elements of lower-priority preemptible queues so the blocked head can start."""
        job = entry.job
        waiting = self._preempting.get(job.job_id)
        if waiting and waiting & self._dying:
            return  # its victims are still on their way out
        rank = self.queue_priority.get(job.queue, 0)
        victims_from = {q for q in self.preemptible if self.queue_priority.get(q, 0) < rank
                        and self.limits.by_queue.get(q) is not None and self.limits.by_queue[q].running > 0}
        if not victims_from:
            return
        stamp = (job.job_id, self._releases, self.graph.topology_version, len(self._running))
        if stamp == self._preempt_stamp:
            return  # nothing changed since no set of victims made it fit
        candidates = lost_work(self._running, self._active, victims_from, self._dying, self._time_limit, now)
        chosen = choose_victims(self.graph, job.request, policy, candidates)
        if chosen is None:
            self._preempt_stamp = stamp
            return
        for key in chosen:
            # SIGTERM now, SIGKILL after the grace: the reservation plans on their resources by then.
            self._running[key] = now + self.preempt_grace
            self._dying.add(key)
            self._preemptions.append(Preemption(key[0], key[1], job.job_id))
        self._preempting[job.job_id] = set(chosen)
        self._reservation_stamp = None

    def _reserve(self, entry: Pending, now: float) -> Reservation | None:
        """Reservation for the blocked head, reused while still valid."""
        job = entry.job
        stamp = (job.job_id, self._releases, self.graph.topology_version)
        res = self._reservation
        if stamp != self._reservation_stamp or res is None or res.start < now:
            res = plan_reservation(self.graph, job.job_id, job.request,
                                   job.policy or self.policy, self._running, now)
        self._reservation, self._reservation_stamp = res, stamp
        return res
