"""Suite-wide settings."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Let tests import helpers as `tests.integration.conftest` etc.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import host

# Every process this session starts inherits the mark, so the session-end check finds the ones that outlived
# their test even when they left our process tree (daemonized, orphaned to PID 1) or run as a guest user.
SESSION_MARK = f"MC_TEST_SESSION={os.getpid()}"
os.environ["MC_TEST_SESSION"] = str(os.getpid())


def pytest_configure(config: pytest.Config) -> None:
    # pytest-asyncio 1.x on Python 3.11: a sync test that touches asyncio before the first async test leaves a
    # default loop behind, which `filterwarnings = error` turns into an "unclosed event loop" failure.
    asyncio.set_event_loop(None)
    # Hypothesis's plugin imports this at the terminal summary, where pytest rewrites it (ast.parse) while the e2e
    # tiers' helper threads may still be parsing too: CPython 3.11's AST builder keeps one recursion count for all
    # threads (gh-106905) and the summary died of "SystemError: AST constructor recursion depth mismatch".
    with contextlib.suppress(ImportError):
        import hypothesis.internal.observability  # noqa: F401
    config.addinivalue_line("markers", "needs(*tools, root=False): host commands (and root) the test needs; without"
                                       " them it is skipped, or fails when CI is set (tests/host.py)")


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        host.need(*mark.args, **mark.kwargs)


def _leftovers() -> set[int]:
    """The live processes this session started, but none of pytest's own."""
    return (host.descendants(os.getpid()) | host.with_environ(SESSION_MARK)) - {os.getpid()}


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the last test (and every other session fixture's teardown: this one is set up first), no process
    that the suite started may still run, and no mount, user, group or network namespace it made may remain.
    Processes that do are named, killed, and fail the run; the other traces are named and fail it.  (Another
    test session on the same host at the same time can make users or namespaces this one then names.)"""
    base = tmp_path_factory.getbasetemp()
    before = host.traces(base)
    yield
    deadline = time.monotonic() + 5  # a process just signalled by a teardown may need a moment to exit
    while (left := _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    found = [f"process {pid} {host.cmdline(pid)}" for pid in sorted(left)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    after = host.traces(base)
    found += [f"{kind} {name}" for kind in after for name in sorted(after[kind] - before[kind])]
    if found:
        pytest.fail("the test session left behind (processes now killed):\n  " + "\n  ".join(found), pytrace=False)


# The tiers (CONTRIBUTING.md#test-tiers). The fast tier, `-m 'not slow and not apiserver'`, is the unit tests plus the
# real-process tests marked `smoke`; every other test that starts processes or runs the operator is `slow`.
# `pytest` with no -m, as .ci/run calls it, runs every tier but the pod-level one and the soak test (pyproject's
# addopts), which .ci/run runs next with `pytest -m 'e2e or soak'`.
_REAL_PROCESS_TIERS = ("tests/integration/", "tests/e2e/", "tests/operator/test_operator_kmock.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    for item in items:
        if not item.path.resolve().is_relative_to(root):
            continue  # a test file of a session started by a test (test_session_check)
        where = item.path.resolve().relative_to(root).as_posix()
        if where.startswith(_REAL_PROCESS_TIERS) and item.get_closest_marker("smoke") is None:
            item.add_marker(pytest.mark.slow)
