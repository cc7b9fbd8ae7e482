"""A rank's link up the tree (protocol.md §2.1, §2.4.1): one DEALER to its parent, moved one level up when the
parent is lost and back to the tree parent on `home`.

The real worker's overlay and the rank simulator's leaves (minicluster/testing/ranksim.py) both link up through
this class, so simulated ranks heal as real ones do.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from minicluster.config import InstanceConfig
from minicluster.overlay import curve
from minicluster.overlay.sockets import Sender, drain_then_cancel, set_common_options
from minicluster.proto import envelope, topology
from minicluster.proto.envelope import Message

log = logging.getLogger(__name__)

# The transport's own kinds (§2.4.1): handled by the overlay, never passed to the broker or worker.
ATTACH, HOME = "attach", "home"

# Reads one DEALER until it is closed or the task cancelled.
Receive = Callable[[zmq.asyncio.Socket], Coroutine[Any, Any, None]]


class Uplink:
    """The DEALER to the rank this one is linked to (`parent`), and the rule that moves it.

    `home` is the tree parent (§2.1). A link that has been down for `patience` seconds counts as a lost parent
    once this rank has been linked to its tree parent at all; until then it waits, as the cluster's start order is
    not a loss.
    """

    def __init__(self, ctx: zmq.asyncio.Context, config: InstanceConfig, rank: int, cert: curve.Certificate,
                 receive: Receive) -> None:
        home = topology.parent(rank, config.fanout)
        if home is None:
            raise ValueError("rank 0 has no parent to link to")
        self.home = self.parent = home
        self.rank = rank
        self.moves = 0
        self._ctx = ctx
        self._config = config
        self._cert = cert
        self._receive = receive
        self._patience = 2 * min(config.heartbeat_interval, 1.0)
        self._was_home = False
        self._sender: Sender | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._dropped_before = 0  # by the DEALERs closed in moves
        self._closing = False

    @property
    def dropped(self) -> int:
        return self._dropped_before + (self._sender.dropped if self._sender is not None else 0)

    def start(self) -> None:
        self._link_to(self.home)

    def send(self, frames: list[bytes]) -> None:
        if self._sender is None:
            raise RuntimeError("the uplink is not started: call start() first")
        self._sender.send(frames)

    def go_home(self) -> None:
        """The tree parent is back (rank 0's `home`): link to it again, unless linked to it already."""
        if self.parent != self.home:
            log.warning("rank %d: rank %d is back; linking to it again", self.rank, self.home)
            self.moves += 1
            self._link_to(self.home)

    async def close(self) -> None:
        self._closing = True
        try:
            await drain_then_cancel(self._sender, self._tasks)
        finally:
            # Also when the close itself is cancelled (a second SIGTERM while draining): a link watch left
            # running would move this closed uplink once its parent's link is down, on a socket its context
            # closed since (seen at 10,000 simulated ranks, which share one context per process).
            for task in self._tasks:
                task.cancel()
            if self._sender is not None and not self._sender.sock.closed:  # closed by a close before
                self._sender.sock.disable_monitor()
                # A short linger lets the last messages (results, the answer to a shutdown) leave.
                self._sender.sock.close(linger=200)

    def _make_dealer(self) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, str(self.rank).encode())
        set_common_options(sock)
        # Short, capped reconnect backoff: a parent that comes back is rejoined within a second.
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        # A stopped or cut-off parent is noticed from these (§2.4.1); libzmq's I/O thread answers them, so a rank
        # whose event loop is busy is not taken for lost. Not shorter: a dropped connection loses what the parent
        # had in flight on it, and a parent stopped for a second (a test's SIGSTOP of rank 0) must not cost that.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        # A replaced parent pod has a new IP, and a connect to the old one may get no answer at all (its network
        # namespace is gone): give up after 2 s and resolve the name again, instead of the kernel's ~2 min SYN
        # retries (seen in tests/e2e as workers rejoining a new broker 70 s late).
        sock.setsockopt(zmq.CONNECT_TIMEOUT, 2000)
        curve.make_client(sock, self._cert)
        return sock

    def _link_to(self, parent: int) -> None:
        """Open a DEALER to `parent` and close the one before. A fresh socket, so that its monitor's events are
        about this parent only: libzmq names a reconnected peer by its resolved address, not by our endpoint."""
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._sender is not None:
            self._dropped_before += self._sender.dropped
            self._sender.sock.disable_monitor()
            self._sender.sock.close(linger=0)
        dealer = self._make_dealer()
        # The monitor first: a handshake it did not see would leave this link waiting for one forever.
        monitor = dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        dealer.connect(self._config.endpoint_of(parent))
        self.parent = parent
        self._sender = Sender(dealer, "dealer")
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._receive(dealer)), loop.create_task(self._watch(monitor, parent))]

    async def _watch(self, monitor: zmq.asyncio.Socket, parent: int) -> None:
        """Follow the link to `parent`; once it has been down for the patience, move one level up."""
        loop = asyncio.get_running_loop()
        linked, deadline = False, loop.time() + self._patience
        try:
            while True:
                # Rank 0 is never left: there is nothing above it, and a fresh socket would drop what waits in
                # this one's queue for it (results, output: protocol.md §2.6) while it is down or stopped.
                waits = linked or not self._was_home or parent == 0
                try:
                    async with asyncio.timeout(None if waits else max(0.0, deadline - loop.time())):
                        event = parse_monitor_message(await monitor.recv_multipart())["event"]
                except TimeoutError:
                    if not self._closing:
                        self._move_up(parent)
                    return
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    linked = True
                    self._was_home = self._was_home or parent == self.home
                    if parent != self.home:
                        self.send([envelope.encode(Message(ATTACH, self.rank, parent, {}))])
                elif event == zmq.EVENT_DISCONNECTED and linked:
                    linked, deadline = False, loop.time() + self._patience
        finally:
            monitor.close(linger=0)

    def _move_up(self, lost: int) -> None:
        above = topology.parent(lost, self._config.fanout)
        assert above is not None, "rank 0 is never left"
        log.warning("rank %d: no link to rank %d for %.1f s; linking to rank %d", self.rank, lost, self._patience,
                    above)
        self.moves += 1
        self._link_to(above)
