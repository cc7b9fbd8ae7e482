"""How a worker repeats a `join` that is not answered yet (protocol.md §2.6), so that a rank 0 that falls behind
in a join storm is not sent more joins the further behind it is."""
from __future__ import annotations

import random
from collections.abc import Callable

JOIN_REPEAT_FIRST = 0.2  # seconds: a small instance still joins at once
JOIN_REPEAT_CAP = 5.0  # seconds: a waiting rank then costs rank 0 no more than a heartbeating one


class Backoff:
    """The waits between repeats: the n-th (n = 0, 1, ...) is min(cap, first·2ⁿ) times a factor drawn uniformly
    from [½, 1), so ranks that started together drift apart instead of repeating in step."""

    def __init__(self, first: float = JOIN_REPEAT_FIRST, cap: float = JOIN_REPEAT_CAP,
                 uniform: Callable[[], float] = random.random) -> None:
        self.first = first
        self.cap = cap
        self._uniform = uniform
        self._base = first

    def reset(self) -> None:
        self._base = self.first

    def next_wait(self) -> float:
        wait = self._base * (0.5 + 0.5 * self._uniform())
        self._base = min(self.cap, self._base * 2)
        return wait
