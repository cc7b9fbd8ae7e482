"""The vertex states: the nodes (the model's data, plus their index fields) and the groups of the matcher's index.

Each node vertex of the model (model.py, the networkx graph) carries a NodeState, each socket
vertex a SocketState (sockets.py): description, health and free id-sets.  A node's free counts and
`parent` are index fields graph.py derives from the model.  Cores and GPUs are id-sets (bitmasks) on their socket
so a 64-core node is 1 node + 2 socket vertices, not 64 core vertices, yet
real ids survive for task binding.  Memory is per socket (a NUMA domain);
the node's free memory is the sum.  A Hold is what one allocation took from
one node, kept so that giving it back restores the exact prior state.
Carving ids for slots lives in carve.py (flat slots) and units.py (slots
bound to sockets).

Each group vertex of the model has a GroupState in the index (the root,
ClusterState, also holds the bitmask indexes), compiled from the model by
graph.py, with the aggregates of its subtree that the walk prunes with, kept
in step by graph.py on every alloc/free/health change: free
cores, GPUs and memory and the number of idle and of usable nodes (usable =
up and not drained), plus the bitmask of its nodes and a count of its node
shapes (for feasibility).  Which levels exist, and a node's path through
them, is topology.py's.  Groups and nodes refer to each other (a node's
`parent`, a group's `subgroups`), so they live in one module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from . import idset
from .alloc import Allocation, Slot
from .carve import FlatCarving, SingleHold, take_memory
from .sockets import Hold, SocketState
from .topology import Path

GpuSpec = tuple[int, ...] | Mapping[int, tuple[int, ...]]
MemSpec = int | Mapping[int, int]


class NodeState(FlatCarving):
    """Description, health and aggregate free counts of one node (rank).

    `parent` is the GroupState of the lowest topology level holding the
    node (or the cluster's root group); graph.py keeps the ancestors'
    aggregates in step with this node's.
    """

    __slots__ = (
        "rank", "pos", "bit", "hostname", "sockets", "core_socket", "gpu_socket",
        "total_cores", "total_gpus", "total_mem", "free_cores", "free_gpus", "free_mem",
        "properties", "up", "drain_reason", "singles", "zero", "parent",
    )

    def __init__(self, rank: int, hostname: str, sockets: Mapping[int, tuple[int, ...]],
                 gpus: GpuSpec, memory_mb: MemSpec, properties: Mapping[str, str]) -> None:
        if not sockets:
            raise ValueError(f"rank {rank}: a node needs at least one socket")
        if rank < 0:
            raise ValueError(f"rank {rank}: ranks are >= 0")
        # Bit positions are ranks: first-fit (lowest bit first) is rank order.
        self.rank, self.pos, self.bit = rank, rank, 1 << rank
        self.hostname = hostname
        self.properties = dict(properties)
        self.up = True
        self.drain_reason: str | None = None
        self.parent: GroupState | None = None  # set when the graph attaches the node
        socket_ids = sorted(sockets)
        index_of = {sid: i for i, sid in enumerate(socket_ids)}
        self.core_socket: dict[int, int] = {}
        for sid in socket_ids:
            for core in sockets[sid]:
                if core in self.core_socket:
                    raise ValueError(f"rank {rank}: core {core} listed twice")
                if core < 0:
                    raise ValueError(f"rank {rank}: negative core id {core}")
                self.core_socket[core] = index_of[sid]
        self.gpu_socket = _gpu_sockets(rank, gpus, index_of)
        mems = _socket_memory(rank, memory_mb, socket_ids)
        self.sockets = tuple(
            SocketState(sid,
                        idset.to_mask(sockets[sid]),
                        idset.to_mask(g for g, i in self.gpu_socket.items() if i == index_of[sid]),
                        mems[index_of[sid]])
            for sid in socket_ids)
        self.zero = (0,) * len(socket_ids)
        self.total_cores = self.free_cores = len(self.core_socket)
        self.total_gpus = self.free_gpus = len(self.gpu_socket)
        self.total_mem = self.free_mem = sum(mems)
        # mem -> {slot key -> (Allocation, SingleHold)}, see carve.py
        self.singles: dict[int, dict[object, tuple[Allocation, SingleHold]]] = {}

    @property
    def usable(self) -> bool:
        return self.up and self.drain_reason is None

    def recount(self) -> None:
        """Derive the node's free counts from its sockets' (when the index is compiled from a model)."""
        self.free_cores = sum(s.cores_free.bit_count() for s in self.sockets)
        self.free_gpus = sum(s.gpus_free.bit_count() for s in self.sockets)
        self.free_mem = sum(s.mem_free for s in self.sockets)

    def is_idle(self) -> bool:
        return (self.free_cores == self.total_cores and self.free_gpus == self.total_gpus
                and self.free_mem == self.total_mem)

    def capacity(self, cps: int, gps: int, mps: int) -> int:
        """How many slots of this shape fit in the free resources now.

        A flat slot may span sockets and draws memory from the node's pool.
        """
        cap = self.free_cores // cps
        if gps:
            cap = min(cap, self.free_gpus // gps)
        if mps:
            cap = min(cap, self.free_mem // mps)
        return cap

    def socket_free(self) -> tuple[tuple[int, int, int], ...]:
        """(free cores, free GPUs, free MB) per socket."""
        return tuple((s.cores_free.bit_count(), s.gpus_free.bit_count(), s.mem_free)
                     for s in self.sockets)

    def socket_totals(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((s.cores_all.bit_count(), s.gpus_all.bit_count(), s.mem_all)
                     for s in self.sockets)

    def hold_for(self, slots: tuple[Slot, ...]) -> Hold:
        """The Hold that taking these slots' resources amounts to.

        A slot's memory comes from the socket of its first core while that
        socket has room, then from the other sockets in order (as carving
        does); only the total per slot is on the wire.
        """
        nsock = len(self.sockets)
        cores = [0] * nsock
        gpus = [0] * nsock
        mems = [0] * nsock
        free = [s.mem_free for s in self.sockets]
        try:
            for slot in slots:
                for c in slot.cores:
                    cores[self.core_socket[c]] |= 1 << c
                for g in slot.gpus:
                    gpus[self.gpu_socket[g]] |= 1 << g
                if slot.memory_mb:
                    home = self.core_socket[slot.cores[0]] if slot.cores else 0
                    take_memory(free, home, slot.memory_mb, mems)
        except KeyError as exc:
            raise ValueError(f"rank {self.rank} has no core/gpu {exc.args[0]}") from None
        except IndexError:
            raise ValueError(f"rank {self.rank} has not enough free memory") from None
        return tuple(cores), tuple(gpus), tuple(mems)

    def free_hold(self) -> Hold:
        """Everything currently free: what an exclusive allocation takes."""
        socks = self.sockets
        return (tuple(s.cores_free for s in socks), tuple(s.gpus_free for s in socks),
                tuple(s.mem_free for s in socks))

    def hold_from_ids(self, cores: set[int], gpus: set[int], mem: int) -> Hold:
        """Rebuild a hold against this (possibly re-described) node, dropping unknown ids."""
        slot = Slot(tuple(sorted(c for c in cores if c in self.core_socket)),
                    tuple(sorted(g for g in gpus if g in self.gpu_socket)), min(mem, self.free_mem))
        return self.hold_for((slot,))

    def take(self, hold: Hold) -> None:
        """Take a hold's ids and memory from the sockets and the free counts (graph.py then updates the index)."""
        cores, gpus, mems = hold
        socks, zero = self.sockets, self.zero  # carving passes node.zero for "no GPU/memory"
        free = self.free_cores
        for s, c in zip(socks, cores, strict=True):
            if c:
                s.cores_free ^= c
                free -= c.bit_count()
        self.free_cores = free
        if gpus is not zero:
            free = self.free_gpus
            for s, g in zip(socks, gpus, strict=True):
                if g:
                    s.gpus_free ^= g
                    free -= g.bit_count()
            self.free_gpus = free
        if mems is not zero:
            free = self.free_mem
            for s, m in zip(socks, mems, strict=True):
                if m:
                    s.mem_free -= m
                    free -= m
            self.free_mem = free

    def give(self, hold: Hold) -> None:
        """Give back what take(hold) took (graph.py then updates the index)."""
        cores, gpus, mems = hold
        socks, zero = self.sockets, self.zero
        free = self.free_cores
        for s, c in zip(socks, cores, strict=True):
            if c:
                s.cores_free |= c
                free += c.bit_count()
        self.free_cores = free
        if gpus is not zero:
            free = self.free_gpus
            for s, g in zip(socks, gpus, strict=True):
                if g:
                    s.gpus_free |= g
                    free += g.bit_count()
            self.free_gpus = free
        if mems is not zero:
            free = self.free_mem
            for s, m in zip(socks, mems, strict=True):
                if m:
                    s.mem_free += m
                    free += m
            self.free_mem = free

    def can_take(self, hold: Hold) -> bool:
        cores, gpus, mems = hold
        for s, c, g, m in zip(self.sockets, cores, gpus, mems, strict=True):
            if c & s.cores_free != c or g & s.gpus_free != g or m > s.mem_free:
                return False
        return True


def _gpu_sockets(rank: int, gpus: GpuSpec, index_of: dict[int, int]) -> dict[int, int]:
    """GPU id -> socket index: as given per socket, or dealt out evenly over the sockets."""
    if isinstance(gpus, Mapping):
        out: dict[int, int] = {}
        for sid, ids in gpus.items():
            if sid not in index_of:
                raise ValueError(f"rank {rank}: GPUs on unknown socket {sid}")
            for g in ids:
                if g in out or g < 0:
                    raise ValueError(f"rank {rank}: GPU id {g} listed twice or negative")
                out[g] = index_of[sid]
        return out
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise ValueError(f"rank {rank}: duplicate or negative gpu ids {gpus}")
    ordered = sorted(gpus)
    return {g: i * len(index_of) // len(ordered) for i, g in enumerate(ordered)}


def _socket_memory(rank: int, memory: MemSpec, socket_ids: list[int]) -> list[int]:
    """MB per socket (in socket id order): as given, or the total split evenly."""
    if isinstance(memory, Mapping):
        unknown = set(memory) - set(socket_ids)
        if unknown:
            raise ValueError(f"rank {rank}: memory on unknown socket(s) {sorted(unknown)}")
        mems = [int(memory.get(sid, 0)) for sid in socket_ids]
    else:
        base, extra = divmod(int(memory), len(socket_ids))
        mems = [base + (1 if i < extra else 0) for i in range(len(socket_ids))]
    if any(m < 0 for m in mems):
        raise ValueError(f"rank {rank}: memory_mb must be >= 0")
    return mems


@dataclass(frozen=True, slots=True)
class Shape:
    """What feasibility checks need to know about a node: totals and properties."""

    cores: int
    gpus: int
    memory_mb: int
    properties: frozenset[tuple[str, str]]
    sockets: tuple[tuple[int, int, int], ...] = ()  # (cores, gpus, MB) per socket

    @classmethod
    def of(cls, node: NodeState) -> Shape:
        return cls(node.total_cores, node.total_gpus, node.total_mem,
                   frozenset(node.properties.items()), node.socket_totals())


class GroupState:
    """A vertex above the nodes (a zone, a rack, or the cluster root)."""

    __slots__ = ("level", "path", "parent", "subgroups", "mask", "nodes", "usable_nodes",
                 "idle_nodes", "free_cores", "free_gpus", "free_mem", "shapes", "_below")

    def __init__(self, level: str, path: Path, parent: GroupState | None) -> None:
        self.level, self.path, self.parent = level, path, parent
        self.subgroups: dict[Path, GroupState] = {}  # the groups right below (nodes: only in mask)
        self.mask = 0  # bits (ranks) of every node below, whatever its health
        self.nodes = 0
        # Aggregates over the usable nodes below (what the walk prunes with).
        self.usable_nodes = self.idle_nodes = 0
        self.free_cores = self.free_gpus = self.free_mem = 0
        self.shapes: Counter[Shape] = Counter()  # every node below, for feasibility
        self._below: dict[str, list[GroupState]] | None = None

    @property
    def name(self) -> str:
        return self.path[-1][1] if self.path else "cluster"

    @property
    def label(self) -> str:
        """"zone=a/rack=r1" (the cluster root: "cluster")."""
        return "/".join(f"{lv}={v}" for lv, v in self.path) or "cluster"

    def min_rank(self) -> int:
        return (self.mask & -self.mask).bit_length() - 1

    def all_idle(self) -> bool:
        """Every node below usable and idle: the group can be taken exclusively."""
        return self.idle_nodes == self.nodes

    def below(self, level: str) -> list[GroupState]:
        """Descendant groups at `level`, in rank order (cached until the tree changes)."""
        cache = self._below
        if cache is None:
            cache = self._below = {}
        found = cache.get(level)
        if found is None:
            found = cache[level] = sorted(self._walk(level), key=GroupState.min_rank)
        return found

    def _walk(self, level: str) -> Iterator[GroupState]:
        for child in self.subgroups.values():
            if child.level == level:
                yield child
            else:
                yield from child._walk(level)

    def forget_order(self) -> None:
        """Drop cached orderings here and above (membership changed)."""
        g: GroupState | None = self
        while g is not None:
            g._below = None
            g = g.parent


class ClusterState(GroupState):
    """The root group plus the bitmask indexes over nodes (bit = rank)."""

    __slots__ = ("buckets", "avail", "gpu_avail", "idle", "usable")

    def __init__(self) -> None:
        super().__init__("cluster", (), None)
        self.buckets: list[int] = [0]  # buckets[c]: mask of nodes with exactly c free cores
        self.avail = 0      # nodes with >= 1 free core
        self.gpu_avail = 0  # nodes with >= 1 free gpu
        self.idle = 0       # nodes with nothing allocated
        self.usable = 0     # up and not drained


def ancestors(node: NodeState) -> Iterator[GroupState]:
    g = node.parent
    while g is not None:
        yield g
        g = g.parent


def group_of(node: NodeState, level: str) -> GroupState | None:
    """The node's ancestor at `level` (None if the node skips that level)."""
    for g in ancestors(node):
        if g.level == level:
            return g
    return None
