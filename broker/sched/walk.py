"""The depth-first walk of the group vertices for tree requests.

A request with topology levels, e.g. zone[1]>rack[2]>node[4]>..., is matched
top down: at each requested level the walk visits the descendant group
vertices of that level in the policy's order, skips every vertex whose
aggregates (free cores, GPUs, memory, usable and idle nodes; all nodes idle
for an exclusive level) show that its subtree cannot hold the demand below
it, and recurses into the others until `count` of them succeed.  Below the
last requested level the node picker of match.py runs over the group's
nodes (its node mask ANDed with the cluster's candidate mask).  Subtrees are
disjoint, so what one chosen vertex takes never affects its siblings.

Group order per policy: first-fit and low-id by lowest rank, high-id by
highest rank descending, pack (and locality-first) fewest free cores first,
spread most free cores first; ties by lowest rank.  locality-first on a
request without levels tries to fit it under one vertex of the lowest level
(best fit), then the next level up, and only then anywhere.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from . import match as matcher
from .alloc import Allocation
from .idset import iter_ascending
from .request import Request
from .state import GroupState
from .view import GraphView

NODE_POLICY = {"locality-first": "first-fit"}


class Need(NamedTuple):
    """What one vertex of a level must hold for the levels below it."""

    cores: int
    gpus: int
    mem: int
    nodes: int   # at least this many usable nodes
    idle: int    # exclusive nodes: at least this many idle
    whole: bool  # exclusive level: every node idle


def match_tree(graph: GraphView, req: Request, policy: str) -> Allocation | None:
    found = search(graph, req, policy)
    if found is None:
        return None
    req, picks, whole_groups = found
    held: dict[int, tuple[int, ...] | None] = {}
    picked = {node.rank for node, _ in picks}
    for group in whole_groups:
        for rank in iter_ascending(group.mask):
            if rank not in picked:
                held[rank] = None
    return matcher.allocation_of(picks, req, held or None)


def fits_tree(graph: GraphView, req: Request, policy: str) -> bool:
    return search(graph, req, policy) is not None


def search(graph: GraphView, req: Request,
           policy: str) -> tuple[Request, matcher.Picks, list[GroupState]] | None:
    """(the request as matched, node picks, groups held whole) or None."""
    if policy == "locality-first" and not req.groups and req.nslots > 1:
        for name, _prop in reversed(graph.levels):
            local = replace(req, groups=((name, 1, False),))
            found = _Walk(graph, local, policy).run()
            if found is not None:
                return (local, *found)
    found = _Walk(graph, req, policy).run()
    return None if found is None else (req, *found)


class _Walk:
    def __init__(self, graph: GraphView, req: Request, policy: str) -> None:
        self.graph, self.req, self.policy = graph, req, policy
        self.node_policy = NODE_POLICY.get(policy, policy)
        self.mask = 0
        self.whole: list[GroupState] = []
        self.needs = self._needs()

    def run(self) -> tuple[matcher.Picks, list[GroupState]] | None:
        self.mask = matcher.candidates(self.graph, self.req)
        if not self.mask:
            return None
        picks = self._descend(self.graph.cluster, 0)
        return None if picks is None else (picks, self.whole)

    def _needs(self) -> list[Need]:
        """Need per requested level (index i: one vertex of groups[i])."""
        req = self.req
        per_slot = (req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot)
        slots, nodes = req.nslots, max(req.nnodes, len(req.node_counts() or ()), 1)
        needs: list[Need] = []
        for _level, count, exclusive in reversed(req.groups):
            idle = nodes if req.exclusive else 0
            cores, gpus, mem = (slots * x for x in per_slot)
            needs.append(Need(cores, gpus, mem, nodes, idle, exclusive))
            slots, nodes = slots * count, nodes * count
        needs.reverse()
        return needs

    def _descend(self, group: GroupState, i: int) -> matcher.Picks | None:
        req = self.req
        if i == len(req.groups):
            mask = self.mask & group.mask
            if not mask:
                return None
            return matcher.choose(self.graph, mask, req, self.node_policy)
        level, count, exclusive = req.groups[i]
        cores, gpus, mem, nodes, idle, whole = self.needs[i]
        chosen: matcher.Picks = []
        found = 0
        whole_before = len(self.whole)
        for child in self._order(group.below(level)):
            # Prune: can this subtree hold the demand at all, by its aggregates alone?
            if (child.free_cores < cores or child.free_gpus < gpus or child.free_mem < mem
                    or child.usable_nodes < nodes or child.idle_nodes < idle
                    or (whole and child.idle_nodes != child.nodes)):
                continue
            picks = self._descend(child, i + 1)
            if picks is None:
                continue
            chosen += picks
            if exclusive:
                self.whole.append(child)
            found += 1
            if found == count:
                return chosen
        del self.whole[whole_before:]
        return None

    def _order(self, groups: list[GroupState]) -> list[GroupState]:
        policy = self.policy
        if policy in ("first-fit", "low-id"):
            return groups
        if policy == "high-id":
            return sorted(groups, key=lambda g: g.mask.bit_length(), reverse=True)
        if policy == "spread":
            return sorted(groups, key=lambda g: -g.free_cores)
        return sorted(groups, key=lambda g: g.free_cores)  # pack, locality-first


def rebuild(graph: GraphView, req: Request,
            tasks: list[tuple[int, tuple[int, ...], tuple[int, ...]]]) -> Allocation:
    """The Allocation of a running job from its tasks' (rank, cores, GPUs), in task order.

    After a broker restart only the tasks' bindings are known; what the
    request held beyond them follows from the topology: the whole vertices
    of its exclusive levels (those holding its ranks) and, for exclusive
    sockets, the sockets of its slots.  Slot memory is the request's.
    """
    from .alloc import RankAlloc, Slot
    from .state import group_of

    ranks: dict[int, list[Slot]] = {}
    for rank, cores, gpus in tasks:
        ranks.setdefault(rank, []).append(Slot(tuple(cores), tuple(gpus), req.mem_per_slot))
    held: dict[int, tuple[int, ...] | None] = {}
    for level, _count, exclusive in req.groups:
        if not exclusive:
            continue
        for rank in ranks:
            group = group_of(graph.nodes[rank], level) if rank in graph.nodes else None
            for other in iter_ascending(group.mask if group else 0):
                if other not in ranks:
                    held[other] = None
    if req.socket_exclusive:
        for rank, slots in ranks.items():
            node = graph.nodes.get(rank)
            if node is not None:
                held[rank] = tuple(sorted({node.sockets[node.core_socket[c]].index
                                           for s in slots for c in s.cores
                                           if c in node.core_socket}))
    return Allocation({r: RankAlloc(tuple(s)) for r, s in ranks.items()}, req.exclusive,
                      held=held or None)
