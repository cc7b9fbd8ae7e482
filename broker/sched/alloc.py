"""The result of a match: which core/GPU ids and memory each task gets.

Allocations live in rank 0's memory only.  The journal records just the
ranks of a job's `alloc` event; after a restart the broker rebuilds them
from what the workers report running (walk.rebuild).  Workers receive the
slots of their own tasks in `run` messages.  Task placement is fixed here:
ranks ascending, slots in order, task i gets the i-th slot overall.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, NamedTuple


class Slot(NamedTuple):
    """What one task is bound to on one node.

    NamedTuple rather than a frozen dataclass: one is built per task on the
    matcher's hot path and tuple construction is several times cheaper.
    """

    cores: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    memory_mb: int = 0


_SLOT_CACHE: dict[tuple[tuple[int, ...], tuple[int, ...], int], Slot] = {}
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
                 hint: dict[int, Any] | None = None,
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
    def items(self) -> ItemsView[int, RankAlloc]:
        return self._ranks.items()

    def keys(self) -> KeysView[int]:
        return self._ranks.keys()

    def values(self) -> ValuesView[RankAlloc]:
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
