"""Whole lines per task stream: what a task writes leaves the worker a line at a time (protocol.md §2.5 `out`).

Tasks that write unbuffered (`PYTHONUNBUFFERED=1`, `printf` + `fflush`, several MPI ranks) hand the pipe a
line in pieces; forwarded as read, the pieces of different tasks interleave mid-line at the client.  Holding
each (task, stream)'s bytes until a newline keeps every line whole.  A partial line still leaves when its task
ends, when it grows past `LINE_MAX` (a binary stream, a huge line), or once it waited `LINE_WAIT` seconds (a
prompt, a progress bar), so nothing is held back for long.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Key = tuple[int, int]
Emit = Callable[[Key, str, bytes], None]

LINE_MAX = 64 * 1024
LINE_WAIT = 0.25


class LineBuffers:
    """Per (task, stream) line assembly; `emit` receives whole lines, or a partial line on a flush rule."""

    def __init__(self, emit: Emit, wait: float = LINE_WAIT, limit: int = LINE_MAX) -> None:
        self._emit = emit
        self._wait = wait
        self._limit = limit
        # (task key, stream) -> the unfinished line, and the monotonic time it started waiting.
        self._partial: dict[tuple[Key, str], tuple[bytes, float]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def feed(self, key: Key, stream: str, data: bytes) -> None:
        slot = (key, stream)
        held = self._partial.pop(slot, None)
        if held is not None:
            data = held[0] + data
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > self._limit:
            cut = len(data)
        if cut:
            self._emit(key, stream, data[:cut])
        if cut < len(data):
            # A line that was already waiting keeps its age; a new partial line starts waiting now.
            since = held[1] if held is not None and cut == 0 else time.monotonic()
            self._partial[slot] = (data[cut:], since)
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._wait, self._expire)

    def flush(self, key: Key) -> None:
        """The task ended: send what is left of its lines."""
        for stream in ("stdout", "stderr"):
            held = self._partial.pop((key, stream), None)
            if held is not None:
                self._emit(key, stream, held[0])

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        oldest = now
        for slot, (data, since) in list(self._partial.items()):
            if now - since >= self._wait:
                del self._partial[slot]
                self._emit(slot[0], slot[1], data)
            else:
                oldest = min(oldest, since)
        if self._partial:
            delay = max(0.01, oldest + self._wait - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)
