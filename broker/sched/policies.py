"""Node-selection policies: the order in which the matcher visits candidates.

A policy only orders node positions drawn from a candidate bitmask; which
nodes are candidates and how many slots each takes is match.py's job.

  first-fit       rank order: the first nodes that fit
  pack            fewest free cores first: fill used nodes before opening new ones
  spread          most free cores first (and, in match.py, one slot per node first)
  low-id          ascending rank (node bits are ranks: the same order as first-fit)
  high-id         descending rank
  locality-first  keep a job under one rack (or zone) when it fits, best fit
                  (walk.py); first-fit among the nodes there
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from minicluster.model.jobterms import POLICIES as POLICIES  # one list for the matcher, config and CLI

from .idset import iter_ascending, iter_descending
from .view import GraphView

DEFAULT_POLICY = "first-fit"


def check_policy(name: str) -> str:
    """Return name if it is a known policy, else ValueError listing the valid ones."""
    if name not in POLICIES:
        raise ValueError(
            f"unknown scheduling policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return name


def candidate_order(graph: GraphView, mask: int, policy: str, min_free: int) -> Iterator[int]:
    """Yield the positions set in mask in the policy's preference order.

    min_free (free cores a node needs) lets pack/spread skip whole buckets.
    """
    if policy in ("first-fit", "low-id", "locality-first"):
        return iter_ascending(mask)
    if policy == "high-id":
        return iter_descending(mask)
    buckets = graph.cluster.buckets
    counts: Iterable[int] = range(max(min_free, 1), len(buckets))
    if policy == "spread":
        counts = reversed(range(max(min_free, 1), len(buckets)))
    elif policy != "pack":
        check_policy(policy)
    return _bucket_walk(buckets, counts, mask)


def _bucket_walk(buckets: list[int], counts: Iterable[int], mask: int) -> Iterator[int]:
    for count in counts:
        hits = buckets[count] & mask
        if hits:
            yield from iter_ascending(hits)
