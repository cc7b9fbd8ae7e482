"""Rank liveness at rank 0 (protocol.md §2.6): joined / up / unresponsive / lost, from heartbeats. No I/O.

Every `now` is monotonic time (time.monotonic()): silence is an interval, and a wall clock that jumps (NTP, an
administrator) must neither lose every rank nor keep a dead one.  Only `since`, which users see, is wall time.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class RankState(enum.Enum):
    NEVER = "never-joined"
    UP = "up"
    UNRESPONSIVE = "unresponsive"
    LOST = "lost"


@dataclass
class RankInfo:
    rank: int
    state: RankState = RankState.NEVER
    pid: int | None = None
    hostname: str = ""
    endpoint: str = ""
    last_seen: float = 0.0  # monotonic
    since: float = 0.0  # wall clock: when it entered its state


class RankTable:
    def __init__(self, size: int, tree_size: int, endpoint_of: Any, unresponsive_after: float,
                 lost_after: float, wall: Callable[[], float] = time.time) -> None:
        self.size = size
        self.wall = wall
        self.unresponsive_after = unresponsive_after
        self.lost_after = lost_after
        self.ranks = {r: RankInfo(r, endpoint=endpoint_of(r)) for r in range(tree_size)}

    def resize(self, size: int) -> None:
        self.size = size

    def joined(self, rank: int, now: float, pid: int | None, hostname: str) -> None:
        info = self.ranks[rank]
        info.state = RankState.UP
        info.pid, info.hostname = pid, hostname
        info.last_seen, info.since = now, self.wall()

    def heartbeat(self, rank: int, now: float) -> bool:
        """Record a heartbeat; False when the rank has not joined (it must be told to rejoin)."""
        info = self.ranks[rank]
        if info.state in (RankState.NEVER, RankState.LOST):
            return False
        info.last_seen = now
        if info.state == RankState.UNRESPONSIVE:
            info.state, info.since = RankState.UP, self.wall()
        return True

    def seen(self, rank: int, now: float) -> None:
        """Any message from a member proves it alive, not only heartbeats (they queue behind work)."""
        info = self.ranks[rank]
        if info.state in (RankState.UP, RankState.UNRESPONSIVE):
            info.last_seen = now
            info.state = RankState.UP

    def sweep(self, now: float, stalled: float = 0.0) -> list[int]:
        """Advance states by silence; returns the ranks that became lost now.

        `stalled` is how late this sweep runs: time rank 0 itself was too busy to read is not the ranks'
        silence, so it is forgiven.
        """
        if stalled > 0:
            for info in self.ranks.values():
                if info.state in (RankState.UP, RankState.UNRESPONSIVE):
                    info.last_seen += stalled
        lost = []
        for info in self.ranks.values():
            if info.state in (RankState.NEVER, RankState.LOST) or info.rank == 0:
                continue
            silent = now - info.last_seen
            if silent >= self.lost_after:
                info.state, info.since = RankState.LOST, self.wall()
                lost.append(info.rank)
            elif silent >= self.unresponsive_after and info.state == RankState.UP:
                info.state, info.since = RankState.UNRESPONSIVE, self.wall()
        return lost

    def is_member(self, rank: int) -> bool:
        return self.ranks[rank].state in (RankState.UP, RankState.UNRESPONSIVE)

    def counts(self) -> dict[str, int]:
        expected = range(self.size)
        out = {s.value: 0 for s in RankState}
        for r in expected:
            out[self.ranks[r].state.value] += 1
        out["expected"] = self.size
        return out

    def all_up(self) -> bool:
        return all(self.ranks[r].state == RankState.UP for r in range(self.size))

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"rank": i.rank, "state": i.state.value, "pid": i.pid, "hostname": i.hostname,
             "endpoint": i.endpoint, "since": i.since}
            for i in self.ranks.values() if i.rank < self.size or i.state != RankState.NEVER
        ]
