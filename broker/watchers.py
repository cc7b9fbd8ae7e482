"""Followers of event logs, output and job completion (protocol.md §3.3 `eventlog`, `output`, `wait`).

Everything published here is already durable: the job manager publishes from the journal's commit callback,
so a follower that read the history from sqlite and then takes live items (skipping sequence numbers it has
already seen) never sees a gap or a reordering.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

# Bounded per follower: a client that stops reading is cut off rather than growing broker memory.
FOLLOWER_QUEUE = 10_000


class Follower:
    __slots__ = ("queue", "overflowed")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue(FOLLOWER_QUEUE)
        self.overflowed = False

    def put(self, item: Any) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True


class Watchers:
    def __init__(self) -> None:
        self._events: dict[int, set[Follower]] = defaultdict(set)
        self._output: dict[int, set[Follower]] = defaultdict(set)
        self._inactive: dict[int, set[Follower]] = defaultdict(set)

    def follow_events(self, job: int) -> Follower:
        return _add(self._events, job)

    def follow_output(self, job: int) -> Follower:
        return _add(self._output, job)

    def follow_inactive(self, job: int) -> Follower:
        return _add(self._inactive, job)

    def unfollow(self, job: int, follower: Follower) -> None:
        for table in (self._events, self._output, self._inactive):
            group = table.get(job)
            if group is not None:
                group.discard(follower)
                if not group:
                    del table[job]

    def event(self, job: int, event: list[Any]) -> None:
        for f in self._events.get(job, ()):
            f.put(event)

    def output(self, job: int, chunk: list[Any]) -> None:
        for f in self._output.get(job, ()):
            f.put(chunk)

    def inactive(self, job: int, result: dict[str, Any]) -> None:
        """The job ended: wake `wait`ers, and end event and output streams with a None sentinel."""
        for f in self._inactive.get(job, ()):
            f.put(result)
        for table in (self._events, self._output):
            for f in table.get(job, ()):
                f.put(None)


def _add(table: dict[int, set[Follower]], job: int) -> Follower:
    f = Follower()
    table[job].add(f)
    return f
