"""Which task each element of an array job stands for, once that is not simply element i = task i. Pure.

An array's elements are numbered as they are queued: first its tasks in order, then the tasks queued again
(retries), each under a new element number. After a restart the tasks still to run are queued again too: a few
ids below the highest one that ever ran, then every task above it. A `TaskMap` keeps such a mapping as runs of
task ids, a `range` for a contiguous run, however long, and an `array("I")` for single ids, so a restarted
10^8-element array costs a few runs, not 400 MB built one element at a time while the broker stands still.
"""
from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterable, Iterator


class TaskMap:
    __slots__ = ("_runs", "_starts")

    def __init__(self, runs: Iterable[range | array[int]] = ()) -> None:
        self._runs = [run for run in runs if len(run)]
        self._index()

    def _index(self) -> None:
        # _starts[k]: the element number of run k's first task; its last entry is the length.
        self._starts = list(itertools.accumulate((len(run) for run in self._runs), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._runs)

    def __getitem__(self, element: int) -> int:
        if element < 0:
            element += len(self)
        if not 0 <= element < len(self):
            raise IndexError(f"element {element} of {len(self)}")
        k = bisect.bisect_right(self._starts, element) - 1
        return self._runs[k][element - self._starts[k]]

    def head(self, count: int) -> TaskMap:
        """The first `count` elements."""
        return TaskMap(run[:max(0, count - first)] for run, first in zip(self._runs, self._starts[:-1], strict=True))

    def tail(self, start: int) -> list[int]:
        """The tasks of the elements from `start` on."""
        return [task for run, first in zip(self._runs, self._starts[:-1], strict=True)
                for task in run[max(0, start - first):]]

    def extend(self, tasks: Iterable[int]) -> None:
        """Number `tasks` after the last element."""
        more = array("I", tasks)
        if not more:
            return
        if self._runs and isinstance(self._runs[-1], array):
            self._runs[-1].extend(more)
        else:
            self._runs.append(more)
        self._index()
