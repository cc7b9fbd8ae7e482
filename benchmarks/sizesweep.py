"""What the size-sweep benchmarks (user_array.py, report.py) share: sizes from the command line, runs that take
the sizes in turn with the order rotating run by run (so the machine's load moves every size alike), and the
machine's load around the whole sweep in the JSON."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from typing import Any


def sizes_of(parser: argparse.ArgumentParser, text: str, runs: int) -> list[int]:
    sizes = sorted({int(s) for s in text.split(",")})
    if runs < 1 or not sizes or sizes[0] < 1:
        parser.error("--runs and every size must be at least 1")
    return sizes


def in_turns(sizes: list[int], runs: int) -> Iterator[tuple[int, int]]:
    """(run, size) for every run of every size; run i starts at the i-th size."""
    for i in range(runs):
        for n in sizes[i % len(sizes):] + sizes[:i % len(sizes)]:
            yield i, n


def on_this_machine(sweep: Callable[[], dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The sweep's results, with the CPU count and the load average before and after it."""
    machine = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]}
    results = {"machine": machine, **extra, **sweep()}
    machine["loadavg_end"] = os.getloadavg()[0]
    return results
