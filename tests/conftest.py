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
