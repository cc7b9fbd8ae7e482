"""ResourceGraph: the resource model (a networkx graph, model.py) and the matcher's index compiled from it.

The model is the truth about structure: vertices cluster -> group vertices
of the configured levels (e.g. zone -> rack; topology.py) -> ("node", rank)
-> ("socket", rank, sid) -> ("memory", rank, sid), containment edges, each
node's description and health (its NodeState) and each socket's id-sets (its
SocketState).  Every join, re-description and removal changes the model
first and then indexes or unindexes the node from it; drains and health
changes set the node vertex's state and update the index in the same call.
The index, what the matcher (query.py: match.py, walk.py) reads, is one
GroupState per group vertex with the free counts of its subtree (free cores,
GPUs, memory over its usable nodes, idle and usable node counts, its node
mask and shapes) and, on the cluster root, bitmask indexes over nodes (bit
= rank): by exact free-core count ("buckets"), any free core, any free GPU,
fully idle, usable, per property.  Allocation-time counters (a node's free
counts, the groups' aggregates, the masks) live only in the index and are
updated incrementally on every alloc/free; ResourceGraph(levels, model)
compiles them afresh from a model (JGF in, tests).  The reports and JGF out
read the model.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence

from . import match as matcher, model, query, report
from .alloc import Allocation
from .carve import SingleHold
from .feasible import check_feasible
from .request import Constraint, Request
from .sockets import Hold, hold_ids
from .state import ClusterState, GpuSpec, GroupState, MemSpec, NodeState, Shape, ancestors
from .topology import Levels, Path, path_of

MAX_RANK = 1 << 20  # bit positions are ranks: bound the index masks


def _checked(rank: int) -> int:
    if not 0 <= rank < MAX_RANK:
        raise ValueError(f"rank {rank} out of range 0..{MAX_RANK - 1}")
    return rank


class ResourceGraph:
    """Resources of one MiniCluster: the model (self.graph) and the matcher's index compiled from it."""

    def __init__(self, levels: Levels = (), graph: model.Model | None = None) -> None:
        """An empty instance, or one whose index is compiled from graph (a model as model.py builds it)."""
        self.levels = tuple(levels)
        self.graph = model.new() if graph is None else graph
        self.cluster = ClusterState()
        self.groups: dict[Path, GroupState] = {(): self.cluster}
        self.nodes: dict[int, NodeState] = {}
        self.by_pos: list[NodeState | None] = []  # index = rank
        self._holds: dict[Hashable, dict[int, Hold]] = {}
        self._prop_masks: dict[tuple[str, str], int] = {}
        self._key_masks: dict[str, int] = {}
        self._constraint_cache: dict[tuple[Constraint, ...], int] = {}
        self.version = 0  # bumped on every change; lets the scheduler skip idle cycles
        self.topology_version = 0  # bumped when ranks are added/removed/change health
        for node in model.nodes(self.graph):
            node.recount()
            self._index(_checked(node.rank))

    # ----------------------------------------------------------------- ranks

    def add_rank(self, rank: int, *, hostname: str, sockets: Mapping[int, tuple[int, ...]],
                 gpus: GpuSpec = (), memory_mb: MemSpec = 0,
                 properties: Mapping[str, str] | None = None) -> None:
        """Add a node, or replace a known rank's description and bring it up.

        gpus: ids dealt evenly over the sockets, or {socket id: ids} when
        the affinity is known; memory_mb: a total split evenly over the
        sockets, or {socket id: MB}.  Allocations still held on a replaced
        rank keep holding whatever of their ids the new description still
        has.  A drain survives: it is an operator's decision, not a
        property of the node's last life.
        """
        old = self.nodes.get(_checked(rank))
        node = NodeState(rank, hostname, sockets, gpus, memory_mb, properties or {})
        if old:
            node.drain_reason = old.drain_reason
            self._unindex(old)
            model.remove_node(self.graph, rank)
        model.add_node(self.graph, path_of(self.levels, node.properties), node)
        self._index(rank)
        if old:
            self._carry_holds(node)

    def remove_rank(self, rank: int) -> None:
        """Forget a rank; what live allocations held on it is forgotten too.

        Dropping those holds matters if the rank is added again later: the
        new node must not be credited with resources it never gave out.
        """
        self._unindex(self._node(rank))
        model.remove_node(self.graph, rank)
        for holds in self._holds.values():
            holds.pop(rank, None)

    def set_down(self, rank: int) -> None:
        self._set_health(self._node(rank), up=False)

    def set_up(self, rank: int) -> None:
        self._set_health(self._node(rank), up=True)

    def drain(self, rank: int, reason: str) -> None:
        self._set_health(self._node(rank), drain_reason=reason or "drained")

    def undrain(self, rank: int) -> None:
        self._set_health(self._node(rank), drain_reason=None)

    def _node(self, rank: int) -> NodeState:
        try:
            return self.nodes[rank]
        except KeyError:
            raise KeyError(f"unknown rank {rank}") from None

    # ------------------------------------------- the index, compiled from the model

    def _group(self, path: Path) -> GroupState:
        """The index's group for the model's group vertex at path, created (with its ancestors) on first use."""
        group = self.groups.get(path)
        if group is None:
            parent = self._group(path[:-1])
            group = self.groups[path] = GroupState(self.graph.nodes[path]["kind"], path, parent)
            parent.subgroups[path] = group
        return group

    def _index(self, rank: int) -> None:
        """Index the model's node vertex of rank: its group (from its parent vertex), aggregates and masks."""
        node: NodeState = self.graph.nodes[("node", rank)]["state"]
        parent = self._group(model.path_of_node(self.graph, rank))
        node.parent = parent
        if rank >= len(self.by_pos):
            self.by_pos.extend([None] * (rank + 1 - len(self.by_pos)))
        self.nodes[rank] = self.by_pos[rank] = node
        cl = self.cluster
        while len(cl.buckets) <= node.total_cores:
            cl.buckets.append(0)
        cl.buckets[node.free_cores] |= node.bit
        shape = Shape.of(node)
        for group in ancestors(node):
            group.mask |= node.bit
            group.nodes += 1
            group.shapes[shape] += 1
        parent.forget_order()
        self._flag(node, True)
        for prop, value in node.properties.items():
            self._prop_masks[(prop, value)] = self._prop_masks.get((prop, value), 0) | node.bit
            self._key_masks[prop] = self._key_masks.get(prop, 0) | node.bit
        self._changed()

    def _unindex(self, node: NodeState) -> None:
        """Take a node out of the index (its model vertices are removed by the caller)."""
        r, cl = node.rank, self.cluster
        cl.buckets[node.free_cores] &= ~node.bit
        self._flag(node, False)
        shape = Shape.of(node)
        for group in ancestors(node):
            group.mask &= ~node.bit
            group.nodes -= 1
            group.shapes[shape] -= 1
            if not group.shapes[shape]:
                del group.shapes[shape]
        parent = node.parent
        assert parent is not None, "an indexed node has a parent"
        parent.forget_order()
        while parent is not cl and not parent.nodes:  # drop groups left empty, as the model does
            above = parent.parent
            assert above is not None, "only the cluster root has no parent"
            del self.groups[parent.path]
            del above.subgroups[parent.path]
            parent = above
        for key, value in node.properties.items():
            self._prop_masks[(key, value)] &= ~node.bit
            self._key_masks[key] &= ~node.bit
        del self.nodes[r]
        self.by_pos[r] = None
        self._changed()

    def _changed(self) -> None:
        self._constraint_cache.clear()
        self.version += 1
        self.topology_version += 1

    def _flag(self, node: NodeState, present: bool) -> None:
        """Add (present) or remove the node from the yes/no indexes and aggregates."""
        cl, bit, sign = self.cluster, node.bit, 1 if present else -1
        keep = bit if present else 0
        idle = node.is_idle()
        for name, member in (("avail", node.free_cores > 0), ("gpu_avail", node.free_gpus > 0),
                             ("idle", idle), ("usable", node.usable)):
            if member:
                setattr(cl, name, (getattr(cl, name) & ~bit) | keep)
        if node.usable:
            for group in ancestors(node):
                group.free_cores += sign * node.free_cores
                group.free_gpus += sign * node.free_gpus
                group.free_mem += sign * node.free_mem
                group.usable_nodes += sign
                if idle:
                    group.idle_nodes += sign

    def _set_health(self, node: NodeState, **change: object) -> None:
        self._flag(node, False)
        for name, value in change.items():
            setattr(node, name, value)
        self._flag(node, True)
        self.version += 1
        self.topology_version += 1

    def _carry_holds(self, node: NodeState) -> None:
        """Re-take, on a re-described node, what live allocations held on it."""
        for hold in self._holds.values():
            if node.rank in hold:
                new = node.hold_from_ids(*hold_ids(hold[node.rank]))
                hold[node.rank] = new
                self._account(node, new, True)

    # ------------------------------------------------------------ accounting

    def _account(self, node: NodeState, hold: Hold, taking: bool) -> None:
        """Apply a take/give to a node (NodeState.take/give), then its ancestors' aggregates and the masks.

        This runs once per allocation start and once per release, the
        scheduler's hottest bookkeeping, so the index update is written out flat.
        """
        fc, fg, fm = node.free_cores, node.free_gpus, node.free_mem
        tc, tg, tm = node.total_cores, node.total_gpus, node.total_mem
        idle = fc == tc and fg == tg and fm == tm
        if taking:
            node.take(hold)
        else:
            node.give(hold)
        nfc, nfg, nfm = node.free_cores, node.free_gpus, node.free_mem
        cl, bit = self.cluster, node.bit
        if nfc != fc:
            buckets = cl.buckets
            buckets[fc] ^= bit
            buckets[nfc] |= bit
            if not fc or not nfc:
                cl.avail ^= bit
        if nfg != fg and (not fg or not nfg):
            cl.gpu_avail ^= bit
        now_idle = nfc == tc and nfg == tg and nfm == tm
        di = 0  # change of the idle node count
        if idle != now_idle:
            cl.idle ^= bit
            di = 1 if now_idle else -1
        if node.up and node.drain_reason is None:
            dc, dg, dm = nfc - fc, nfg - fg, nfm - fm
            group = node.parent
            while group is not None:
                group.free_cores += dc
                if dg:
                    group.free_gpus += dg
                if dm:
                    group.free_mem += dm
                if di:
                    group.idle_nodes += di
                group = group.parent
        self.version += 1

    def _wanted(self, allocation: Allocation, lenient: bool = False) -> dict[int, Hold]:
        """What taking the allocation amounts to per rank, from the free state now.

        lenient (reservations): skip ranks that are gone or whose slots no
        longer fit the node's description instead of raising ValueError.
        """
        holds: dict[int, Hold] = {}
        hint = allocation.hint or {}
        held = allocation.held or {}
        for rank in allocation.all_ranks():
            node = self.nodes.get(rank)
            if node is None:
                if lenient:
                    continue
                raise ValueError(f"allocation names unknown rank {rank}")
            hinted = hint.get(rank)
            sids = held.get(rank)
            if (allocation.exclusive and rank in allocation) or (rank in held and sids is None):
                holds[rank] = node.free_hold()
            elif hinted and hinted[0] is node:
                holds[rank] = hinted[1]
            else:
                try:
                    hold = node.hold_for(allocation[rank].slots) if rank in allocation else (
                        node.zero, node.zero, node.zero)
                except ValueError:
                    if lenient:
                        continue
                    raise
                holds[rank] = _with_sockets(node, hold, sids) if sids else hold
        return holds

    def alloc(self, key: Hashable, allocation: Allocation) -> None:
        """Take the allocation's resources under key; ValueError if any is not free."""
        if key in self._holds:
            raise ValueError(f"allocation key {key!r} already holds resources")
        # held is None in the common case, written out: slots or whole nodes only
        holds = (self._slot_holds(key, allocation) if allocation.held is None
                 else self._checked_holds(key, allocation))
        for rank, hold in holds.items():
            self._account(self.nodes[rank], hold, True)
        self._holds[key] = holds
        allocation.hint = None  # spent: do not keep node references alive via the broker

    def _slot_holds(self, key: Hashable, allocation: Allocation) -> dict[int, Hold]:
        holds: dict[int, Hold] = {}
        hint = allocation.hint or {}
        exclusive = allocation.exclusive
        nodes = self.nodes
        for rank, ralloc in allocation.items():
            node = nodes.get(rank)
            if node is None:
                raise ValueError(f"allocation names unknown rank {rank}")
            if exclusive:
                if not node.is_idle():
                    raise ValueError(f"rank {rank} is not idle, cannot allocate it exclusively")
                holds[rank] = node.free_hold()
                continue
            hinted = hint.get(rank)
            hold = hinted[1] if hinted and hinted[0] is node else node.hold_for(ralloc.slots)
            if not node.can_take(hold):
                raise ValueError(f"resources on rank {rank} are not free for {key!r}")
            holds[rank] = hold
        return holds

    def _checked_holds(self, key: Hashable, allocation: Allocation) -> dict[int, Hold]:
        holds = self._wanted(allocation)
        held = allocation.held or {}
        for rank, hold in holds.items():
            node = self.nodes[rank]
            whole = (allocation.exclusive and rank in allocation) or (rank in held and held[rank] is None)
            if whole and not node.is_idle():
                raise ValueError(f"rank {rank} is not idle, cannot allocate it exclusively")
            sockets = held.get(rank)
            if sockets and not all(s.is_idle() for s in node.sockets if s.index in sockets):
                raise ValueError(f"a socket of rank {rank} is not idle, cannot allocate it"
                                 " exclusively")
            if not node.can_take(hold):
                raise ValueError(f"resources on rank {rank} are not free for {key!r}")
        return holds

    def alloc_array(self, keys: Sequence[Hashable], request: Request,
                    policy: str = "first-fit") -> list[Allocation]:
        """Allocate one-slot tasks under keys, in order, as many as fit now.

        The array fast path: equivalent to `match(request, policy)` +
        `alloc(key, ...)` for each key in turn until a match fails, but in
        one pass over the candidate nodes, carving each node's share at
        once and updating its accounting and indexes once.  Returns the
        allocations of keys[:n] for the n that fit.  Flat single-slot,
        CPU-only, non-exclusive requests only (ValueError otherwise).  The
        returned Allocations are interned per node and ids: immutable,
        shared with earlier tasks that had the same ids.
        """
        if not request.batchable:
            raise ValueError("alloc_array takes flat one-slot, CPU-only, non-exclusive requests")
        held = self._holds
        if not held.keys().isdisjoint(keys):
            raise ValueError("an allocation key already holds resources")
        cps, mps = request.cores_per_slot, request.mem_per_slot
        out: list[Allocation] = []
        i = 0
        for node, n in matcher.pick_elements(self, request, policy, len(keys)):
            allocs, holds, total = node.carve_singles(n, cps, mps)
            self._account(node, total, True)
            held.update(zip(keys[i:i + n], holds, strict=True))
            i += n
            out += allocs
        return out

    def free(self, key: Hashable) -> None:
        """Give back everything key holds (KeyError if it holds nothing)."""
        holds = self._holds.pop(key)
        nodes = self.nodes
        if type(holds) is SingleHold and holds.sock is not None:
            # An array element's core(s) and memory on one socket: the
            # general give of _account, specialised (no GPUs, known counts).
            node = nodes.get(holds.node.rank)
            if node is not None and node is holds.node:
                sock = holds.sock
                sock.cores_free |= holds.mask
                fc = node.free_cores
                nfc = node.free_cores = fc + holds.ncores
                mem = holds.mem
                if mem:
                    sock.mem_free += mem
                    node.free_mem += mem
                cl, bit = self.cluster, node.bit
                buckets = cl.buckets
                buckets[fc] ^= bit
                buckets[nfc] |= bit
                if not fc:
                    cl.avail |= bit
                idle = (nfc == node.total_cores and node.free_mem == node.total_mem
                        and node.free_gpus == node.total_gpus)
                if idle:
                    cl.idle |= bit
                if node.up and node.drain_reason is None:
                    dc = nfc - fc
                    group = node.parent
                    while group is not None:
                        group.free_cores += dc
                        group.free_mem += mem
                        if idle:
                            group.idle_nodes += 1
                        group = group.parent
                self.version += 1
                return
        for rank, hold in holds.items():
            known = nodes.get(rank)
            if known is not None:
                self._account(known, hold, False)

    def free_many(self, keys: Iterable[Hashable]) -> None:
        """free() each key, accounting once per node instead of once per key.

        All keys are checked first (KeyError, nothing freed, if one holds
        nothing or appears twice).
        """
        keys = list(keys)
        held = self._holds
        if len(set(keys)) != len(keys) or not all(k in held for k in keys):
            missing = next((k for k in keys if k not in held), None)
            raise KeyError(missing if missing is not None else "duplicate key")
        merged: dict[int, list[list[int]]] = {}
        for key in keys:
            for rank, hold in held.pop(key).items():
                acc = merged.get(rank)
                if acc is None:
                    merged[rank] = [list(part) for part in hold]
                    continue
                for j, c in enumerate(hold[0]):
                    if c:
                        acc[0][j] |= c
                if any(hold[1]):
                    for j, g in enumerate(hold[1]):
                        acc[1][j] |= g
                if any(hold[2]):
                    for j, m in enumerate(hold[2]):
                        acc[2][j] += m
        for rank, (cores, gpus, mems) in merged.items():
            node = self.nodes.get(rank)
            if node is not None:
                self._account(node, (tuple(cores), tuple(gpus), tuple(mems)), False)

    def hold_free_part(self, key: Hashable, allocation: Allocation) -> None:
        """Hold whatever of allocation's resources is free now (backfill reservations)."""
        self.hold_free_of(key, self._wanted(allocation, lenient=True))

    def hold_free_of(self, key: Hashable, wanted: Mapping[int, Hold]) -> None:
        """Hold whatever of these per-rank holds is free now (e.g. what detach() returned)."""
        holds: dict[int, Hold] = {}
        for rank, want in wanted.items():
            node = self.nodes.get(rank)
            if node is None:
                continue
            cores = tuple(w & s.cores_free for w, s in zip(want[0], node.sockets, strict=True))
            gpus = tuple(w & s.gpus_free for w, s in zip(want[1], node.sockets, strict=True))
            mems = tuple(min(w, s.mem_free) for w, s in zip(want[2], node.sockets, strict=True))
            if any(cores) or any(gpus) or any(mems):  # busy ranks: nothing to hold there
                holds[rank] = (cores, gpus, mems)
                self._account(node, holds[rank], True)
        self._holds[key] = holds

    def holds(self, key: Hashable) -> bool:
        return key in self._holds

    def held_cores(self, key: Hashable) -> int:
        """Number of cores key holds (0 if it holds nothing)."""
        return sum(m.bit_count() for hold in self._holds.get(key, {}).values() for m in hold[0])

    def detach(self, key: Hashable) -> dict[int, Hold]:
        """free(key) but return what it held, for attach() to put back exactly.

        The backfill planner uses this pair to simulate running jobs ending.
        """
        holds = self._holds[key]
        self.free(key)
        return holds

    def rekey(self, old: Hashable, new: Hashable) -> None:
        """What `old` holds is held by `new` from now on (nothing is freed or taken): the dispatch window passes
        an element's core on to the next element of its chain (protocol.md §2.10)."""
        if new in self._holds:
            raise ValueError(f"{new!r} already holds resources")
        self._holds[new] = self._holds.pop(old)

    def attach(self, key: Hashable, holds: dict[int, Hold]) -> None:
        """Re-take what detach() returned; the resources must still be free."""
        for rank, hold in holds.items():
            node = self.nodes.get(rank)
            if node is not None:
                self._account(node, hold, True)
        self._holds[key] = holds

    # -------------------------------------------------------------- matching

    def constraint_mask(self, constraints: tuple[Constraint, ...]) -> int:
        """Mask of nodes satisfying every constraint (cached until ranks change)."""
        mask = self._constraint_cache.get(constraints)
        if mask is None:
            mask = (1 << len(self.by_pos)) - 1
            for key, allowed in constraints:
                if allowed:
                    any_of = 0
                    for value in allowed:
                        any_of |= self._prop_masks.get((key, value), 0)
                    mask &= any_of
                else:
                    mask &= self._key_masks.get(key, 0)
            self._constraint_cache[constraints] = mask
        return mask

    # match(request, policy="first-fit") -> Allocation | None; bound directly,
    # without a wrapper call, because it is the hottest entry point.
    match = query.match
    fits = query.fits  # fits(request, policy="first-fit") -> bool, no ids carved

    def check_feasible(self, request: Request) -> None:
        """Raise InfeasibleRequest if request could never fit, even on an empty instance."""
        check_feasible(self, request)

    # ------------------------------------------------- reports: read from the model

    def iter_nodes(self) -> Iterator[NodeState]:
        """Node vertex states in rank order (from the index)."""
        for rank in sorted(self.nodes):
            yield self.nodes[rank]

    def summary(self) -> list[dict[str, object]]:
        """Per-rank view for `mc resources` (plain, JSON-safe values; report.py)."""
        return report.summary(self.graph)

    def cores_busy(self) -> dict[str, list[tuple[object, ...]]]:
        """Cores and cores held per rank and per topology group, for /metrics (report.py)."""
        return report.cores_busy(self.graph)

    def tree(self) -> dict[str, object]:
        """The containment hierarchy with free/used/total per vertex (report.py)."""
        return report.tree(self.graph)

    def held_ranks(self, key: Hashable) -> list[int]:
        """Ranks key holds anything on (with or without tasks), ascending."""
        return sorted(self._holds.get(key, ()))

    def placement(self, ranks: Iterable[int]) -> list[dict[str, str]]:
        """Ranks grouped by the topology vertex they hang from (`mc jobs -o alloc`; report.py)."""
        return report.placement(self.graph, ranks)

    def snapshot(self) -> tuple[object, ...]:
        """Hashable copy of all accounting state (tests compare before/after free)."""
        cl = self.cluster
        nodes = tuple(
            (n.rank, n.up, n.drain_reason, n.free_cores, n.free_gpus, n.free_mem,
             tuple((s.cores_free, s.gpus_free, s.mem_free) for s in n.sockets))
            for n in self.iter_nodes())
        groups = tuple(sorted(
            (g.path, g.free_cores, g.free_gpus, g.free_mem, g.idle_nodes, g.usable_nodes,
             g.nodes, g.mask) for g in self.groups.values()))
        return (nodes, groups, tuple(cl.buckets), cl.avail, cl.gpu_avail, cl.idle, cl.usable)


def _with_sockets(node: NodeState, hold: Hold, sids: tuple[int, ...]) -> Hold:
    """hold, with the sockets whose ids are in sids taken whole (what is free of them)."""
    whole = tuple(s.index in sids for s in node.sockets)
    free = node.free_hold()
    return tuple(tuple(f if w else h for w, f, h in zip(whole, free_part, part, strict=True))
                 for free_part, part in zip(free, hold, strict=True))  # type: ignore[return-value]
