"""A Prometheus histogram kept as things happen: fixed buckets, a count and a sum, rendered as exposition text.

Observed from one thread and rendered from another (the journal's writer and the event loop): each update is a
few int and float stores, so a scrape may see an observation in a bucket a moment before it is in `sum`, never a
torn value; Prometheus tolerates that skew.
"""
from __future__ import annotations

import bisect

# Seconds, for a local sqlite commit with a synchronous WAL: sub-millisecond on tmpfs, tens of ms on a slow disk,
# seconds only when something is wrong.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self, bounds: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self, name: str, help_text: str) -> list[str]:
        """`name_bucket{le=...}` (cumulative), `name_sum`, `name_count`, with HELP and TYPE."""
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        counts = list(self.counts)
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            total += n
            out.append(f'{name}_bucket{{le="{_le(bound)}"}} {total}')
        out += [f"{name}_sum {self.sum!r}", f"{name}_count {total}"]
        return out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
