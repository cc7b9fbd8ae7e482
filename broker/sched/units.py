"""Slots bound to sockets: capacity and carving below the node vertex.

Two request forms (request.py): `socket[s]>slot[k]>{...}` makes a unit of s
sockets of one node with k slots each, every slot's cores, GPUs and memory
on its socket; `slot>socket[1]>{...}` makes every slot a unit that lies
within one socket (GPU affinity).  socket_exclusive holds the chosen
sockets whole, so they must be idle.  Sockets are chosen best fit (fewest
free cores first, then socket order), ids lowest first, like flat slots.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import idset
from .alloc import Slot, make_slot
from .request import Request
from .sockets import Hold
from .state import NodeState

SocketFree = tuple[int, int, int, bool]  # free cores, GPUs, MB, idle


def live(node: NodeState) -> list[SocketFree]:
    return [(s.cores_free.bit_count(), s.gpus_free.bit_count(), s.mem_free, s.is_idle())
            for s in node.sockets]


def capacity(sockets: Iterable[SocketFree], req: Request) -> int:
    """How many units fit in sockets with these free counts (live, or totals for feasibility)."""
    c, g, m, excl = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot, req.socket_exclusive
    if req.socket_slots:
        k = req.socket_slots
        able = sum(1 for fc, fg, fm, idle in sockets
                   if fc >= k * c and fg >= k * g and fm >= k * m and (idle or not excl))
        return able // req.sockets
    total = 0
    for fc, fg, fm, idle in sockets:
        if excl and not idle:
            continue
        fit = fc // c
        if g:
            fit = min(fit, fg // g)
        if m:
            fit = min(fit, fm // m)
        total += min(fit, 1) if excl else fit
    return total


def node_capacity(node: NodeState, req: Request) -> int:
    return capacity(live(node), req)


def carve(node: NodeState, req: Request, units: int) -> tuple[tuple[Slot, ...], Hold,
                                                             tuple[int, ...]]:
    """Ids for `units` units on node: (slots, hold, ids of sockets held whole).

    units must not exceed node_capacity(node, req).
    """
    socks = node.sockets
    n = len(socks)
    c, g, m = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    if req.socket_slots:
        per_socket = dict.fromkeys(_pick_sockets(node, req, units * req.sockets), req.socket_slots)
    else:  # successive picks stay on one socket until it is full: group them
        per_socket = {}
        for i in _pick_slot_sockets(node, req, units):
            per_socket[i] = per_socket.get(i, 0) + 1
    cores, gpus, mems = [0] * n, [0] * n, [0] * n
    slots: list[Slot] = []
    for i, k in per_socket.items():
        sock = socks[i]
        core_ids, cores[i] = idset.lowest(sock.cores_free, k * c)
        gpu_ids, gpus[i] = idset.lowest(sock.gpus_free, k * g)
        mems[i] = k * m
        slots += [make_slot(core_ids[j * c:(j + 1) * c], gpu_ids[j * g:(j + 1) * g], m)
                  for j in range(k)]
        if req.socket_exclusive:  # held whole
            cores[i], gpus[i], mems[i] = sock.cores_free, sock.gpus_free, sock.mem_free
    whole = tuple(socks[i].index for i in sorted(per_socket)) if req.socket_exclusive else ()
    return tuple(slots), (tuple(cores), tuple(gpus), tuple(mems)), whole


def _best_fit(node: NodeState, able: list[int]) -> list[int]:
    socks = node.sockets
    return sorted(able, key=lambda i: (socks[i].cores_free.bit_count(), i))


def _pick_sockets(node: NodeState, req: Request, count: int) -> list[int]:
    """`count` sockets that each hold socket_slots slots, best fit first."""
    k = req.socket_slots
    c, g, m = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    able = [i for i, (fc, fg, fm, idle) in enumerate(live(node))
            if fc >= k * c and fg >= k * g and fm >= k * m and (idle or not req.socket_exclusive)]
    return _best_fit(node, able)[:count]


def _pick_slot_sockets(node: NodeState, req: Request, count: int) -> list[int]:
    """The socket of each of `count` slots that lie within one socket.

    Each slot goes to the fullest socket that still holds one (sequentially,
    like flat slots); exclusive: one idle socket per slot.
    """
    now = live(node)
    free = [list(f[:3]) for f in now]
    idle = [f[3] for f in now]
    c, g, m = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    picks: list[int] = []
    for _ in range(count):
        able = [i for i, (fc, fg, fm) in enumerate(free)
                if fc >= c and fg >= g and fm >= m and (idle[i] or not req.socket_exclusive)]
        i = min(able, key=lambda j: (free[j][0], j))
        picks.append(i)
        free[i][0] -= c
        free[i][1] -= g
        free[i][2] -= m
        if req.socket_exclusive:
            idle[i] = False
    return picks
