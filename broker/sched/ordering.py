"""Queue order with fair share: one sorted run of pending jobs per bucket, merged when a cycle walks the queue.

A job's priority is `base(bucket) + term(job)`: the bucket (queue, user, project) carries what all its jobs
share, the fair-share part, and the job its own factors (age, queue, size, urgency).  A fair-share update
therefore moves whole buckets without touching one job, and a cycle merges the bucket heads with a heap: O(log B)
per job it looks at, never O(queue).  A bucket a limit blocks is dropped from the merge in O(1), so a user with
50,000 jobs held back by a limit costs nothing to walk past.

`head()`, the first job that may start (what the dispatch window takes from), is kept between cycles as a heap of
bucket heads with lazy invalidation: O(log B) amortised per lookup instead of a scan of every bucket.

Order keys are `(-term, submit_time, job_id)`: within a bucket the highest term first, then the oldest.  The
merged order is by `-(base + term)` with the same tie-breaks.  Pure: no I/O, no clock.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator

OrderKey = tuple[float, float, int]


class Bucket:
    """The pending jobs of one bucket, in order."""

    __slots__ = ("name", "base", "keys", "reason")

    def __init__(self, name: Hashable) -> None:
        self.name = name
        self.base = 0.0
        self.keys: list[OrderKey] = []
        # Why the bucket's jobs wait, when a limit or a stopped queue holds all of them (set by the cycle).
        self.reason: str | None = None


class Ordering:
    def __init__(self, live: Callable[[int], bool] = lambda job_id: True,
                 runs: Callable[[int], bool] = lambda job_id: True) -> None:
        self.buckets: dict[Hashable, Bucket] = {}
        # The last base function given: a bucket created later starts with its base, not 0.
        self._base_of: Callable[[Hashable], float] | None = None
        # For head(): whether a queued job still has elements to start, and whether its queue runs.
        self._live, self._runs = live, runs
        # (merged key of a bucket's head when pushed, tie-break, bucket). Invariant: every bucket with a head that
        # may start has an entry whose key is <= its head's merged key now; stale entries are fixed when on top.
        self._heads: list[tuple[float, float, int, int, Bucket]] = []
        self._pushes = itertools.count()

    def __len__(self) -> int:
        return sum(len(b.keys) for b in self.buckets.values())

    def insert(self, bucket: Hashable, key: OrderKey) -> None:
        found = self.buckets.get(bucket)
        if found is None:
            found = self.buckets[bucket] = Bucket(bucket)
            if self._base_of is not None:
                found.base = self._base_of(bucket)
        keys = found.keys
        at = bisect.bisect_left(keys, key)
        keys.insert(at, key)
        if at == 0 or not self._live(keys[at - 1][2]):
            self._push_head(found)  # it may be the bucket's new head (the ones before it have all started)

    def remove(self, bucket: Hashable, key: OrderKey) -> None:
        found = self.buckets[bucket]
        keys = found.keys
        del keys[bisect.bisect_left(keys, key)]
        if not keys:
            del self.buckets[bucket]

    def set_bases(self, base_of: Callable[[Hashable], float]) -> bool:
        """Give every bucket its base again; True when one changed (the merged order may have)."""
        self._base_of = base_of
        changed = False
        for bucket in self.buckets.values():
            base = base_of(bucket.name)
            if base != bucket.base:
                bucket.base = base
                changed = True
        if changed:
            self.rebuild_heads()
        return changed

    def base_of(self, bucket: Hashable) -> float:
        found = self.buckets.get(bucket)
        return found.base if found is not None else 0.0

    def base_for(self, bucket: Hashable) -> float:
        """The bucket's base, also for a bucket with no pending job (as it would get if one were queued)."""
        found = self.buckets.get(bucket)
        if found is not None:
            return found.base
        return self._base_of(bucket) if self._base_of is not None else 0.0

    def resort(self, key_of: Callable[[int], OrderKey]) -> None:
        """New order keys for every job (`key_of(job_id)`), each bucket sorted again."""
        for bucket in self.buckets.values():
            keys = [key_of(k[2]) for k in bucket.keys]
            keys.sort()
            bucket.keys = keys
        self.rebuild_heads()

    def clear_reasons(self) -> None:
        for bucket in self.buckets.values():
            if bucket.reason is not None:
                bucket.reason = None
                self._push_head(bucket)  # its entry was dropped while held

    # ----------------------------------------------------- the head of the queue

    def head(self) -> OrderKey | None:
        """The merged key of the first job that may start (its queue runs, no limit holds its bucket), or None."""
        heads = self._heads
        while heads:
            k0, k1, job_id, _, bucket = heads[0]
            now = self._head_of(bucket)
            if now is None:
                heapq.heappop(heads)
            elif now == (k0, k1, job_id):
                return now
            else:
                heapq.heapreplace(heads, (now[0], now[1], now[2], next(self._pushes), bucket))
        return None

    def touch(self, bucket: Hashable) -> None:
        """A job of the bucket has elements to start again (an array grown after its last one started)."""
        found = self.buckets.get(bucket)
        if found is not None:
            self._push_head(found)

    def rebuild_heads(self) -> None:
        """Every bucket's head anew: after the merged keys moved (bases, terms) or a queue started again."""
        heads = []
        for bucket in self.buckets.values():
            now = self._head_of(bucket)
            if now is not None:
                heads.append((now[0], now[1], now[2], next(self._pushes), bucket))
        heapq.heapify(heads)
        self._heads = heads

    def _push_head(self, bucket: Bucket) -> None:
        if len(self._heads) > 2 * len(self.buckets) + 64:
            self.rebuild_heads()  # stale entries piled up: O(B), once per as many pushes
            return
        now = self._head_of(bucket)
        if now is not None:
            heapq.heappush(self._heads, (now[0], now[1], now[2], next(self._pushes), bucket))

    def _head_of(self, bucket: Bucket) -> OrderKey | None:
        """The merged key of the bucket's first job with elements to start, if the bucket may start one."""
        if bucket.reason or self.buckets.get(bucket.name) is not bucket:
            return None
        for key in bucket.keys:
            if not self._runs(key[2]):
                return None  # its queue is stopped (all of a bucket's jobs are in one queue)
            if self._live(key[2]):
                return (key[0] - bucket.base, key[1], key[2])
        return None

    def merged(self) -> Merge:
        return Merge(list(self.buckets.values()))


class Merge:
    """One walk over every bucket in priority order; `drop(bucket)` skips the rest of a bucket.

    The buckets must not change during the walk (a scheduling cycle neither queues nor cancels).
    """

    def __init__(self, buckets: list[Bucket]) -> None:
        self._buckets = buckets
        self._dropped: set[int] = set()  # id() of the buckets dropped: no index of every bucket built per walk

    def drop(self, bucket: Bucket) -> None:
        self._dropped.add(id(bucket))

    def __iter__(self) -> Iterator[tuple[Bucket, int]]:
        buckets = self._buckets
        if len(buckets) == 1:
            # One user in one queue (the common single-tenant case): its own order, no heap, and no copy of it (a
            # pass would cost O(queue)): nothing queues or cancels during a walk.
            only = buckets[0]
            for key in only.keys:
                if self._dropped:
                    return
                yield only, key[2]
            return
        heap = [(b.keys[0][0] - b.base, b.keys[0][1], b.keys[0][2], i, 0) for i, b in enumerate(buckets) if b.keys]
        heapq.heapify(heap)
        dropped = self._dropped
        while heap:
            _, _, job_id, i, pos = heap[0]
            bucket = buckets[i]
            yield bucket, job_id
            pos += 1
            keys = bucket.keys
            if pos >= len(keys) or (dropped and id(bucket) in dropped):
                heapq.heappop(heap)
            else:
                key = keys[pos]
                heapq.heapreplace(heap, (key[0] - bucket.base, key[1], key[2], i, pos))
