"""Tasks' standard input fed from the client (protocol.md §3.8; overlay `stdin` / `stdin-ack`, §2.5).

A task whose job asked for it gets a pipe as fd 0; the worker keeps the write end, non-blocking, and writes what
rank 0 relays.  Each chunk's callback fires once it is in the pipe, or the task no longer reads (ended, closed
its stdin): that is what the `stdin-ack` waits for, so a slow reader slows the client down instead of growing
this process.
"""
from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable

Key = tuple[int, int]
Done = Callable[[bool], None]  # called with True if the task still reads its stdin


class _Pipe:
    __slots__ = ("fd", "pending", "eof", "watched")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: deque[tuple[memoryview, Done]] = deque()
        self.eof = False
        self.watched = False


class StdinPipes:
    def __init__(self) -> None:
        self._pipes: dict[Key, _Pipe] = {}

    def open(self, key: Key) -> int:
        """Make task `key`'s stdin pipe; returns the read end for the child, which the caller closes after spawning."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        self._pipes[key] = _Pipe(write_end)
        return read_end

    def write(self, key: Key, data: bytes, eof: bool, done: Done) -> None:
        """Queue `data` (then end-of-file if `eof`) for the task; `done` tells when it is written."""
        pipe = self._pipes.get(key)
        if pipe is None or pipe.eof:
            done(False)
            return
        pipe.pending.append((memoryview(data), done))
        pipe.eof = eof
        self._pump(key, pipe)

    def close(self, key: Key) -> None:
        """The task ended: nothing more reaches it."""
        pipe = self._pipes.pop(key, None)
        if pipe is not None:
            self._drop(pipe)

    def close_all(self) -> None:
        """End every task's input (rank 0 restarted: nobody relays the rest)."""
        for key in list(self._pipes):
            self.close(key)

    def _pump(self, key: Key, pipe: _Pipe) -> None:
        while pipe.pending:
            data, done = pipe.pending[0]
            try:
                written = os.write(pipe.fd, data) if data else 0
            except BlockingIOError:
                self._watch(key, pipe, True)
                return
            except OSError:  # EPIPE: the task closed its stdin
                self._pipes.pop(key, None)
                self._drop(pipe)
                return
            if written < len(data):
                pipe.pending[0] = (data[written:], done)
                continue
            pipe.pending.popleft()
            done(True)
        self._watch(key, pipe, False)
        if pipe.eof:
            # Everything is written: close the write end, the task reads end-of-file.
            self._pipes.pop(key, None)
            self._drop(pipe)

    def _watch(self, key: Key, pipe: _Pipe, on: bool) -> None:
        if on == pipe.watched:
            return
        loop = asyncio.get_running_loop()
        if on:
            loop.add_writer(pipe.fd, self._pump, key, pipe)
        else:
            loop.remove_writer(pipe.fd)
        pipe.watched = on

    def _drop(self, pipe: _Pipe) -> None:
        if pipe.watched:
            asyncio.get_running_loop().remove_writer(pipe.fd)
            pipe.watched = False
        os.close(pipe.fd)
        while pipe.pending:
            pipe.pending.popleft()[1](False)
