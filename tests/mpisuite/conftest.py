"""The mpisuite tier's results: per MPI and launcher, the counts and times of mpi4py's suite, written as JSON to
<pytest's base temp dir>/mpisuite.json and summed up at the end of the terminal report."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

RESULTS = pytest.StashKey[dict[str, Any]]()


@pytest.fixture(scope="session")
def mpisuite_results(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    results: dict[str, Any] = {}
    request.config.stash[RESULTS] = results
    yield results
    path = tmp_path_factory.getbasetemp() / "mpisuite.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    results["_path"] = str(path)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS, None)
    if not results:
        return
    write = terminalreporter.write_line
    terminalreporter.section("mpi4py's suite: 4 ranks on 2 nodes")
    write(f"{'MPI':<16} {'launcher':<9} {'done':<5} {'tests':>6} {'fail':>5} {'err':>4} {'skip':>5} {'seconds':>8} "
          f"{'in tests':>8} {'rank cpu s':>24}  PMI-1 requests")
    for name, result in results.items():
        if name.startswith("_"):
            continue
        for side in ("launcher", "mc"):
            r = result[side]
            cpu = "/".join(str(round(c)) if c is not None else "-" for c in r["rank_cpu_seconds"])
            write(f"{name:<16} {side:<9} {r['completed']!s:<5} {r['tests']!s:>6} {r['failures']:>5} {r['errors']:>4} "
                  f"{r['skips']!s:>5} {r['seconds']:>8} {r['tests_seconds']:>8} {cpu:>24}  "
                  f"{r.get('pmi1_requests', '')}")
            for test in r["failed"]:
                write(f"    failed: {test}")
    write(f"written to {results.get('_path')}")
