"""Waiting, inside an event loop, for a condition the loop's own work makes true (a test's only sleep)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until_true(check: Callable[[], object], what: str, timeout: float = 10.0, every: float = 0.01) -> None:
    """Poll `check` every `every` s while the loop runs; AssertionError naming `what` after `timeout` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout}s: {what}")
        await asyncio.sleep(every)
