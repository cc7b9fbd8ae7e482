"""Many file descriptors behind one epoll, which the event loop watches in their stead (worker/executor.py).

asyncio's add_reader costs a handle, a selector key and an epoll_ctl per descriptor, and remove_reader as
much again; the executor watches three per task (its pidfd and two output pipes), so it registers them here
in one epoll_ctl each, and the ready ones of one loop iteration are served in one batch.  Level-triggered,
like add_reader: a callback that leaves data unread is called again on the next iteration.
"""
from __future__ import annotations

import asyncio
import select
from collections.abc import Callable


class FdWatch:
    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._callbacks: dict[int, Callable[[], None]] = {}

    def add(self, fd: int, callback: Callable[[], None]) -> None:
        """Call `callback` whenever `fd` is readable (or hung up), on the running loop, until remove(fd)."""
        if self._epoll is None:
            self._epoll = select.epoll()
            asyncio.get_running_loop().add_reader(self._epoll.fileno(), self._serve)
        self._epoll.register(fd, select.EPOLLIN)
        self._callbacks[fd] = callback

    def __contains__(self, fd: int) -> bool:
        return fd in self._callbacks

    def remove(self, fd: int) -> None:
        """Stop watching `fd`; call before closing it."""
        del self._callbacks[fd]
        assert self._epoll is not None
        self._epoll.unregister(fd)

    def close(self) -> None:
        if self._epoll is not None:
            asyncio.get_running_loop().remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None
        self._callbacks.clear()

    def _serve(self) -> None:
        assert self._epoll is not None
        for fd, _events in self._epoll.poll(0):
            # An earlier callback of this batch may have removed the fd (its number may even be reused by a new
            # one already: the callbacks tolerate a call with nothing to read).
            callback = self._callbacks.get(fd)
            if callback is not None:
                callback()
