"""Per-vertex state of the resource graph below the groups: nodes and sockets.

Each node vertex of the networkx graph carries a NodeState, each socket
vertex a SocketState.  Cores and GPUs are id-sets (bitmasks) on their socket
so a 64-core node is 1 node + 2 socket vertices, not 64 core vertices, yet
real ids survive for task binding.  Memory is per socket (a NUMA domain);
the node's free memory is the sum.  A Hold is what one allocation took from
one node, kept so that giving it back restores the exact prior state.
Carving ids for slots lives in carve.py (flat slots) and units.py (slots
bound to sockets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import idset
from .alloc import Allocation, Slot
from .carve import FlatCarving, SingleHold, take_memory

if TYPE_CHECKING:
    from .topology import GroupState

# Hold = (core mask per socket, gpu mask per socket, memory MB per socket)
Hold = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]

GpuSpec = tuple[int, ...] | Mapping[int, tuple[int, ...]]
MemSpec = int | Mapping[int, int]


class SocketState:
    """Free/total core and GPU id-sets and memory (MB) of one socket."""

    __slots__ = ("index", "cores_all", "cores_free", "gpus_all", "gpus_free", "mem_all",
                 "mem_free")

    def __init__(self, index: int, cores: int, gpus: int, mem: int) -> None:
        self.index = index
        self.cores_all = self.cores_free = cores
        self.gpus_all = self.gpus_free = gpus
        self.mem_all = self.mem_free = mem

    def is_idle(self) -> bool:
        return (self.cores_free == self.cores_all and self.gpus_free == self.gpus_all
                and self.mem_free == self.mem_all)


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

    def can_take(self, hold: Hold) -> bool:
        cores, gpus, mems = hold
        for s, c, g, m in zip(self.sockets, cores, gpus, mems, strict=True):
            if c & s.cores_free != c or g & s.gpus_free != g or m > s.mem_free:
                return False
        return True


def hold_ids(hold: Hold) -> tuple[set[int], set[int], int]:
    """Core ids, GPU ids and memory of a hold, socket-independent."""
    cores, gpus, mems = hold
    return ({i for m in cores for i in idset.iter_ascending(m)},
            {i for m in gpus for i in idset.iter_ascending(m)}, sum(mems))


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
