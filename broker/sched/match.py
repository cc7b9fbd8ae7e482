"""The matcher: turn a Request into an Allocation from what is free now.

Three steps: (1) prune with the cluster vertex's aggregates and index masks
to a candidate bitmask of nodes that could host at least one slot; (2) walk
candidates in policy order, asking each node vertex how many slots (units)
it can hold, until the request is covered (gang: all or nothing); (3) carve
real core/GPU ids on the chosen nodes' sockets.  Nothing is taken: alloc()
does.  Requests with topology levels or socket-bound slots first descend
the group vertices (walk.py; query.py sends them there) and run step 2
inside the groups they choose;
flat requests start at the cluster vertex, where the bitmask fast paths
below (one slot, array elements, gangs) do the same walk in C-level int
operations.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from . import units as socket_units
from .alloc import Allocation, RankAlloc
from .policies import candidate_order, check_policy
from .request import Request
from .sockets import Hold
from .state import NodeState
from .view import GraphView

Picks = list[tuple[NodeState, int]]  # (node, units); a unit is unit_slots slots


def allocation_of(picks: Picks, request: Request,
                  held: dict[int, tuple[int, ...] | None] | None = None) -> Allocation:
    """Carve ids on the picked nodes (units per node) into an Allocation."""
    cps, gps, mps = request.cores_per_slot, request.gpus_per_slot, request.mem_per_slot
    ranks: dict[int, RankAlloc] = {}
    hint: dict[int, tuple[NodeState, Hold]] = {}
    for node, n in picks:
        if request.sockets:
            slots, hold, whole = socket_units.carve(node, request, n)
            if whole:
                held = held if held is not None else {}
                held[node.rank] = whole
        else:
            slots, hold = node.carve(n, cps, gps, mps)
        if request.exclusive:
            hold = node.free_hold()
        ranks[node.rank] = RankAlloc(slots)
        hint[node.rank] = (node, hold)
    return Allocation(ranks, request.exclusive, hint, held)


def capacity_of(req: Request) -> Callable[[NodeState], int]:
    """node -> how many units of req it holds now."""
    if req.sockets:
        return lambda node: socket_units.node_capacity(node, req)
    cps, gps, mps = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    return lambda node: node.capacity(cps, gps, mps)


def choose(graph: GraphView, mask: int, req: Request, policy: str) -> Picks | None:
    """Which nodes of mask, and how many units on each, in policy order."""
    counts = req.node_counts()
    if counts and mask.bit_count() < len(counts):  # one count per candidate node at most
        return None
    min_free = req.cores_per_slot * (counts[-1] if counts else 1)
    by_pos = _present(graph)
    nodes = (by_pos[p] for p in candidate_order(graph, mask, policy, min_free))
    cap = capacity_of(req)
    sized = ((n, cap(n)) for n in nodes)
    unit = req.unit_slots
    if counts:
        return _pick_gang(sized, tuple(c // unit for c in counts))
    if policy == "spread":
        return _pick_spread(sized, req.nslots // unit)
    return _pick_greedy(sized, req.nslots // unit)


def match_one(graph: GraphView, mask: int, req: Request, policy: str) -> Allocation | None:
    """One slot: the first node in policy order that can hold it.

    This is the hot path (single-task jobs, array elements); under first-fit
    the lowest candidate bit (the lowest rank) is tried before any iterator
    is built.
    """
    cps, gps, mps = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    by_pos = _present(graph)
    if policy == "first-fit":
        node = by_pos[(mask & -mask).bit_length() - 1]
        if node.capacity(cps, gps, mps):
            return _one_slot(node, req)
    for pos in candidate_order(graph, mask, policy, cps):
        node = by_pos[pos]
        if node.capacity(cps, gps, mps):
            return _one_slot(node, req)
    return None


def _one_slot(node: NodeState, req: Request) -> Allocation:
    slots, hold = node.carve(1, req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot)
    if req.exclusive:
        hold = node.free_hold()
    return Allocation({node.rank: RankAlloc(slots)}, req.exclusive, {node.rank: (node, hold)})


def pick_elements(graph: GraphView, req: Request, policy: str, count: int) -> Picks:
    """Nodes and per-node counts for up to `count` one-slot tasks (array elements).

    The same nodes, with the same counts, as `count` successive one-slot
    match + alloc calls would use (stopping at the first that fails), in
    one pass over the candidates instead of one match per task.  Under
    first-fit, pack, low-id and high-id a one-slot match keeps choosing the
    same node until it is full, so each node is visited once and takes as
    many as it can hold.  Under spread every task goes to the node with the
    most free cores (lowest rank on ties): simulated with a heap over the
    first `count` candidates, which are the only ones it can reach.
    """
    check_policy(policy)
    mask = candidates(graph, req)
    if not mask or count <= 0:
        return []
    cps, gps, mps = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    by_pos = _present(graph)
    picks: Picks = []
    if policy != "spread":
        for pos in candidate_order(graph, mask, policy, cps):
            node = by_pos[pos]
            cap = node.capacity(cps, gps, mps)
            if cap:
                take = cap if cap < count else count
                picks.append((node, take))
                count -= take
                if not count:
                    break
        return picks
    heap: list[tuple[int, int, int]] = []
    for pos in candidate_order(graph, mask, policy, cps):
        node = by_pos[pos]
        cap = node.capacity(cps, gps, mps)
        if cap:
            heap.append((-node.free_cores, pos, cap))
            if len(heap) == count:
                break
    heapq.heapify(heap)
    taken: dict[int, int] = {}
    while count and heap:
        neg_free, pos, cap = heap[0]
        taken[pos] = taken.get(pos, 0) + 1
        count -= 1
        if cap > 1:
            heapq.heapreplace(heap, (neg_free + cps, pos, cap - 1))
        else:
            heapq.heappop(heap)
    return [(by_pos[pos], n) for pos, n in taken.items()]


def _present(graph: GraphView) -> list[NodeState]:
    """graph.by_pos as the matcher reads it: every bit of a candidate mask is a present node, never a hole."""
    return cast("list[NodeState]", graph.by_pos)


def candidates(graph: GraphView, req: Request) -> int:
    """Mask of usable nodes that pass every cheap test; 0 when nothing can fit."""
    cl = graph.cluster
    n, gps, mps = req.total_slots if req.groups else req.nslots, req.gpus_per_slot, req.mem_per_slot
    if not req.exclusive and (cl.free_cores < n * req.cores_per_slot
                              or cl.free_gpus < n * gps or cl.free_mem < n * mps):
        return 0
    mask = cl.usable & cl.avail
    if req.exclusive:
        mask &= cl.idle
    if gps:
        mask &= cl.gpu_avail
    if req.constraints and mask:
        mask &= graph.constraint_mask(req.constraints)
    if req.cores_per_slot > 1 and mask and not req.exclusive:
        counts = req.node_counts()
        least = req.cores_per_slot * (counts[-1] if counts else req.unit_slots)
        mask &= _with_free_cores(cl.buckets, least)
    return mask


def _with_free_cores(buckets: list[int], least: int) -> int:
    """Mask of nodes with at least `least` free cores (the cluster's max-free prune)."""
    mask = 0
    for bucket in buckets[least:]:
        mask |= bucket
    return mask


def _pick_greedy(sized: Iterable[tuple[NodeState, int]], nslots: int) -> Picks | None:
    """Take as many slots as fit from each node in order."""
    picks: Picks = []
    for node, cap in sized:
        if cap:
            take = min(cap, nslots)
            picks.append((node, take))
            nslots -= take
            if not nslots:
                return picks
    return None


def _pick_spread(sized: Iterator[tuple[NodeState, int]], nslots: int) -> Picks | None:
    """One slot per node first, then round-robin over the same nodes."""
    nodes: list[NodeState] = []
    caps: list[int] = []
    for node, cap in sized:
        if cap:
            nodes.append(node)
            caps.append(cap)
            if len(caps) == nslots:
                break
    if sum(caps) < nslots:
        return None
    taken = [0] * len(caps)
    while nslots:
        for i, cap in enumerate(caps):
            if nslots and taken[i] < cap:
                taken[i] += 1
                nslots -= 1
    return list(zip(nodes, taken, strict=True))


def _pick_gang(sized: Iterable[tuple[NodeState, int]], counts: tuple[int, ...]) -> Picks | None:
    """Exactly len(counts) nodes; counts are largest-first and differ by at most 1.

    Any node that can take the larger count can take the smaller, so giving
    large counts to the first nodes that can hold them is never worse.
    """
    big, small = counts[0], counts[-1]
    nbig = counts.count(big) if big != small else len(counts)
    nsmall = len(counts) - nbig
    picks: Picks = []
    for node, cap in sized:
        if cap >= big and nbig:
            picks.append((node, big))
            nbig -= 1
        elif cap >= small and nsmall:
            picks.append((node, small))
            nsmall -= 1
        if not nbig and not nsmall:
            return picks
    return None
