"""k-ary tree arithmetic for the overlay (protocol.md §2.1). No I/O."""
from __future__ import annotations


def parent(rank: int, fanout: int) -> int | None:
    return None if rank == 0 else (rank - 1) // fanout


def children(rank: int, fanout: int, tree_size: int) -> range:
    first = rank * fanout + 1
    return range(min(first, tree_size), min(first + fanout, tree_size))


def next_hop(rank: int, dst: int, fanout: int) -> int | None:
    """The child of `rank` whose subtree holds `dst`, or None when `dst` is not below `rank`."""
    if dst <= rank:
        return None
    while dst > rank:
        up = (dst - 1) // fanout
        if up == rank:
            return dst
        dst = up
    return None

