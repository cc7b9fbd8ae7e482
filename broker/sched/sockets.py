"""A socket vertex's state (SocketState: its free and total core and GPU id-sets and memory) and a Hold, what one
allocation took from one node, per socket. Below both the node state (state.py) and the carving of ids
(carve.py), which read and take them.
"""

from __future__ import annotations

from . import idset

# Hold = (core mask per socket, gpu mask per socket, memory MB per socket)
Hold = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


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


def hold_ids(hold: Hold) -> tuple[set[int], set[int], int]:
    """Core ids, GPU ids and memory of a hold, socket-independent."""
    cores, gpus, mems = hold
    return ({i for m in cores for i in idset.iter_ascending(m)},
            {i for m in gpus for i in idset.iter_ascending(m)}, sum(mems))
