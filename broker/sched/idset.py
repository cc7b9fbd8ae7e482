"""Integer id-sets held as Python int bitmasks, and their compact text form.

The matcher keeps free cores/GPUs of a socket, and index sets of nodes, as
bitmasks: set algebra then runs in C and a 64-core socket costs one small
int.  This module is the only place that knows the bit tricks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def to_mask(ids: Iterable[int]) -> int:
    """Bitmask with bit i set for every id i (ids must be >= 0)."""
    mask = 0
    for i in ids:
        if i < 0:
            raise ValueError(f"negative id {i} cannot be held in an id-set")
        mask |= 1 << i
    return mask


def ids_of(mask: int) -> tuple[int, ...]:
    """Ascending tuple of the ids set in mask."""
    return tuple(iter_ascending(mask))


def lowest(mask: int, count: int) -> tuple[tuple[int, ...], int]:
    """Take the `count` lowest ids of mask: returns (ids, mask of those ids)."""
    taken: list[int] = []
    picked = 0
    while count and mask:
        low = mask & -mask
        mask ^= low
        picked |= low
        taken.append(low.bit_length() - 1)
        count -= 1
    return tuple(taken), picked


def runs(mask: int) -> Iterator[range]:
    """The runs of consecutive ids set in mask, lowest first: a whole free node is one step, not one per id."""
    base = 0
    while mask:
        low = (mask & -mask).bit_length() - 1
        mask >>= low
        length = (~mask & (mask + 1)).bit_length() - 1
        yield range(base + low, base + low + length)
        mask >>= length
        base += low + length


def iter_ascending(mask: int) -> Iterator[int]:
    """Yield the set bit positions of mask, lowest first.

    Repeated `mask & -mask` on a 16k-bit int copies the whole int per step;
    scanning the reversed binary string with str.find stays in C instead.
    """
    if not mask:
        return
    # Callers usually want only the first hit: get it without building a string.
    low = mask & -mask
    yield low.bit_length() - 1
    mask ^= low
    if not mask:
        return
    bits = bin(mask)[:1:-1]
    pos = bits.find("1")
    while pos >= 0:
        yield pos
        pos = bits.find("1", pos + 1)


def iter_descending(mask: int) -> Iterator[int]:
    """Yield the set bit positions of mask, highest first."""
    if not mask:
        return
    bits = bin(mask)[:1:-1]
    pos = bits.rfind("1")
    while pos >= 0:
        yield pos
        pos = bits.rfind("1", 0, pos)
