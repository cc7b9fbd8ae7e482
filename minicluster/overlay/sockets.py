"""What the overlay's ROUTER and DEALER sockets share: their options, and sending without blocking the event
loop while counting what is dropped (protocol.md §2.4)."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from typing import Any, cast

import zmq
import zmq.asyncio

from minicluster.proto import envelope

log = logging.getLogger(__name__)


@functools.cache
def ipv6_available() -> bool:
    """Whether this host can open IPv6 sockets (some nodes boot with IPv6 disabled)."""
    if not socket.has_ipv6:
        return False
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


def set_common_options(sock: zmq.asyncio.Socket) -> None:
    """Options of every overlay socket: no linger, deep queues, frames bounded as §2.3 bounds them, and IPv6
    where the host has it (without it libzmq resolves names to IPv4 only, and an IPv6-only cluster never
    connects)."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.setsockopt(zmq.MAXMSGSIZE, envelope.MAX_FRAME)
    sock.setsockopt(zmq.IPV6, ipv6_available())


class Sender:
    """Sends through zmq.asyncio, which tries at once and queues behind EAGAIN in order.

    All sends must go through the asyncio socket: a send on a shadow socket can consume the edge-triggered
    ZMQ_FD wake-up that the asyncio receiver waits for, stalling reception (seen here under load).
    """

    def __init__(self, sock: zmq.asyncio.Socket, name: str) -> None:
        self.sock = sock
        self.name = name
        self.pending = 0
        self.dropped = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def send(self, frames: list[bytes], fallback: bool = False) -> bool:
        """Send or queue `frames`. With `fallback`, a peer that is not connected makes this return False instead of
        counting a drop, so the caller can take another way."""
        # copy=True: zero-copy sends route every frame through pyzmq's gc thread, ~100x slower for our sizes.
        # zmq.asyncio returns a Future; its stubs say only Awaitable.
        fut = cast("asyncio.Future[Any]", self.sock.send_multipart(frames))
        if fut.done():
            if fallback and not fut.cancelled() and fut.exception() is not None:
                return False
            self._sent(fut, counted=False)
            return True
        self.pending += 1
        self._idle.clear()
        fut.add_done_callback(self._sent)
        return True

    def _sent(self, fut: asyncio.Future[Any], counted: bool = True) -> None:
        if counted:
            self.pending -= 1
            if not self.pending:
                self._idle.set()
        exc = None if fut.cancelled() else fut.exception()
        if exc is not None:
            # EHOSTUNREACH: the child is not connected; §2.4 makes delivery best effort.
            self.dropped += 1
            log.debug("%s: dropped a message: %s", self.name, exc)

    async def drained(self) -> None:
        await self._idle.wait()


async def drain_then_cancel(sender: Sender | None, tasks: list[asyncio.Task[None]]) -> None:
    """Give what `sender` queued up to a second to leave, then end `tasks` (its socket's readers)."""
    if sender is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sender.drained(), 1.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
