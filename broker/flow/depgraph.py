"""The job dependency graph (protocol.md §3.9.1). Pure: no I/O, no clock, no job table.

Edges point from a target job to the dependants waiting on it, so ending a job touches only its dependants
(O(dependants), never O(queue)); each waiting job keeps a count of what still blocks it. The broker tells the
graph what happens to jobs (`started`, `ended`, `gone`, `due`) and gets back verdicts: which dependency of which
job is now satisfied or can never be. It posts the events; the graph only decides.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

AFTER_TYPES = ("afterstart", "afterany", "afterok", "afternotok", "aftercorr")
SINGLETON = "singleton"
BEGIN = "begin-time"


class DependencyError(ValueError):
    """A dependency refused at submit: an unknown job, the job itself, or a cycle."""


@dataclass(frozen=True, slots=True)
class TargetState:
    """What the graph needs to know of a target job."""
    started: bool
    ended: bool
    ok: bool = False
    # How it ended, for messages: "failed (status 1)", "was cancelled", "succeeded", ...
    how: str = ""


class Verdict(NamedTuple):
    job: int
    description: str
    satisfied: bool
    reason: str = ""


@dataclass(slots=True)
class _Node:
    """A job with dependencies not yet removed."""
    # description -> target job (0 for singleton and begin-time), in the order they were added.
    pending: dict[str, int] = field(default_factory=dict)
    # How many of `pending` keep the job out of the queue (aftercorr does not: it gates indexes).
    blocking: int = 0


class DepGraph:
    def __init__(self) -> None:
        self._nodes: dict[int, _Node] = {}
        # target -> [(dependant, type, description)]; entries of dependants gone since are skipped.
        self._after: dict[int, list[tuple[int, str, str]]] = {}
        # (uid, name) -> the active jobs of that key: the oldest is the smallest id (ids grow with submission).
        self._names: dict[tuple[int, str], _Oldest] = {}
        self._key_of: dict[int, tuple[int, str]] = {}
        self._begin: list[tuple[float, int]] = []

    # --- adding ----------------------------------------------------------------------------------------------

    def check(self, job: int, targets: Iterable[int], lookup: Callable[[int], TargetState | None]) -> None:
        """Raise DependencyError for a target that is unknown, the job itself, or would close a cycle."""
        for target in targets:
            if target == job:
                raise DependencyError(f"job {job} cannot depend on itself")
            if lookup(target) is None:
                raise DependencyError(f"job {target} does not exist (or was purged)")
        cycle = self.cycle_through(job, targets)
        if cycle:
            raise DependencyError("dependency cycle: " + " -> ".join(map(str, cycle)))

    def cycle_through(self, job: int, targets: Iterable[int]) -> list[int]:
        """The path job -> ... -> job that edges job->targets would close, or [] (depth-first, iterative)."""
        parent: dict[int, int] = {}
        stack = list(targets)
        for t in stack:
            parent.setdefault(t, job)
        while stack:
            node = stack.pop()
            if node == job:
                back = []
                step = parent[job]
                while step != job:
                    back.append(step)
                    step = parent[step]
                return [job, *reversed(back), job]
            waiting = self._nodes.get(node)
            if waiting is None:
                continue
            for nxt in set(waiting.pending.values()):
                if nxt and nxt not in parent:
                    parent[nxt] = node
                    stack.append(nxt)
        return []

    def add(self, job: int, deps: Iterable[tuple[str, int]], lookup: Callable[[int], TargetState | None],
            key: tuple[int, str] | None = None, singleton: bool = False, begin_time: float | None = None,
            now: float = 0.0) -> tuple[list[str], list[Verdict]]:
        """Register `job`'s dependencies ((type, target) pairs; call check() first).

        Returns the descriptions added, in order, and the verdicts already known (targets that started or ended).
        Every active job is tracked under its `key` (uid, name), so that a later `singleton` of that key waits
        for it; jobs are added in submission order.
        """
        node = _Node()
        added: list[str] = []
        decided: list[Verdict] = []
        for kind, target in deps:
            description = f"{kind}:{target}"
            if description in node.pending:
                continue
            node.pending[description] = target
            node.blocking += kind != "aftercorr"
            added.append(description)
            state = lookup(target)
            assert state is not None, "check() first"
            # aftercorr is never judged here: the broker first learns which indexes of the target succeeded,
            # then calls ended() for a target that already ended.
            verdict = _judge(job, kind, description, state) if kind != "aftercorr" else None
            if verdict is not None:
                decided.append(verdict)
            else:
                self._after.setdefault(target, []).append((job, kind, description))
        if key is not None:
            self.track(job, key)
        if begin_time is not None:
            description = f"{BEGIN}={begin_time!r}"
            node.pending[description] = 0
            node.blocking += 1
            added.append(description)
            if begin_time <= now:
                decided.append(Verdict(job, description, True))
            else:
                heapq.heappush(self._begin, (begin_time, job))
        if singleton:
            assert key is not None, "a singleton needs its key"
            node.pending[SINGLETON] = 0
            node.blocking += 1
            added.append(SINGLETON)
            if self._names[key].first() == job:
                decided.append(Verdict(job, SINGLETON, True))
        if node.pending:
            self._nodes[job] = node
        return added, decided

    def track(self, job: int, key: tuple[int, str]) -> None:
        """Count `job` among the active jobs of `key` (uid, name), for later singletons; no dependencies."""
        names = self._names.get(key)
        if names is None:
            names = self._names[key] = _Oldest()
        names.add(job)
        self._key_of[job] = key

    # --- what happens to jobs --------------------------------------------------------------------------------

    def started(self, target: int) -> list[Verdict]:
        """`target` started: its afterstart dependants are satisfied."""
        edges = self._after.get(target)
        if not edges:
            return []
        out, rest = [], []
        for job, kind, description in edges:
            if kind == "afterstart":
                if self._is_pending(job, description):
                    out.append(Verdict(job, description, True))
            else:
                rest.append((job, kind, description))
        if rest:
            self._after[target] = rest
        else:
            del self._after[target]
        return out

    def ended(self, target: int, state: TargetState) -> list[Verdict]:
        """`target` is inactive: every dependency on it is decided."""
        out = []
        for job, kind, description in self._after.pop(target, ()):
            if self._is_pending(job, description):
                verdict = _judge(job, kind, description, state)
                assert verdict is not None
                out.append(verdict)
        return out

    def gone(self, job: int) -> list[Verdict]:
        """`job` is inactive (or was purged): forget it; the next singleton of its key may go."""
        self._nodes.pop(job, None)
        key = self._key_of.get(job)
        return self._leave(job, key) if key is not None else []

    def rename(self, job: int, key: tuple[int, str]) -> list[Verdict]:
        """`job`'s name changed: it takes its place among the active jobs of the new key."""
        old = self._key_of.get(job)
        if old is None or old == key:
            return []
        verdicts = self._leave(job, old)
        names = self._names.setdefault(key, _Oldest())
        names.add(job)
        self._key_of[job] = key
        if names.first() == job and self._is_pending(job, SINGLETON):
            verdicts.append(Verdict(job, SINGLETON, True))
        return verdicts

    def _leave(self, job: int, key: tuple[int, str]) -> list[Verdict]:
        """Take `job` out of its key's active jobs; the new oldest, if a waiting singleton, may go."""
        names = self._names[key]
        was_first = names.first() == job
        names.discard(job)
        del self._key_of[job]
        if not names.active:
            del self._names[key]
            return []
        head = names.first()
        if head is None or not was_first or not self._is_pending(head, SINGLETON):
            return []
        return [Verdict(head, SINGLETON, True)]

    def due(self, now: float) -> list[Verdict]:
        """Begin times that have passed."""
        out = []
        while self._begin and self._begin[0][0] <= now:
            when, job = heapq.heappop(self._begin)
            description = f"{BEGIN}={when!r}"
            if self._is_pending(job, description):
                out.append(Verdict(job, description, True))
        return out

    def next_due(self) -> float | None:
        return self._begin[0][0] if self._begin else None

    def remove(self, verdict: Verdict) -> bool:
        """Apply a satisfied verdict; True when nothing blocks the job any more."""
        node = self._nodes.get(verdict.job)
        if node is None or node.pending.pop(verdict.description, None) is None:
            return False
        if not verdict.description.startswith("aftercorr:"):
            node.blocking -= 1
        if not node.pending:
            del self._nodes[verdict.job]
        return node.blocking == 0

    # --- questions -------------------------------------------------------------------------------------------

    def blocked(self, job: int) -> bool:
        node = self._nodes.get(job)
        return node is not None and node.blocking > 0

    def waiting(self, job: int) -> list[str]:
        node = self._nodes.get(job)
        return list(node.pending) if node is not None else []

    def corr_dependants(self, target: int) -> list[int]:
        """Jobs with a pending aftercorr on `target`."""
        return [job for job, kind, description in self._after.get(target, ())
                if kind == "aftercorr" and self._is_pending(job, description)]

    def _is_pending(self, job: int, description: str) -> bool:
        node = self._nodes.get(job)
        return node is not None and description in node.pending

    def has_dependants(self, target: int) -> bool:
        return target in self._after

    def __len__(self) -> int:
        return len(self._nodes)


class _Oldest:
    """A set of job ids that answers "which is the smallest" in O(log n): a heap with lazy deletion."""

    __slots__ = ("heap", "active")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.active: set[int] = set()

    def add(self, job: int) -> None:
        self.active.add(job)
        heapq.heappush(self.heap, job)

    def discard(self, job: int) -> None:
        self.active.discard(job)

    def first(self) -> int | None:
        heap = self.heap
        while heap and heap[0] not in self.active:
            heapq.heappop(heap)
        return heap[0] if heap else None


def _judge(job: int, kind: str, description: str, state: TargetState) -> Verdict | None:
    """The verdict on one dependency given its target's state; None while it must wait."""
    target = description.partition(":")[2]
    if kind == "afterstart":
        if state.started:
            return Verdict(job, description, True)
        if state.ended:
            return _never(job, description, f"job {target} ended without starting ({state.how})")
        return None
    if not state.ended:
        return None
    if kind in ("afterany", "aftercorr"):
        return Verdict(job, description, True)
    if kind == "afterok":
        return Verdict(job, description, True) if state.ok else _never(job, description, f"job {target} {state.how}")
    if not state.started:
        return _never(job, description, f"job {target} ended without starting ({state.how})")
    return _never(job, description, f"job {target} succeeded") if state.ok else Verdict(job, description, True)


def _never(job: int, description: str, why: str) -> Verdict:
    return Verdict(job, description, False, f"{description} can never be satisfied: {why}")
