"""Checkouts compared side by side (benchmarks/trees_cpu.py, spawn_cpu.py --trees).

Each run of each tree is a fresh interpreter whose PYTHONPATH is that tree, started in a scratch directory so
that the tree decides which minicluster the ranks run. The trees take turns run by run, starting one later each
round, and ratios are taken run by run: the machine may be shared, and its load moves between runs.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

Run = dict[str, dict[str, float]]  # group (a case, a mode) -> figure -> value


def parse_trees(spec: str) -> dict[str, str]:
    """`name=DIR,name=DIR` -> {name: DIR}; the first is the base of the ratios."""
    return dict(item.split("=", 1) for item in spec.split(","))


def interleave(trees: dict[str, str], runs: int, argv: Callable[[str, int], list[str]],
               parse: Callable[[str], Run]) -> dict[str, Any]:
    """Run `argv(name, i)` under each tree `runs` times, interleaved; `parse` reads a run's stdout."""
    names = list(trees)
    results: dict[str, list[Run]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(trees[name]))
            out = subprocess.run([sys.executable, *argv(name, i)], env=env, cwd=tempfile.gettempdir(),
                                 capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
            results[name].append(parse(out.stdout))
            print(f"run {i + 1}/{runs} {name}: {json.dumps(results[name][-1])}", file=sys.stderr, flush=True)
    return summarize(trees, results)


def summarize(trees: dict[str, str], runs: dict[str, list[Run]]) -> dict[str, Any]:
    """Medians per tree, and each later tree's run-by-run ratios over the first tree's."""
    names = list(trees)
    first = names[0]
    groups = list(runs[first][0])
    result: dict[str, Any] = {"trees": trees, "runs": runs, "median": {}}
    for name in names:
        result["median"][name] = {group: {k: statistics.median(r[group][k] for r in runs[name])
                                          for k in runs[name][0][group]} for group in groups}
    for name in names[1:]:
        result[f"ratio_{name}_over_{first}"] = {group: {k: statistics.median(
            b[group][k] / a[group][k] for a, b in zip(runs[first], runs[name], strict=True))
            for k in runs[first][0][group]} for group in groups}
    return result
