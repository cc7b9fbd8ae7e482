"""FakeClock: a monotonic clock that moves only when a test advances it (in the spirit of trio's MockClock).

Code under test takes its time as an argument or a callable (`now`, `clock=`); hand it this clock, or
`clock()`'s values, and every timeout, deadline and liveness rule becomes a plain function of the steps taken.
"""
from __future__ import annotations


class FakeClock:
    """Seconds as a float, starting at `start`; never goes backwards."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (>= 0); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds} s)")
        self._now += seconds
        return self._now

    def __repr__(self) -> str:
        return f"FakeClock({self._now})"
