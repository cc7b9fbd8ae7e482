"""What `mc report` draws, gathered without holding a large history whole: task attempts are folded one page at a
time into a `Timeline` (time bins per rank), and kept one by one only while there are few enough to draw each.

Pure: no client, no I/O; `minicluster/cli/report.py` feeds it, `minicluster/cli/reporthtml.py` draws it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Time bins of the Gantt heat map and of the cores-busy curve: points enough for a wide screen, few enough that
# a 100,000-task array makes a file of a few hundred kB.
MAX_BINS = 600
# Up to this many attempts each is a bar of its own; beyond, the Gantt shows busy fractions per rank and bin.
DETAIL_LIMIT = 2_000
# Outcomes of an attempt that did not end the task (protocol.md §3.3 `attempts`).
PREEMPTED = frozenset({"requeue", "node-lost", "broker-restart", "shutdown"})
KINDS = ("ok", "failed", "retried", "preempted", "running")
_DEPENDENCY = re.compile(r"after[a-z]*:([0-9]+)")


@dataclass(frozen=True)
class Attempt:
    """One run of one task, as the Gantt draws it."""

    job: int
    task: int
    index: int
    attempt: int
    rank: int
    started: float
    ended: float | None
    kind: str            # one of KINDS
    status: int | None


def attempt_kind(outcome: str, status: int | None, error: str | None, ended: float | None) -> str:
    if outcome == "retry":
        return "retried"
    if outcome in PREEMPTED:
        return "preempted"
    if ended is None:
        return "running"
    return "ok" if status == 0 and not error else "failed"


def dependency_targets(description: str) -> list[int]:
    """The job ids a `dependency-add` description names (`afterok:12`); none for singleton or begin-time."""
    return [int(m) for m in _DEPENDENCY.findall(description)]


@dataclass
class RankRow:
    """Per rank: the attempts by kind and core-seconds busy in each time bin."""

    busy: list[float]
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    marked: dict[int, str] = field(default_factory=dict)   # bin -> the worst kind that ended in it


# Which kind a bin of the binned Gantt shows when attempts of several kinds ended in it.
SEVERITY = {"failed": 3, "preempted": 2, "retried": 1}


class Timeline:
    """Folds attempts into bins of [t0, t1]; keeps each attempt only while there are at most `detail_limit`."""

    def __init__(self, t0: float, t1: float, bins: int = MAX_BINS, detail_limit: int = DETAIL_LIMIT) -> None:
        self.t0 = t0
        self.t1 = max(t1, t0 + 1e-3)
        self.nbins = bins
        self.width = (self.t1 - self.t0) / bins
        self.ranks: dict[int, RankRow] = {}
        self.detail: list[Attempt] | None = []
        self.detail_limit = detail_limit
        self.count = 0

    def add(self, job: int, cores: int, row: list[Any], now: float) -> None:
        """One `attempts` row `[task, index, attempt, rank, status, exit_code, signal, error, started, ended,
        outcome]` of `job`, whose tasks hold `cores` each."""
        task, index, attempt, rank, status, _code, _signal, error, started, ended, outcome = row[:11]
        if started is None or rank is None:
            return  # never ran: nothing to draw
        kind = attempt_kind(outcome, status, error, ended)
        self.count += 1
        if self.detail is not None:
            if len(self.detail) < self.detail_limit:
                self.detail.append(Attempt(job, task, index, attempt, rank, started, ended, kind, status))
            else:
                self.detail = None
        rank_row = self.ranks.setdefault(rank, RankRow([0.0] * self.nbins))
        rank_row.kinds[kind] += 1
        self._spread(rank_row.busy, started, now if ended is None else ended, cores)
        if kind in SEVERITY:
            at = self._bin(now if ended is None else ended)
            if SEVERITY[kind] > SEVERITY.get(rank_row.marked.get(at, ""), 0):
                rank_row.marked[at] = kind

    def _bin(self, t: float) -> int:
        return min(self.nbins - 1, max(0, int((t - self.t0) / self.width)))

    def _spread(self, busy: list[float], start: float, end: float, cores: int) -> None:
        start, end = max(start, self.t0), min(end, self.t1)
        if end <= start:
            return
        first, last = self._bin(start), self._bin(end)
        for b in range(first, last + 1):
            lo = self.t0 + b * self.width
            overlap = min(end, lo + self.width) - max(start, lo)
            if overlap > 0:
                busy[b] += overlap * cores

    def cores_busy(self) -> dict[int, list[float]]:
        """Per rank, the mean number of cores busy in each bin."""
        return {rank: [s / self.width for s in row.busy] for rank, row in sorted(self.ranks.items())}


@dataclass
class JobInfo:
    """One selected job: its `mc jobs --json` record, what it depends on, and its usage when it has ended."""

    record: dict[str, Any]
    depends: list[int] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    @property
    def id(self) -> int:
        return int(self.record["id"])

    def cores_per_task(self) -> int:
        """From the usage record: an array holds one element's cores, a plain job all its tasks' (1 unknown)."""
        if not self.usage or not self.usage.get("cores"):
            return 1
        if self.record.get("array"):
            return int(self.usage["cores"])
        return max(1, int(self.usage["cores"]) // max(1, int(self.usage.get("ntasks") or 1)))


@dataclass
class Report:
    command: str
    title: str
    generated: float
    jobs: list[JobInfo]
    timeline: Timeline
    cores: dict[int, int]                  # rank -> cores it has now
    usage: list[dict[str, Any]]            # per user and bank: {user, project, jobs, core_hours, cpu_hours}
    groups: dict[int, str] = field(default_factory=dict)   # rank -> its topology path (zone=a/rack=r1)


def usage_by_user(jobs: list[JobInfo]) -> list[dict[str, Any]]:
    """The selected jobs' usage records summed per user and bank."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for info in jobs:
        if not info.usage:
            continue
        key = (str(info.record.get("user")), str(info.usage.get("project") or "-"))
        row = out.setdefault(key, {"user": key[0], "project": key[1], "jobs": 0, "core_hours": 0.0,
                                   "cpu_hours": 0.0})
        row["jobs"] += 1
        row["core_hours"] += float(info.usage.get("core_seconds") or 0) / 3600
        row["cpu_hours"] += float(info.usage.get("cpu_seconds") or 0) / 3600
    return sorted(out.values(), key=lambda r: (-r["core_hours"], r["user"], r["project"]))


def rank_groups(vertex: dict[str, Any], path: str = "") -> dict[int, str]:
    """Each node's rank -> the path of topology levels above it (`zone=a/rack=r1`) in a `resources` tree
    (protocol.md §3.3); empty when the instance has no levels."""
    kind = vertex.get("type")
    if kind == "node":
        return {int(vertex["rank"]): path} if path else {}
    if kind not in ("cluster", "socket", None):
        path = f"{path}/{kind}={vertex.get('name')}".lstrip("/")
    out: dict[int, str] = {}
    for child in vertex.get("children") or ():
        out.update(rank_groups(child, path))
    return out
