"""The result of a match: which core/GPU ids and memory each task gets.

Allocations cross process boundaries (broker journal, worker task binding),
so they round-trip through plain lists/dicts with to_wire()/from_wire().
Task placement is fixed here: ranks ascending, slots in order, task i gets
the i-th slot overall.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple


class Slot(NamedTuple):
    """What one task is bound to on one node.

    NamedTuple rather than a frozen dataclass: one is built per task on the
    matcher's hot path and tuple construction is several times cheaper.
    """

    cores: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    memory_mb: int = 0


_SLOT_CACHE: dict[tuple, Slot] = {}
_SLOT_CACHE_MAX = 1 << 16


def make_slot(cores: tuple[int, ...], gpus: tuple[int, ...], memory_mb: int) -> Slot:
    """An interned Slot: equal slots on different nodes share one object.

    A 4096-task job on 64-core nodes has only 64 distinct slots; sharing
    them saves memory and spares the cyclic GC from tracking every one.
    The cache only holds immutable values; it is emptied when it grows big.
    """
    key = (cores, gpus, memory_mb)
    slot = _SLOT_CACHE.get(key)
    if slot is None:
        if len(_SLOT_CACHE) >= _SLOT_CACHE_MAX:
            _SLOT_CACHE.clear()
        slot = _SLOT_CACHE[key] = Slot(cores, gpus, memory_mb)
    return slot


class RankAlloc(NamedTuple):
    """The slots an allocation holds on one rank."""

    slots: tuple[Slot, ...]

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(c for s in self.slots for c in s.cores)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for s in self.slots for g in s.gpus)


class Allocation(Mapping[int, RankAlloc]):
    """Immutable mapping rank -> RankAlloc (ascending ranks), plus exclusivity.

    exclusive=True means every resource of each listed rank is held, not only
    the slots' cores: the worker may still bind tasks to the slot cores.
    `held` names what is held beyond the slots, from tree requests:
    rank -> None for a whole node (ranks of an exclusive rack or zone that
    got no task are only here), or rank -> socket ids held whole.
    """

    __slots__ = ("_ranks", "exclusive", "hint", "_tasks", "held")

    def __init__(self, ranks: Mapping[int, RankAlloc], exclusive: bool = False,
                 hint: dict | None = None,
                 held: Mapping[int, tuple[int, ...] | None] | None = None) -> None:
        self._ranks = dict(ranks) if len(ranks) == 1 else {r: ranks[r] for r in sorted(ranks)}
        self.exclusive = exclusive
        # Set by the matcher: rank -> (node state, hold) so alloc() need not
        # recompute masks core by core.  Not part of equality or the wire form.
        self.hint = hint
        self._tasks: tuple[tuple[int, Slot], ...] | None = None
        self.held = dict(sorted(held.items())) if held else None

    def __getitem__(self, rank: int) -> RankAlloc:
        return self._ranks[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)

    # dict-speed views: the graph walks allocations on every alloc().
    def items(self):  # type: ignore[override]
        return self._ranks.items()

    def keys(self):  # type: ignore[override]
        return self._ranks.keys()

    def values(self):  # type: ignore[override]
        return self._ranks.values()

    def __contains__(self, rank: object) -> bool:
        return rank in self._ranks

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Allocation):
            return NotImplemented
        return (self.exclusive == other.exclusive and self._ranks == other._ranks
                and self.held == other.held)

    def __hash__(self) -> int:
        return hash((self.exclusive, tuple(self._ranks.items())))

    def __repr__(self) -> str:
        held = f", held={self.held!r}" if self.held else ""
        return f"Allocation({self._ranks!r}, exclusive={self.exclusive}{held})"

    def all_ranks(self) -> list[int]:
        """Every rank the allocation holds something on, ascending (tasks or not)."""
        if not self.held:
            return list(self._ranks)
        return sorted(set(self._ranks) | set(self.held))

    def task_slots(self) -> list[tuple[int, Slot]]:
        """(rank, slot) for every task, in task-rank order (a new list)."""
        return list(self.tasks)

    @property
    def tasks(self) -> tuple[tuple[int, Slot], ...]:
        """task_slots() as a tuple, computed once per Allocation (no copy per call).

        Array elements' Allocations are interned (see ResourceGraph.alloc_array),
        so for them this is a lookup.
        """
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = tuple([(r, s) for r, ra in self._ranks.items()
                                         for s in ra.slots])
        return tasks

    @property
    def nslots(self) -> int:
        return sum(len(ra.slots) for ra in self._ranks.values())

    def to_wire(self) -> dict[str, object]:
        """{"exclusive": bool, "ranks": [[rank, [[cores], [gpus], mem], ...], ...]}.

        Plus "held": [[rank, null | [socket ids]], ...] when something is
        held beyond the slots.
        """
        wire: dict[str, object] = {
            "exclusive": self.exclusive,
            "ranks": [
                [rank, [[list(s.cores), list(s.gpus), s.memory_mb] for s in ra.slots]]
                for rank, ra in self._ranks.items()
            ],
        }
        if self.held:
            wire["held"] = [[r, None if s is None else list(s)] for r, s in self.held.items()]
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, object]) -> Allocation:
        try:
            ranks = {
                int(rank): RankAlloc(tuple(
                    Slot(tuple(int(c) for c in cores), tuple(int(g) for g in gpus), int(mem))
                    for cores, gpus, mem in slots))
                for rank, slots in wire["ranks"]  # type: ignore[union-attr]
            }
            held = {int(r): None if s is None else tuple(int(i) for i in s)
                    for r, s in wire.get("held") or ()}  # type: ignore[union-attr]
            return cls(ranks, bool(wire["exclusive"]), held=held)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed allocation on the wire: {exc}") from exc
