"""Choosing preemption victims (docs/scheduling.md, "Preemption"): the running allocations whose loss costs the
least work and that, once gone, let the waiting job fit.

A victim is always a whole allocation: a plain job's allocation is its whole gang, so a gang is preempted entirely
or not at all, never in part; an array element is its own allocation.  Lost work is the elapsed core-seconds of a
victim.  The search works on the real graph like backfill's reservation search: candidates are detached in order
of lost work until the job fits (exponential + binary search over the prefix, fitting is monotone in freed
resources), then each chosen victim is put back, most expensive first, if the job still fits without it.
Everything is re-attached before returning.  Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .backfill import DetachedPrefix, K
from .graph import ResourceGraph
from .request import Request
from .sockets import Hold


Key = tuple[int, int]  # (job, element): a running allocation


def lost_work(running: Mapping[Key, float], active: Mapping[int, list[Any]], queues: set[str],
              dying: set[Key], time_limit: Callable[[Any], float], now: float) -> list[tuple[Key, float]]:
    """(key, elapsed core-seconds) of the running allocations of `queues` not already being preempted.

    `running` maps (job, element) to its planned end (start + time limit); `active` job id to [SchedJob, n].
    """
    out: list[tuple[Key, float]] = []
    for key, end in running.items():
        entry = active.get(key[0])
        if entry is None or entry[0].queue not in queues or key in dying:
            continue
        victim = entry[0]
        out.append((key, victim.cores * max(0.0, now - (end - time_limit(victim)))))
    return out


def choose_victims(graph: ResourceGraph, request: Request, policy: str,
                   candidates: list[tuple[K, float]]) -> list[K] | None:
    """Keys of the allocations to preempt so that `request` fits, least lost work first; None if none do.

    `candidates` are (allocation key, lost work) of the allocations that may be preempted.
    """
    order = [key for key, _ in sorted(candidates, key=lambda c: c[1])]
    with DetachedPrefix(graph, order) as prefix:
        if prefix.shortest_fitting(request, policy) is None:
            return None
        return _pruned(graph, request, policy, prefix.detached, dict(candidates))


def _pruned(graph: ResourceGraph, request: Request, policy: str,
            detached: list[tuple[K, dict[int, Hold]]], lost: dict[K, float]) -> list[K]:
    """The detached victims the request really needs: each one is tried back, most lost work first."""
    needed: list[K] = []
    for key, holds in sorted(detached, key=lambda d: -lost[d[0]]):
        graph.attach(key, holds)
        if graph.fits(request, policy):
            continue  # not needed: it stays attached here, and is re-detached below for the caller's cleanup
        graph.detach(key)
        needed.append(key)
    # Restore the state the caller's cleanup expects: every key in `detached` detached.
    for key, _holds in detached:
        if key not in needed:
            graph.detach(key)
    return sorted(needed, key=lambda k: lost[k])
