"""Suite-wide settings."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

# Let tests import helpers as `tests.integration.conftest` etc.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pytest_configure(config: pytest.Config) -> None:
    # pytest-asyncio 1.x on Python 3.11: a sync test that touches asyncio before the first async test leaves a
    # default loop behind, which `filterwarnings = error` turns into an "unclosed event loop" failure.
    asyncio.set_event_loop(None)


# The tiers (CONTRIBUTING.md#tiers). The fast tier, `-m 'not slow and not apiserver'`, is the unit tests plus the
# real-process tests marked `smoke`; every other test that starts processes or runs the operator is `slow`.
# `pytest` with no -m, as .ci/run calls it, runs every tier but the pod-level one and the soak test (pyproject's
# addopts), which .ci/run runs next with `pytest -m 'e2e or soak'`.
_REAL_PROCESS_TIERS = ("tests/integration/", "tests/e2e/", "tests/operator/test_operator_kmock.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    for item in items:
        where = item.path.resolve().relative_to(root).as_posix()
        if where.startswith(_REAL_PROCESS_TIERS) and item.get_closest_marker("smoke") is None:
            item.add_marker(pytest.mark.slow)
