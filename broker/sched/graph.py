"""ResourceGraph: the networkx containment model plus its pruning indexes.

Vertices: "cluster" -> ("node", rank) -> ("socket", rank, sid) and
("node", rank) -> ("memory", rank).  Cores and GPUs are id-sets on their
socket vertex (see state.py).  Every vertex carries the free counts of its
subtree: sockets their free id-sets, nodes free cores/GPUs/memory, and the
cluster vertex (ClusterState) the usable totals plus bitmask indexes over
nodes: ranks by exact free-core count ("buckets"), ranks with any free core,
with any free GPU, fully idle, usable, and per property.  A match ANDs a few
of these masks and only then visits node vertices, so a one-core task is
found without walking the graph and a full cluster is rejected in O(1).

Bit positions are node positions (the order ranks were first added); the
first-fit policy visits nodes in rank order, which is bit order as long as
ranks were added in rank order (`positions_follow_ranks`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence

import networkx as nx

from minicluster.model.idset import IdSet

from . import idset, match as matcher
from .alloc import Allocation
from .feasible import check_feasible
from .request import Constraint, Request
from .state import Hold, NodeState, Shape, SingleHold, hold_ids

CLUSTER = "cluster"


class ClusterState:
    """Aggregates of the whole graph (usable nodes only) and the node indexes."""

    __slots__ = ("free_cores", "free_gpus", "free_mem", "buckets", "avail", "gpu_avail",
                 "idle", "usable")

    def __init__(self) -> None:
        self.free_cores = self.free_gpus = self.free_mem = 0
        self.buckets: list[int] = [0]  # buckets[c]: mask of nodes with exactly c free cores
        self.avail = 0      # nodes with >= 1 free core
        self.gpu_avail = 0  # nodes with >= 1 free gpu
        self.idle = 0       # nodes with nothing allocated
        self.usable = 0     # up and not drained


class ResourceGraph:
    """Resources of one MiniCluster; see the module docstring for the model."""

    def __init__(self) -> None:
        self.graph = nx.DiGraph()
        self.cluster = ClusterState()
        self.graph.add_node(CLUSTER, kind="cluster", state=self.cluster)
        self.nodes: dict[int, NodeState] = {}
        self.by_pos: list[NodeState | None] = []
        self.positions_follow_ranks = True  # first-fit order == rank order
        self._highest_rank = -1
        self._holds: dict[Hashable, dict[int, Hold]] = {}
        self._prop_masks: dict[tuple[str, str], int] = {}
        self._key_masks: dict[str, int] = {}
        self._constraint_cache: dict[tuple[Constraint, ...], int] = {}
        self._shapes: dict[Shape, int] = {}
        self.version = 0  # bumped on every change; lets the scheduler skip idle cycles
        self.topology_version = 0  # bumped when ranks are added/removed/change health

    # ----------------------------------------------------------------- ranks

    def add_rank(self, rank: int, *, hostname: str, sockets: dict[int, tuple[int, ...]],
                 gpus: tuple[int, ...] = (), memory_mb: int = 0,
                 properties: dict[str, str] | None = None) -> None:
        """Add a node, or replace a known rank's description and bring it up.

        Allocations still held on a replaced rank keep holding whatever of
        their ids the new description still has.  A drain survives: it is
        an operator's decision, not a property of the node's last life.
        """
        old = self.nodes.get(rank)
        pos = old.pos if old else len(self.by_pos)
        node = NodeState(rank, pos, hostname, sockets, tuple(gpus), memory_mb, properties or {})
        if old:
            node.drain_reason = old.drain_reason
            self._detach_node(old)
        else:
            self.by_pos.append(None)
            if rank < self._highest_rank:
                self.positions_follow_ranks = False
            self._highest_rank = max(self._highest_rank, rank)
        self._attach_node(node)
        if old:
            self._carry_holds(node)

    def remove_rank(self, rank: int) -> None:
        """Forget a rank; what live allocations held on it is forgotten too.

        Dropping those holds matters if the rank is added again later: the
        new node must not be credited with resources it never gave out.
        """
        self._detach_node(self._node(rank))
        self.by_pos[self.nodes.pop(rank).pos] = None
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

    def _attach_node(self, node: NodeState) -> None:
        g, r = self.graph, node.rank
        g.add_node(("node", r), kind="node", state=node)
        g.add_edge(CLUSTER, ("node", r))
        for sock in node.sockets:
            g.add_node(("socket", r, sock.index), kind="socket", state=sock)
            g.add_edge(("node", r), ("socket", r, sock.index))
        g.add_node(("memory", r), kind="memory", size_mb=node.total_mem)
        g.add_edge(("node", r), ("memory", r))
        self.nodes[r] = node
        self.by_pos[node.pos] = node
        cl = self.cluster
        while len(cl.buckets) <= node.total_cores:
            cl.buckets.append(0)
        cl.buckets[node.free_cores] |= node.bit
        self._flag(node, True)
        for key, value in node.properties.items():
            self._prop_masks[(key, value)] = self._prop_masks.get((key, value), 0) | node.bit
            self._key_masks[key] = self._key_masks.get(key, 0) | node.bit
        shape = Shape.of(node)
        self._shapes[shape] = self._shapes.get(shape, 0) + 1
        self._constraint_cache.clear()
        self.version += 1
        self.topology_version += 1

    def _detach_node(self, node: NodeState) -> None:
        r, cl = node.rank, self.cluster
        self.graph.remove_nodes_from([("node", r), ("memory", r)]
                                    + [("socket", r, s.index) for s in node.sockets])
        cl.buckets[node.free_cores] &= ~node.bit
        self._flag(node, False)
        for key, value in node.properties.items():
            self._prop_masks[(key, value)] &= ~node.bit
            self._key_masks[key] &= ~node.bit
        shape = Shape.of(node)
        self._shapes[shape] -= 1
        if not self._shapes[shape]:
            del self._shapes[shape]
        self._constraint_cache.clear()
        self.version += 1
        self.topology_version += 1

    def _flag(self, node: NodeState, present: bool) -> None:
        """Add (present) or remove the node from the yes/no indexes and totals."""
        cl, bit, sign = self.cluster, node.bit, 1 if present else -1
        keep = bit if present else 0
        for name, member in (("avail", node.free_cores > 0), ("gpu_avail", node.free_gpus > 0),
                             ("idle", node.is_idle()), ("usable", node.usable)):
            if member:
                setattr(self.cluster, name, (getattr(cl, name) & ~bit) | keep)
        if node.usable:
            cl.free_cores += sign * node.free_cores
            cl.free_gpus += sign * node.free_gpus
            cl.free_mem += sign * node.free_mem

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
                self._take(node, new)

    # ------------------------------------------------------------ accounting

    def _take(self, node: NodeState, hold: Hold) -> None:
        self._account(node, hold, True)

    def _give(self, node: NodeState, hold: Hold) -> None:
        self._account(node, hold, False)

    def _account(self, node: NodeState, hold: Hold, taking: bool) -> None:
        """Apply a take/give to a node and move it between the index masks.

        NodeState.take/give are inlined: this runs once per allocation
        start and once per release, the scheduler's hottest bookkeeping.
        """
        cl, bit = self.cluster, node.bit
        fc, fg, fm = node.free_cores, node.free_gpus, node.free_mem
        tc, tg, tm = node.total_cores, node.total_gpus, node.total_mem
        idle = fc == tc and fg == tg and fm == tm
        cores, gpus, mem = hold
        nfc, nfg = fc, fg
        if taking:
            for s, c, g in zip(node.sockets, cores, gpus):
                if c:
                    s.cores_free ^= c
                    nfc -= c.bit_count()
                if g:
                    s.gpus_free ^= g
                    nfg -= g.bit_count()
            nfm = fm - mem
        else:
            for s, c, g in zip(node.sockets, cores, gpus):
                if c:
                    s.cores_free |= c
                    nfc += c.bit_count()
                if g:
                    s.gpus_free |= g
                    nfg += g.bit_count()
            nfm = fm + mem
        node.free_cores, node.free_gpus, node.free_mem = nfc, nfg, nfm
        if nfc != fc:
            buckets = cl.buckets
            buckets[fc] ^= bit
            buckets[nfc] |= bit
            if not fc or not nfc:
                cl.avail ^= bit
        if nfg != fg and (not fg or not nfg):
            cl.gpu_avail ^= bit
        if idle != (nfc == tc and nfg == tg and nfm == tm):
            cl.idle ^= bit
        if node.up and node.drain_reason is None:
            cl.free_cores += nfc - fc
            cl.free_gpus += nfg - fg
            cl.free_mem += nfm - fm
        self.version += 1

    def alloc(self, key: Hashable, allocation: Allocation) -> None:
        """Take the allocation's resources under key; ValueError if any is not free."""
        if key in self._holds:
            raise ValueError(f"allocation key {key!r} already holds resources")
        holds: dict[int, Hold] = {}
        hint = allocation.hint or {}
        for rank, ralloc in allocation.items():
            node = self.nodes.get(rank)
            if node is None:
                raise ValueError(f"allocation names unknown rank {rank}")
            if allocation.exclusive:
                if not node.is_idle():
                    raise ValueError(f"rank {rank} is not idle, cannot allocate it exclusively")
                hold = node.free_hold()
            else:
                hinted = hint.get(rank)
                hold = hinted[1] if hinted and hinted[0] is node else node.hold_for(ralloc.slots)
                if not node.can_take(hold):
                    raise ValueError(f"resources on rank {rank} are not free for {key!r}")
            holds[rank] = hold
        for rank, hold in holds.items():
            self._account(self.nodes[rank], hold, True)
        self._holds[key] = holds
        allocation.hint = None  # spent: do not keep node references alive via the broker

    def alloc_array(self, keys: Sequence[Hashable], request: Request,
                    policy: str = "first-fit") -> list[Allocation]:
        """Allocate one-slot tasks under keys, in order, as many as fit now.

        The array fast path: equivalent to `match(request, policy)` +
        `alloc(key, ...)` for each key in turn until a match fails, but in
        one pass over the candidate nodes, carving each node's share at
        once and updating its accounting and indexes once.  Returns the
        allocations of keys[:n] for the n that fit.  Single-slot, CPU-only,
        non-exclusive requests only (ValueError otherwise).  The returned
        Allocations are interned per node and ids: immutable, shared with
        earlier tasks that had the same ids.
        """
        if request.nslots != 1 or request.exclusive or request.gpus_per_slot:
            raise ValueError("alloc_array takes one-slot, CPU-only, non-exclusive requests")
        held = self._holds
        if not held.keys().isdisjoint(keys):
            raise ValueError("an allocation key already holds resources")
        cps, mps = request.cores_per_slot, request.mem_per_slot
        out: list[Allocation] = []
        i = 0
        for node, n in matcher.pick_elements(self, request, policy, len(keys)):
            allocs, holds, total = node.carve_singles(n, cps, mps)
            self._account(node, total, True)
            held.update(zip(keys[i:i + n], holds))
            i += n
            out += allocs
        return out

    def free(self, key: Hashable) -> None:
        """Give back everything key holds (KeyError if it holds nothing)."""
        holds = self._holds.pop(key)
        nodes = self.nodes
        if type(holds) is SingleHold and holds.sock is not None:
            # An array element's core(s) on one socket: the general give of
            # _account, specialised (no GPUs, one socket mask, known counts).
            node = holds.node
            if nodes.get(node.rank) is node:
                holds.sock.cores_free |= holds.mask
                fc = node.free_cores
                nfc = node.free_cores = fc + holds.ncores
                mem = holds.mem
                if mem:
                    node.free_mem += mem
                cl, bit = self.cluster, node.bit
                buckets = cl.buckets
                buckets[fc] ^= bit
                buckets[nfc] |= bit
                if not fc:
                    cl.avail |= bit
                if (nfc == node.total_cores and node.free_mem == node.total_mem
                        and node.free_gpus == node.total_gpus):
                    cl.idle |= bit
                if node.up and node.drain_reason is None:
                    cl.free_cores += nfc - fc
                    cl.free_mem += mem
                self.version += 1
                return
        for rank, hold in holds.items():
            node = nodes.get(rank)
            if node is not None:
                self._account(node, hold, False)

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
        merged: dict[int, list] = {}
        for key in keys:
            for rank, (cores, gpus, mem) in held.pop(key).items():
                acc = merged.get(rank)
                if acc is None:
                    merged[rank] = [list(cores), list(gpus), mem]
                else:
                    for j, c in enumerate(cores):
                        if c:
                            acc[0][j] |= c
                    if any(gpus):
                        for j, g in enumerate(gpus):
                            acc[1][j] |= g
                    acc[2] += mem
        for rank, (cores, gpus, mem) in merged.items():
            node = self.nodes.get(rank)
            if node is not None:
                self._account(node, (tuple(cores), tuple(gpus), mem), False)

    def hold_free_part(self, key: Hashable, allocation: Allocation) -> None:
        """Hold whatever of allocation's resources is free now (backfill reservations)."""
        holds: dict[int, Hold] = {}
        hint = allocation.hint or {}  # a reservation is re-held often: reuse the matcher's masks
        for rank, ralloc in allocation.items():
            node = self.nodes.get(rank)
            if node is None:
                continue
            hinted = hint.get(rank)
            if allocation.exclusive:
                want = node.free_hold()
            elif hinted and hinted[0] is node:
                want = hinted[1]
            else:
                want = node.hold_for(ralloc.slots)
            cores = tuple(w & s.cores_free for w, s in zip(want[0], node.sockets))
            gpus = tuple(w & s.gpus_free for w, s in zip(want[1], node.sockets))
            holds[rank] = (cores, gpus, min(want[2], node.free_mem))
            self._take(node, holds[rank])
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

    def attach(self, key: Hashable, holds: dict[int, Hold]) -> None:
        """Re-take what detach() returned; the resources must still be free."""
        for rank, hold in holds.items():
            node = self.nodes.get(rank)
            if node is not None:
                self._take(node, hold)
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
    match = matcher.match
    fits = matcher.fits  # fits(request, policy="first-fit") -> bool, no ids carved

    def check_feasible(self, request: Request) -> None:
        """Raise InfeasibleRequest if request could never fit, even on an empty instance."""
        check_feasible(self._shapes, request)

    # --------------------------------------------------------------- reports

    def iter_nodes(self) -> Iterator[NodeState]:
        """Node vertex states in rank order."""
        for rank in sorted(self.nodes):
            yield self.nodes[rank]

    def summary(self) -> list[dict[str, object]]:
        """Per-rank view for `mc resources` (plain, JSON-safe values)."""
        rows = []
        for node in self.iter_nodes():
            free_cores = [c for s in node.sockets for c in idset.iter_ascending(s.cores_free)]
            free_gpus = [g for s in node.sockets for g in idset.iter_ascending(s.gpus_free)]
            state = "down" if not node.up else "drained" if node.drain_reason is not None else "up"
            rows.append({
                "rank": node.rank, "hostname": node.hostname, "state": state,
                "reason": node.drain_reason or "",
                "cores_total": node.total_cores, "cores_free": node.free_cores,
                "cores_free_ids": str(IdSet.from_ints(free_cores)),
                "gpus_total": node.total_gpus, "gpus_free": node.free_gpus,
                "gpus_free_ids": str(IdSet.from_ints(free_gpus)),
                "memory_mb_total": node.total_mem, "memory_mb_free": node.free_mem,
                "properties": dict(node.properties),
            })
        return rows

    def snapshot(self) -> tuple:
        """Hashable copy of all accounting state (tests compare before/after free)."""
        cl = self.cluster
        nodes = tuple(
            (n.rank, n.up, n.drain_reason, n.free_cores, n.free_gpus, n.free_mem,
             tuple((s.cores_free, s.gpus_free) for s in n.sockets))
            for n in self.iter_nodes())
        return (nodes, cl.free_cores, cl.free_gpus, cl.free_mem, tuple(cl.buckets),
                cl.avail, cl.gpu_avail, cl.idle, cl.usable)
