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


_NEVER, _LOST, _UNRESPONSIVE = RankState.NEVER, RankState.LOST, RankState.UNRESPONSIVE


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
    """Every rank's state, and how many of the expected ranks (those below `size`) are in each state: kept on
    every transition, so `all_up` and `counts` cost nothing at 10,000 ranks (a join storm asks after each join)."""

    def __init__(self, size: int, tree_size: int, endpoint_of: Callable[[int], str], unresponsive_after: float,
                 lost_after: float, wall: Callable[[], float] = time.time) -> None:
        self.size = size
        self.wall = wall
        self.unresponsive_after = unresponsive_after
        self.lost_after = lost_after
        self.ranks = {r: RankInfo(r, endpoint=endpoint_of(r)) for r in range(tree_size)}
        # Ranks heard from again after being unresponsive or lost, until taken: their children may be adopted
        # elsewhere and are to be sent home (protocol.md §2.4.1).
        self.came_back: list[int] = []
        self._expected_in: dict[RankState, int] = {}
        self._recount()
        # The members other than rank 0, least recently heard first (each heard from moves to the end): a sweep
        # reads only the silent ones at the front, not every rank (twice per heartbeat interval at 10,000 ranks).
        # Every `now` passed in is the latest, so the order is that of `last_seen`.
        self._by_silence: dict[int, RankInfo] = {}

    def _recount(self) -> None:
        self._expected_in = dict.fromkeys(RankState, 0)
        for r in range(self.size):
            self._expected_in[self.ranks[r].state] += 1

    def _enter(self, info: RankInfo, state: RankState) -> None:
        """The one place a rank changes state, so the counts stay exact."""
        if info.rank < self.size:
            self._expected_in[info.state] -= 1
            self._expected_in[state] += 1
        if state == RankState.UP and info.state in (RankState.UNRESPONSIVE, RankState.LOST):
            self.came_back.append(info.rank)
        if state == RankState.LOST:
            self._by_silence.pop(info.rank, None)
        info.state, info.since = state, self.wall()

    def _heard(self, info: RankInfo, now: float) -> None:
        info.last_seen = now
        if info.rank:
            by_silence = self._by_silence
            by_silence.pop(info.rank, None)
            by_silence[info.rank] = info

    def resize(self, size: int) -> None:
        self.size = size
        self._recount()

    def joined(self, rank: int, now: float, pid: int | None, hostname: str) -> None:
        info = self.ranks[rank]
        self._enter(info, RankState.UP)
        info.pid, info.hostname = pid, hostname
        self._heard(info, now)

    def heartbeat(self, rank: int, now: float) -> bool:
        """Record a heartbeat; False when the rank has not joined (it must be told to rejoin)."""
        # Inlined `_heard`, and the states by module names: it runs for every beat of every rank.
        info = self.ranks[rank]
        state = info.state
        if state is _NEVER or state is _LOST:
            return False
        info.last_seen = now
        if rank:
            by_silence = self._by_silence
            by_silence.pop(rank, None)
            by_silence[rank] = info
        if state is _UNRESPONSIVE:
            self._enter(info, RankState.UP)
        return True

    def seen(self, rank: int, now: float) -> None:
        """Any message from a member proves it alive, not only heartbeats (they queue behind work)."""
        info = self.ranks[rank]
        if info.state == RankState.UP:
            self._heard(info, now)
        elif info.state == RankState.UNRESPONSIVE:
            self._heard(info, now)
            self._enter(info, RankState.UP)

    def sweep(self, now: float, stalled: float = 0.0) -> list[int]:
        """Advance states by silence; returns the ranks that became lost now.

        `stalled` is how late this sweep runs: time rank 0 itself was too busy to read is not the ranks'
        silence, so it is forgiven.
        """
        if stalled > 0:
            for info in self._by_silence.values():
                info.last_seen += stalled
        silent_ones = []
        for info in self._by_silence.values():
            if now - info.last_seen < self.unresponsive_after:
                break  # all after it were heard from later
            silent_ones.append(info)
        lost = []
        for info in silent_ones:
            if now - info.last_seen >= self.lost_after:
                self._enter(info, RankState.LOST)
                lost.append(info.rank)
            elif info.state == RankState.UP:
                self._enter(info, RankState.UNRESPONSIVE)
        return lost

    def is_member(self, rank: int) -> bool:
        return self.ranks[rank].state in (RankState.UP, RankState.UNRESPONSIVE)

    def counts(self) -> dict[str, int]:
        out = {s.value: n for s, n in self._expected_in.items()}
        out["expected"] = self.size
        return out

    def all_up(self) -> bool:
        return self._expected_in[RankState.UP] == self.size

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"rank": i.rank, "state": i.state.value, "pid": i.pid, "hostname": i.hostname,
             "endpoint": i.endpoint, "since": i.since}
            for i in self.ranks.values() if i.rank < self.size or i.state != RankState.NEVER
        ]
