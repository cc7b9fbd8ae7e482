"""Id-sets: "1-5,8,10-20:5" (protocol.md §1). Compact ranges, never expanded eagerly."""
from __future__ import annotations

from bisect import bisect_right

from minicluster.model.text import brief

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    # collections.abc imports collections (operator, keyword, reprlib): mc-submit parses idsets (--cc)
    from collections.abc import Iterable, Iterator

MAX_IDSET_SIZE = 100_000_000
# Ids travel as msgpack ints and are stored in sqlite: signed 64-bit.
MAX_ID = (1 << 63) - 1


class IdSetError(ValueError):
    pass


class IdSet:
    """An immutable ordered set of non-negative ints held as (start, stop, step) ranges."""

    __slots__ = ("_ranges", "_offsets", "_len")

    def __init__(self, ranges: Iterable[range] = ()) -> None:
        self._ranges = tuple(r for r in ranges if len(r))
        offsets, total = [], 0
        for r in self._ranges:
            offsets.append(total)
            total += len(r)
        self._offsets = offsets
        self._len = total

    @classmethod
    def parse(cls, text: str) -> IdSet:
        if not text or text.strip() != text:
            raise IdSetError(f"bad idset {brief(text)}: expected items like 1-5,8,10-20:5")
        ranges = [_parse_item(item, text) for item in text.split(",")]
        ranges.sort(key=lambda r: r.start)
        seen = -1
        for r in ranges:
            if r.start <= seen:
                raise IdSetError(f"bad idset {brief(text)}: items overlap or repeat")
            seen = r[-1]
        out = cls(ranges)
        if len(out) > MAX_IDSET_SIZE:
            raise IdSetError(f"idset {brief(text)} has {len(out)} ids, more than {MAX_IDSET_SIZE}")
        return out

    @classmethod
    def from_ints(cls, ids: Iterable[int]) -> IdSet:
        ranges: list[range] = []
        ordered = sorted(set(ids))
        if ordered:
            start = prev = ordered[0]
            for i in ordered[1:]:
                if i != prev + 1:
                    ranges.append(range(start, prev + 1))
                    start = i
                prev = i
            ranges.append(range(start, prev + 1))
        return cls(ranges)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        for r in self._ranges:
            yield from r

    def __getitem__(self, ordinal: int) -> int:
        """The ordinal-th id, in O(log ranges): arrays use it to expand lazily."""
        if not 0 <= ordinal < self._len:
            raise IndexError(ordinal)
        i = bisect_right(self._offsets, ordinal) - 1
        return self._ranges[i][ordinal - self._offsets[i]]

    def ordinal(self, value: int) -> int:
        """Position of `value` in the set; ValueError when absent."""
        for offset, r in zip(self._offsets, self._ranges, strict=True):
            if value in r:
                return offset + r.index(value)
        raise ValueError(f"{value} is not in {self}")

    def __contains__(self, value: object) -> bool:
        return any(value in r for r in self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdSet) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        parts = []
        for r in self._ranges:
            if len(r) == 1:
                parts.append(str(r.start))
            elif r.step == 1:
                parts.append(f"{r.start}-{r[-1]}")
            else:
                parts.append(f"{r.start}-{r[-1]}:{r.step}")
        return ",".join(parts)

    def __repr__(self) -> str:
        return f"IdSet({str(self)!r})"


def _parse_item(item: str, text: str) -> range:
    try:
        body, _, step_text = item.partition(":")
        step = int(step_text) if step_text else 1
        lo_text, dash, hi_text = body.partition("-")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
    except ValueError:
        raise IdSetError(f"bad idset {brief(text)}: cannot read item {brief(item)}") from None
    if lo < 0 or hi < lo or step < 1:
        raise IdSetError(f"bad idset {brief(text)}: item {brief(item)} must be N, A-B or A-B:S with 0 <= A <= B, "
                         "S >= 1")
    if hi > MAX_ID:
        raise IdSetError(f"bad idset {brief(text)}: ids go up to {MAX_ID}")
    if (hi - lo) // step >= MAX_IDSET_SIZE:
        raise IdSetError(f"idset {brief(text)} has more than {MAX_IDSET_SIZE} ids")
    return range(lo, hi + 1, step)
