"""Carving real ids for flat slots on one node (the matcher's last step).

A flat slot is c cores (+ g GPUs + m MB) that may span sockets: whole slots
are cut from the fullest sockets first (best fit, keeping emptier sockets
whole for wide tasks), only the remainder spans sockets; GPUs and memory
prefer the socket of the slot's cores.  FlatCarving is a mixin of NodeState
(state.py): these are its methods, kept apart because they are long.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import idset
from .alloc import Allocation, RankAlloc, Slot, make_slot
from .sockets import Hold, SocketState

# (socket core/gpu masks and memory, n, cps, gps, mps) -> carve of an idle
# node; values are immutable, the cache is emptied when it grows big.
_IdleKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int, int, int]
_IDLE_CARVES: dict[_IdleKey, tuple[tuple[Slot, ...], Hold]] = {}
_IDLE_CARVES_MAX = 4096

# Bound on NodeState.singles (single-slot carves of one node, see carve_singles).
_SINGLES_MAX = 4096


class SingleHold(dict[int, Hold]):
    """The holds record {rank: Hold} of one single-slot CPU-only task.

    A plain holds dict to everything in the graph, plus what lets free()
    give it back without the general accounting walk: the node and, when
    the slot's cores and memory are on one socket, that socket, its core
    mask, core count and memory.  Interned per node (NodeState.singles): at
    any time at most one live key holds a given record, since its cores can
    only be held once; free() uses the fast path only while `node` is still
    the graph's node for the rank (a re-described or removed rank goes the
    general way).
    """

    __slots__ = ("node", "sock", "mask", "ncores", "mem")
    node: FlatCarving  # the NodeState it was carved on (FlatCarving is its carving part)
    sock: SocketState | None
    mask: int
    ncores: int
    mem: int


class FlatCarving:
    """Mixin of NodeState: choose ids for flat slots (does not take them)."""

    __slots__ = ()
    if TYPE_CHECKING:  # NodeState's, which these methods use
        rank: int
        sockets: tuple[SocketState, ...]
        zero: tuple[int, ...]
        singles: dict[int, dict[object, tuple[Allocation, SingleHold]]]

        def is_idle(self) -> bool: ...

    def carve(self, n: int, cps: int, gps: int, mps: int) -> tuple[tuple[Slot, ...], Hold]:
        """Core/GPU ids and memory for n flat slots; returns the slots and their Hold."""
        if n == 1 and not gps:
            one = self._carve_one(cps, mps)
            if one is not None:
                return one
        if self.is_idle():
            return self._carve_idle(n, cps, gps, mps)
        return self._carve_from_free(n, cps, gps, mps)

    def _carve_idle(self, n: int, cps: int, gps: int, mps: int) -> tuple[tuple[Slot, ...], Hold]:
        """Carving an idle node depends only on its layout: reuse the answer.

        Wide jobs (thousands of tasks over many identical idle nodes) then
        cost one carve per distinct node layout instead of one per task.
        """
        socks = self.sockets
        key = (tuple([s.cores_all for s in socks]), tuple([s.gpus_all for s in socks]),
               tuple([s.mem_all for s in socks]), n, cps, gps, mps)
        carved = _IDLE_CARVES.get(key)
        if carved is None:
            if len(_IDLE_CARVES) >= _IDLE_CARVES_MAX:
                _IDLE_CARVES.clear()
            carved = _IDLE_CARVES[key] = self._carve_from_free(n, cps, gps, mps)
        return carved

    def _carve_from_free(self, n: int, cps: int, gps: int,
                         mps: int) -> tuple[tuple[Slot, ...], Hold]:
        socks = self.sockets
        nsock = len(socks)
        free = [list(idset.iter_ascending(s.cores_free)) for s in socks]
        taken = [0] * nsock
        groups: list[tuple[int, list[int]]] = []  # (home socket, core ids)
        for i in sorted(range(nsock), key=lambda i: len(free[i])):
            ids = free[i]
            k = min(n - len(groups), len(ids) // cps)
            if k:
                groups.extend((i, ids[j * cps:(j + 1) * cps]) for j in range(k))
                # the k*cps lowest free ids as a mask, without a per-core loop
                taken[i] = socks[i].cores_free & ((2 << ids[k * cps - 1]) - 1)
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
            gpu_free = [list(idset.iter_ascending(s.gpus_free)) for s in socks]
            slots = tuple([make_slot(tuple(cores), _carve_gpus(gpu_free, gpu_taken, home, gps), mps)
                           for home, cores in groups])
        mems = self.zero
        if mps:
            mem_free, out = [s.mem_free for s in socks], [0] * nsock
            for home, _ in groups:
                take_memory(mem_free, home, mps, out)
            mems = tuple(out)
        return slots, (tuple(taken), tuple(gpu_taken) if gps else self.zero, mems)

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
        zero = self.zero
        return (make_slot(cores, (), mps),), (tuple(masks), zero,
                                              self._mem_of(at, mps) if mps else zero)

    def _mem_of(self, home: int, mps: int) -> tuple[int, ...]:
        """Per-socket memory of one slot whose cores are on socket `home`."""
        if not mps:
            return self.zero
        socks = self.sockets
        if socks[home].mem_free >= mps:
            out = [0] * len(socks)
            out[home] = mps
            return tuple(out)
        out = [0] * len(socks)
        take_memory([s.mem_free for s in socks], home, mps, out)
        return tuple(out)

    def carve_singles(self, n: int, cps: int,
                      mps: int) -> tuple[list[Allocation], list[SingleHold], Hold]:
        """Carve n independent one-slot CPU-only tasks at once (array elements).

        Gives exactly what n successive carve(1, cps, 0, mps) + take would:
        whole slots from the fullest socket with room first, lowest ids
        first, and only once no socket has cps free cores, slots spanning
        sockets in socket order; memory from the slot's socket while it
        has room.  Returns each task's Allocation and its holds record
        (both interned per node, ids and memory: a core is held by at most
        one task at a time, so the next task on it reuses them), plus the
        Hold of all n together, which the caller takes once.  n must not
        exceed capacity(cps, 0, mps).
        """
        socks = self.sockets
        nsock = len(socks)
        free = [s.cores_free for s in socks]
        mem = [s.mem_free for s in socks] if mps else None
        cache = self._singles_cache(mps)
        get = cache.get
        zero = self.zero
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
                key: object
                if mem is None:
                    key, mems = slot, zero
                else:
                    mems = _slot_memory(mem, i, mps)
                    key = (slot, mems)
                entry = get(key)
                if entry is None:
                    masks = [0] * nsock
                    masks[i] = slot
                    entry = cache[key] = self._single(tuple(masks), mems)
                allocs.append(entry[0])
                holds.append(entry[1])
            free[i] = m
            if not left:
                break
        if left and not self._spanning_singles(left, cps, mps, free, mem, cache, allocs, holds):
            raise ValueError(f"rank {self.rank} cannot hold {n} slots of {cps} cores")
        taken = tuple([s.cores_free ^ f for s, f in zip(socks, free, strict=True)])
        mems = zero if mem is None else tuple([s.mem_free - f for s, f in zip(socks, mem, strict=True)])
        return allocs, holds, (taken, zero, mems)

    def _singles_cache(self, mps: int) -> dict[object, tuple[Allocation, SingleHold]]:
        """This node's interned single-slot carves for slots of mps MB (emptied when it grows big)."""
        cache = self.singles.get(mps)
        if cache is None or len(cache) > _SINGLES_MAX:
            if len(self.singles) > 8:
                self.singles.clear()
            cache = self.singles[mps] = {}
        return cache

    def _spanning_singles(self, count: int, cps: int, mps: int, free: list[int], mem: list[int] | None,
                          cache: dict[object, tuple[Allocation, SingleHold]],
                          allocs: list[Allocation], holds: list[SingleHold]) -> bool:
        """carve_singles once no socket has cps free cores: count slots that span sockets.

        Each slot is the cps lowest free cores in socket order, taken from
        free, its memory from mem (the socket of its first core first);
        appends each slot's interned Allocation and holds record.  False if
        the free cores run out first.
        """
        nsock = len(free)
        for _ in range(count):
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
                return False
            key: object
            if mem is None:
                key, mems = tuple(masks), self.zero
            else:
                mems = _slot_memory(mem, next(i for i, m in enumerate(masks) if m), mps)
                key = (tuple(masks), mems)
            entry = cache.get(key)
            if entry is None:
                entry = cache[key] = self._single(tuple(masks), mems)
            allocs.append(entry[0])
            holds.append(entry[1])
        return True

    def _single(self, masks: tuple[int, ...], mems: tuple[int, ...]) -> tuple[Allocation,
                                                                               SingleHold]:
        cores = tuple(sorted(c for m in masks for c in idset.iter_ascending(m)))
        total = sum(mems)
        slot = make_slot(cores, (), total)
        record = SingleHold({self.rank: (masks, self.zero, mems)})
        used = {i for i, m in enumerate(masks) if m} | {i for i, m in enumerate(mems) if m}
        record.node = self
        record.sock = self.sockets[used.pop()] if len(used) == 1 else None
        record.mask, record.ncores, record.mem = sum(masks), len(cores), total
        return Allocation({self.rank: RankAlloc((slot,))}), record


def _slot_memory(mem: list[int], home: int, mps: int) -> tuple[int, ...]:
    """Take one slot's memory from `mem` (home socket first); MB per socket."""
    out = [0] * len(mem)
    take_memory(mem, home, mps, out)
    return tuple(out)


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


def take_memory(free: list[int], home: int, need: int, out: list[int]) -> None:
    """Move `need` MB from free to out: home socket first, then the others in order.

    IndexError if the sockets together have less than `need` free.
    """
    got = free[home] if free[home] < need else need
    free[home] -= got
    out[home] += got
    need -= got
    for i in range(len(free)):
        if not need:
            return
        if i != home and free[i]:
            got = free[i] if free[i] < need else need
            free[i] -= got
            out[i] += got
            need -= got
    if need:
        raise IndexError("not enough memory")
