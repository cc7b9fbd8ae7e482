"""Per-vertex state of the resource graph: node and socket accounting.

Each node vertex of the networkx graph carries a NodeState, each socket
vertex a SocketState.  Cores and GPUs are id-sets (bitmasks) on their socket
so a 64-core node is 1 node + 2 socket vertices, not 64 core vertices, yet
real ids survive for task binding.  A Hold is what one allocation took from
one node, kept so that giving it back restores the exact prior state.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import idset
from .alloc import Allocation, RankAlloc, Slot, make_slot

# Hold = (core mask per socket, gpu mask per socket, memory MB)
Hold = tuple[tuple[int, ...], tuple[int, ...], int]


# (socket core masks, socket gpu masks, n, cps, gps, mps) -> carve of an idle
# node; values are immutable, the cache is emptied when it grows big.
_IDLE_CARVES: dict[tuple, tuple[tuple[Slot, ...], Hold]] = {}
_IDLE_CARVES_MAX = 4096

# Bound on NodeState.singles (single-slot carves of one node, see carve_singles).
_SINGLES_MAX = 4096


class SingleHold(dict):
    """The holds record {rank: Hold} of one single-slot CPU-only task.

    A plain holds dict to everything in the graph, plus what lets free()
    give it back without the general accounting walk: the node and, when
    the slot is on one socket, that socket, its core mask, core count and
    memory.  Interned per node (NodeState.singles): at any time at most one
    live key holds a given record, since its cores can only be held once;
    free() uses the fast path only while `node` is still the graph's node
    for the rank (a re-described or removed rank goes the general way).
    """

    __slots__ = ("node", "sock", "mask", "ncores", "mem")


class SocketState:
    """Free/total core and GPU id-sets of one socket."""

    __slots__ = ("index", "cores_all", "cores_free", "gpus_all", "gpus_free")

    def __init__(self, index: int, cores: int, gpus: int) -> None:
        self.index = index
        self.cores_all = self.cores_free = cores
        self.gpus_all = self.gpus_free = gpus


class NodeState:
    """Description, health and aggregate free counts of one node (rank)."""

    __slots__ = (
        "rank", "pos", "bit", "hostname", "sockets", "core_socket", "gpu_socket",
        "total_cores", "total_gpus", "total_mem", "free_cores", "free_gpus", "free_mem",
        "properties", "up", "drain_reason", "singles",
    )

    def __init__(self, rank: int, pos: int, hostname: str, sockets: dict[int, tuple[int, ...]],
                 gpus: tuple[int, ...], memory_mb: int, properties: dict[str, str]) -> None:
        if not sockets:
            raise ValueError(f"rank {rank}: a node needs at least one socket")
        if memory_mb < 0:
            raise ValueError(f"rank {rank}: memory_mb must be >= 0")
        self.rank, self.pos, self.bit = rank, pos, 1 << pos
        self.hostname = hostname
        self.properties = dict(properties)
        self.up, self.drain_reason = True, None
        socket_ids = sorted(sockets)
        index_of = {sid: i for i, sid in enumerate(socket_ids)}
        self.core_socket: dict[int, int] = {}
        for sid, cores in sorted(sockets.items()):
            for core in cores:
                if core in self.core_socket:
                    raise ValueError(f"rank {rank}: core {core} listed twice")
                self.core_socket[core] = index_of[sid]
        self.gpu_socket = _spread_gpus(rank, gpus, len(socket_ids))
        self.sockets = tuple(
            SocketState(sid,
                        idset.to_mask(sockets[sid]),
                        idset.to_mask(g for g, i in self.gpu_socket.items() if i == index_of[sid]))
            for sid in socket_ids)
        self.total_cores = self.free_cores = len(self.core_socket)
        self.total_gpus = self.free_gpus = len(self.gpu_socket)
        self.total_mem = self.free_mem = memory_mb
        # mem -> {slot core mask (or per-socket masks when it spans sockets)
        # -> (Allocation, SingleHold)} of one single-slot CPU-only task:
        # array elements reuse them instead of building both per element.
        self.singles: dict[int, dict[object, tuple[Allocation, SingleHold]]] = {}

    @property
    def usable(self) -> bool:
        return self.up and self.drain_reason is None

    def is_idle(self) -> bool:
        return (self.free_cores == self.total_cores and self.free_gpus == self.total_gpus
                and self.free_mem == self.total_mem)

    def max_socket_free(self) -> int:
        return max(s.cores_free.bit_count() for s in self.sockets)

    def capacity(self, cps: int, gps: int, mps: int) -> int:
        """How many slots of this shape fit in the free resources now."""
        cap = self.free_cores // cps
        if gps:
            cap = min(cap, self.free_gpus // gps)
        if mps:
            cap = min(cap, self.free_mem // mps)
        return cap

    def carve(self, n: int, cps: int, gps: int, mps: int) -> tuple[tuple[Slot, ...], Hold]:
        """Choose core/GPU ids for n slots from the free sets (does not take them).

        Returns the slots and the Hold they amount to.  A slot's cores come
        from one socket when possible: whole slots are cut from the fullest
        sockets first (best fit, keeping emptier sockets whole for wide
        tasks); only the remainder spans sockets.  GPUs prefer the socket of
        the slot's cores.
        """
        if n == 1 and not gps:
            one = self._carve_one(cps, mps)
            if one is not None:
                return one
        if self.free_cores == self.total_cores and self.free_gpus == self.total_gpus:
            return self._carve_idle(n, cps, gps, mps)
        return self._carve_from_free(n, cps, gps, mps)

    def _carve_idle(self, n: int, cps: int, gps: int, mps: int) -> tuple[tuple[Slot, ...], Hold]:
        """Carving an idle node depends only on its layout: reuse the answer.

        Wide jobs (thousands of tasks over many identical idle nodes) then
        cost one carve per distinct node layout instead of one per task.
        """
        key = (tuple(s.cores_all for s in self.sockets), tuple(s.gpus_all for s in self.sockets),
               n, cps, gps, mps)
        carved = _IDLE_CARVES.get(key)
        if carved is None:
            if len(_IDLE_CARVES) >= _IDLE_CARVES_MAX:
                _IDLE_CARVES.clear()
            carved = _IDLE_CARVES[key] = self._carve_from_free(n, cps, gps, mps)
        return carved

    def _carve_from_free(self, n: int, cps: int, gps: int,
                         mps: int) -> tuple[tuple[Slot, ...], Hold]:
        nsock = len(self.sockets)
        free = [list(idset.iter_ascending(s.cores_free)) for s in self.sockets]
        taken = [0] * nsock
        groups: list[tuple[int, list[int]]] = []  # (home socket, core ids)
        for i in sorted(range(nsock), key=lambda i: len(free[i])):
            ids = free[i]
            k = min(n - len(groups), len(ids) // cps)
            if k:
                groups.extend((i, ids[j * cps:(j + 1) * cps]) for j in range(k))
                # the k*cps lowest free ids as a mask, without a per-core loop
                taken[i] = self.sockets[i].cores_free & ((2 << ids[k * cps - 1]) - 1)
                del ids[:k * cps]
        pool = [(i, c) for i, ids in enumerate(free) for c in ids]
        while len(groups) < n:
            take, pool = pool[:cps], pool[cps:]
            for i, c in take:
                taken[i] |= 1 << c
            groups.append((take[0][0], sorted(c for _, c in take)))
        gpu_taken = [0] * nsock
        if not gps:  # the common CPU-only case
            slots = tuple([make_slot(tuple(cores), (), mps) for _, cores in groups])
        else:
            gpu_free = [list(idset.iter_ascending(s.gpus_free)) for s in self.sockets]
            slots = tuple([make_slot(tuple(cores), _carve_gpus(gpu_free, gpu_taken, home, gps), mps)
                           for home, cores in groups])
        return slots, (tuple(taken), tuple(gpu_taken), n * mps)

    def _carve_one(self, cps: int, mps: int) -> tuple[tuple[Slot, ...], Hold] | None:
        """Fast path for the common single CPU-only slot from one socket."""
        best, best_free, at = None, 0, 0
        for i, sock in enumerate(self.sockets):
            free = sock.cores_free.bit_count()
            if free >= cps and (best is None or free < best_free):
                best, best_free, at = sock, free, i
        if best is None:
            return None
        cores, mask = idset.lowest(best.cores_free, cps)
        masks = [0] * len(self.sockets)
        masks[at] = mask
        return (make_slot(cores, (), mps),), (tuple(masks), (0,) * len(masks), mps)

    def carve_singles(self, n: int, cps: int,
                      mps: int) -> tuple[list[Allocation], list[SingleHold], Hold]:
        """Carve n independent one-slot CPU-only tasks at once (array elements).

        Gives exactly what n successive carve(1, cps, 0, mps) + take would:
        whole slots from the fullest socket with room first, lowest ids
        first, and only once no socket has cps free cores, slots spanning
        sockets in socket order.  Returns each task's Allocation and its
        holds record (both interned per node, ids and memory: a core is
        held by at most one task at a time, so the next task on it reuses
        them), plus the Hold of all n together, which the caller takes
        once.  n must not exceed capacity(cps, 0, mps).
        """
        socks = self.sockets
        nsock = len(socks)
        free = [s.cores_free for s in socks]
        cache = self.singles.get(mps)
        if cache is None or len(cache) > _SINGLES_MAX:
            if len(self.singles) > 8:
                self.singles.clear()
            cache = self.singles[mps] = {}
        get = cache.get
        allocs: list[Allocation] = []
        holds: list[SingleHold] = []
        left = n
        order = (0,) if nsock == 1 else sorted(range(nsock), key=lambda i: free[i].bit_count())
        for i in order:
            m = free[i]
            k = min(left, m.bit_count() // cps)
            if not k:
                continue
            left -= k
            for _ in range(k):
                if cps == 1:
                    slot = m & -m
                else:
                    slot, rest = 0, m
                    for _ in range(cps):
                        low = rest & -rest
                        rest ^= low
                        slot |= low
                m ^= slot
                entry = get(slot)
                if entry is None:
                    masks = [0] * nsock
                    masks[i] = slot
                    entry = cache[slot] = self._single(tuple(masks), mps)
                allocs.append(entry[0])
                holds.append(entry[1])
            free[i] = m
            if not left:
                break
        while left:  # cps > 1 and no socket has cps free cores: span sockets
            masks, need = [0] * nsock, cps
            for i in range(nsock):
                m = free[i]
                while need and m:
                    low = m & -m
                    m ^= low
                    masks[i] |= low
                    need -= 1
                free[i] = m
            if need:
                raise ValueError(f"rank {self.rank} cannot hold {n} slots of {cps} cores")
            key = tuple(masks)
            entry = get(key)
            if entry is None:
                entry = cache[key] = self._single(key, mps)
            allocs.append(entry[0])
            holds.append(entry[1])
            left -= 1
        taken = tuple([s.cores_free ^ f for s, f in zip(socks, free)])
        return allocs, holds, (taken, (0,) * nsock, n * mps)

    def _single(self, masks: tuple[int, ...], mps: int) -> tuple[Allocation, SingleHold]:
        cores = tuple(sorted(c for m in masks for c in idset.iter_ascending(m)))
        slot = make_slot(cores, (), mps)
        record = SingleHold({self.rank: (masks, (0,) * len(masks), mps)})
        used = [i for i, m in enumerate(masks) if m]
        record.node = self
        record.sock = self.sockets[used[0]] if len(used) == 1 else None
        record.mask, record.ncores, record.mem = sum(masks), len(cores), mps
        return Allocation({self.rank: RankAlloc((slot,))}), record

    def hold_for(self, slots: tuple[Slot, ...]) -> Hold:
        """The Hold that taking these slots' resources amounts to."""
        cores = [0] * len(self.sockets)
        gpus = [0] * len(self.sockets)
        mem = 0
        try:
            for slot in slots:
                for c in slot.cores:
                    cores[self.core_socket[c]] |= 1 << c
                for g in slot.gpus:
                    gpus[self.gpu_socket[g]] |= 1 << g
                mem += slot.memory_mb
        except KeyError as exc:
            raise ValueError(f"rank {self.rank} has no core/gpu {exc.args[0]}") from None
        return tuple(cores), tuple(gpus), mem

    def free_hold(self) -> Hold:
        """Everything currently free: what an exclusive allocation takes."""
        return (tuple(s.cores_free for s in self.sockets),
                tuple(s.gpus_free for s in self.sockets), self.free_mem)

    def hold_from_ids(self, cores: set[int], gpus: set[int], mem: int) -> Hold:
        """Rebuild a hold against this (possibly re-described) node, dropping unknown ids."""
        slot = Slot(tuple(c for c in cores if c in self.core_socket),
                    tuple(g for g in gpus if g in self.gpu_socket), min(mem, self.free_mem))
        return self.hold_for((slot,))

    def can_take(self, hold: Hold) -> bool:
        cores, gpus, mem = hold
        if mem > self.free_mem:
            return False
        for s, c, g in zip(self.sockets, cores, gpus):
            if c & s.cores_free != c or g & s.gpus_free != g:
                return False
        return True

    def take(self, hold: Hold) -> None:
        cores, gpus, mem = hold
        for s, c, g in zip(self.sockets, cores, gpus):
            if c:
                s.cores_free ^= c
                self.free_cores -= c.bit_count()
            if g:
                s.gpus_free ^= g
                self.free_gpus -= g.bit_count()
        self.free_mem -= mem

    def give(self, hold: Hold) -> None:
        cores, gpus, mem = hold
        for s, c, g in zip(self.sockets, cores, gpus):
            if c:
                s.cores_free |= c
                self.free_cores += c.bit_count()
            if g:
                s.gpus_free |= g
                self.free_gpus += g.bit_count()
        self.free_mem += mem


def _carve_gpus(gpu_free: list[list[int]], gpu_taken: list[int], home: int,
                gps: int) -> tuple[int, ...]:
    """Take gps GPU ids, home socket first; record them in gpu_taken masks."""
    gpus: list[int] = []
    for i in [home] + [j for j in range(len(gpu_free)) if j != home]:
        want = gps - len(gpus)
        if want <= 0:
            break
        got = gpu_free[i][:want]
        del gpu_free[i][:want]
        for g in got:
            gpu_taken[i] |= 1 << g
        gpus += got
    return tuple(sorted(gpus))


def hold_ids(hold: Hold) -> tuple[set[int], set[int], int]:
    """Core ids, GPU ids and memory of a hold, socket-independent."""
    cores, gpus, mem = hold
    return ({i for m in cores for i in idset.iter_ascending(m)},
            {i for m in gpus for i in idset.iter_ascending(m)}, mem)


def _spread_gpus(rank: int, gpus: tuple[int, ...], nsockets: int) -> dict[int, int]:
    """GPU id -> socket index; add_rank gives no affinity, so deal them out evenly."""
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"rank {rank}: duplicate gpu ids {gpus}")
    ordered = sorted(gpus)
    return {g: i * nsockets // len(ordered) for i, g in enumerate(ordered)}


@dataclass(frozen=True, slots=True)
class Shape:
    """What check_feasible needs to know about a node: totals and properties."""

    cores: int
    gpus: int
    memory_mb: int
    properties: frozenset[tuple[str, str]]

    @classmethod
    def of(cls, node: NodeState) -> Shape:
        return cls(node.total_cores, node.total_gpus, node.total_mem,
                   frozenset(node.properties.items()))
