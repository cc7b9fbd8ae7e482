"""Waiting for a condition in the tier's tests and fixtures."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(check: Callable[[], Any], timeout: float = 60.0, every: float = 0.3) -> Any:
    """`await check()` until it returns something true, and return that; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s; last seen: {last!r}")
        await asyncio.sleep(every)
