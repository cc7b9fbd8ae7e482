"""Background tasks whose failure ends the broker (issue 10 item 10).

The broker's periodic loops (liveness sweep, time limits, purge, reload, fair share) and its one-off
background work run forever or until done; an exception in one of them must not end it silently, which would
leave the broker up but without liveness detection or time limits.  A failed task logs its traceback and
calls `on_failure`: the broker then leaves as a crash (exitcodes.CRASHED), which Kubernetes and `mc boot`
restart, and the restarted broker resumes from the journal like after a kill -9 (architecture.md#restart).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Supervisor:
    """Owns its tasks (none is collected mid-flight) and reports the first failure."""

    def __init__(self, on_failure: Callable[[str, BaseException], None]) -> None:
        self.on_failure = on_failure
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("%s failed: the broker stops so that it restarts", task.get_name(), exc_info=exc)
            self.on_failure(task.get_name(), exc)

    async def cancel_all(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
