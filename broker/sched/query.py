"""The matcher's two queries, which ResourceGraph binds as its match and fits: `match` (an Allocation from what is
free now, or None) and `fits` (whether match would succeed, without carving ids). A request with topology levels
or socket-bound slots, or the locality-first policy, goes through the walk of the group vertices (walk.py); any
other is matched flat from the cluster vertex with match.py's bitmask paths. Here, apart from both, so that the
walk, which picks nodes with match.py, and match.py do not import each other.
"""

from __future__ import annotations

from . import walk
from .alloc import Allocation
from .match import allocation_of, candidates, choose, match_one
from .policies import check_policy
from .request import Request
from .view import GraphView


def match(graph: GraphView, request: Request, policy: str = "first-fit") -> Allocation | None:
    """Find resources for request in what is free now under policy, or None.

    A pure query: nothing is taken until ResourceGraph.alloc().
    """
    if request.tree or policy == "locality-first":
        return walk.match_tree(graph, request, check_policy(policy))
    check_policy(policy)
    mask = candidates(graph, request)
    if not mask:
        return None
    if request.nslots == 1:
        return match_one(graph, mask, request, policy)
    picks = choose(graph, mask, request, policy)
    if picks is None:
        return None
    return allocation_of(picks, request)


def fits(graph: GraphView, request: Request, policy: str = "first-fit") -> bool:
    """Whether match() would succeed, without carving ids (cheaper for wide jobs)."""
    if request.tree or policy == "locality-first":
        return walk.fits_tree(graph, request, check_policy(policy))
    check_policy(policy)
    mask = candidates(graph, request)
    return bool(mask) and choose(graph, mask, request, policy) is not None
