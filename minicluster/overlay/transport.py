"""The overlay transport (protocol.md §2.1–2.4): one ROUTER for children, one DEALER to the parent, routing, and
the healing around a lost parent (§2.4.1).

Liveness, joining and everything else with meaning lives in the broker and worker; this module only moves
envelopes between ranks without blocking the event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils.monitor import parse_monitor_message

from minicluster.config import InstanceConfig
from minicluster.overlay import curve
from minicluster.overlay.relay import RELAYED, HeartbeatRelay
from minicluster.proto import envelope, messages, topology
from minicluster.proto.envelope import BadMessage, Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], None]
# Messages read at most in one go once the first is in; then the loop's other work (timers, writes) gets its turn.
RECEIVE_BATCH = 256
# The transport's own kinds (§2.4.1): handled here, never passed to the handler.
ATTACH, HOME = "attach", "home"


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


class _Sender:
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


class Overlay:
    """One rank's view of the tree. `handler` receives every message whose destination is this rank.

    Constructing one opens nothing; `start()` binds the children's ROUTER, connects the DEALER to the parent
    and starts receiving, `close()` undoes it.
    """

    def __init__(self, config: InstanceConfig, rank: int, cert: curve.Certificate, handler: Handler) -> None:
        if not 0 <= rank < config.tree_size:
            raise ValueError(f"rank {rank} is outside 0..{config.tree_size - 1}")
        self.config = config
        self.rank = rank
        self.fanout = config.fanout
        # The tree parent (§2.1) and the rank this one is linked to now; they differ while it is adopted (§2.4.1).
        self.home_parent = topology.parent(rank, self.fanout)
        self.parent = self.home_parent
        self.handler = handler
        self._cert = cert
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: AsyncioAuthenticator | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._down: _Sender | None = None
        self._up: _Sender | None = None
        self._up_tasks: list[asyncio.Task[None]] = []
        self._dropped_before = 0  # by DEALERs closed in a move
        self._was_home = False  # linked to the tree parent once: from then on a lost link is a lost parent
        self._patience = 2 * min(config.heartbeat_interval, 1.0)
        # Ranks below this one, not its children, that linked to it around a lost rank (§2.4.1).
        self.adopted: set[int] = set()
        self.moves = 0
        self.bad_frames = 0
        # An interior rank sends its subtree's heartbeats up together (protocol.md §2.6); made by start().
        self.relay: HeartbeatRelay | None = None

    def _make_router(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, envelope.MAX_FRAME)
        # A restarted child reuses its routing id; let the new connection take over the old one.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        curve.make_server(sock, self._cert)
        sock.setsockopt(zmq.IPV6, ipv6_available())
        for address in self.config.bind_addresses(self.rank):
            sock.bind(address)
        return sock

    def _make_dealer(self, ctx: zmq.asyncio.Context, parent: int) -> zmq.asyncio.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, str(self.rank).encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, envelope.MAX_FRAME)
        # Short, capped reconnect backoff: a parent that comes back is rejoined within a second.
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        # A stopped or cut-off parent is noticed from these (§2.4.1); libzmq's I/O thread answers them, so a rank
        # whose event loop is busy is not taken for lost.
        sock.setsockopt(zmq.HEARTBEAT_IVL, round(1000 * min(self.config.heartbeat_interval, 1.0)))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, round(1000 * min(self.config.unresponsive_after, 3.0)))
        # A replaced parent pod has a new IP, and a connect to the old one may get no answer at all (its network
        # namespace is gone): give up after 2 s and resolve the name again, instead of the kernel's ~2 min SYN
        # retries (seen in tests/e2e as workers rejoining a new broker 70 s late).
        sock.setsockopt(zmq.CONNECT_TIMEOUT, 2000)
        curve.make_client(sock, self._cert)
        # Without it libzmq resolves names to IPv4 only, and an IPv6-only cluster never connects.
        sock.setsockopt(zmq.IPV6, ipv6_available())
        sock.connect(self.config.endpoint_of(parent))
        return sock

    @property
    def dropped(self) -> int:
        """Messages dropped because their next hop was not connected (§2.4: best effort)."""
        return self._dropped_before + sum(sender.dropped for sender in (self._down, self._up) if sender is not None)

    def start(self) -> None:
        """Bind, connect and start receiving (in the running event loop)."""
        if self._ctx is not None:
            raise RuntimeError("the overlay is already started")
        loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        auth = curve.start_authenticator(ctx, self._cert)
        try:
            router = self._make_router(ctx)
        except BaseException:
            # A bind that failed (address in use) must not leave the ZAP thread and the context behind.
            auth.stop()
            ctx.destroy(linger=0)
            raise
        self._ctx, self._auth = ctx, auth
        self._down = _Sender(router, "router")
        self._tasks.append(loop.create_task(self._receive(router, from_child=True)))
        if self.parent is not None:
            self._link_to(self.parent)
            self.relay = HeartbeatRelay(self.send, self.config.heartbeat_interval / 10, loop.call_later)

    def _link_to(self, parent: int) -> None:
        """Open a DEALER to `parent`, closing the one before: a fresh socket, so its monitor's events are about
        this parent only (libzmq names a reconnected peer by its resolved address, not our endpoint)."""
        assert self._ctx is not None
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        for task in self._up_tasks:
            if task is not current:
                task.cancel()
        if self._up is not None:
            self._dropped_before += self._up.dropped
            self._up.sock.disable_monitor()
            self._up.sock.close(linger=0)
        dealer = self._make_dealer(self._ctx, parent)
        monitor = dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.parent = parent
        self._up = _Sender(dealer, "dealer")
        self._up_tasks = [loop.create_task(self._receive(dealer, from_child=False)),
                          loop.create_task(self._watch_parent(monitor, parent))]

    async def _watch_parent(self, monitor: zmq.asyncio.Socket, parent: int) -> None:
        """Follow the link to `parent`; once it has been down for the patience, move one level up (§2.4.1)."""
        loop = asyncio.get_running_loop()
        linked, deadline = False, loop.time() + self._patience
        try:
            while True:
                waiting = linked or not self._was_home
                try:
                    async with asyncio.timeout(None if waiting else max(0.0, deadline - loop.time())):
                        event = parse_monitor_message(await monitor.recv_multipart())["event"]
                except TimeoutError:
                    self._move_up(parent)
                    return
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    linked = True
                    self._was_home = self._was_home or parent == self.home_parent
                    if parent != self.home_parent:
                        self.send(ATTACH, parent, {})
                elif event == zmq.EVENT_DISCONNECTED and linked:
                    linked, deadline = False, loop.time() + self._patience
        finally:
            monitor.close(linger=0)

    def _move_up(self, lost: int) -> None:
        above = topology.parent(lost, self.fanout)
        if above is None:  # rank 0 itself is out of reach: keep trying it, as every rank does
            self._link_to(lost)
            return
        log.warning("rank %d: no link to rank %d for %.1f s; linking to rank %d", self.rank, lost, self._patience,
                    above)
        self.moves += 1
        self._link_to(above)

    def _go_home(self) -> None:
        if self.home_parent is not None and self.parent != self.home_parent:
            log.warning("rank %d: rank %d is back; linking to it again", self.rank, self.home_parent)
            self.moves += 1
            self._link_to(self.home_parent)

    async def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for sender in (self._down, self._up):
            if sender is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sender.drained(), 1.0)
        tasks = self._tasks + self._up_tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            # A short linger lets the last messages (results, a forwarded shutdown) leave.
            self._ctx.destroy(linger=200)

    def send(self, kind: str, dst: int, body: dict[str, Any]) -> None:
        self.route(Message(kind, self.rank, dst, body))

    def route(self, msg: Message) -> None:
        """Deliver `msg` locally or pass it one hop on (§2.4)."""
        if msg.dst != self.rank:
            self._forward(msg.dst, envelope.encode(msg))
        elif msg.src == self.rank:
            # A rank talking to itself (rank 0's own worker agent): no re-entry into the sender.
            asyncio.get_running_loop().call_soon(self.handler, msg)
        else:
            self.handler(msg)

    def _forward(self, dst: int, frame: bytes) -> None:
        if self._down is None:
            raise RuntimeError("the overlay is not started: call start() first")
        if self.adopted:
            adopted = self._adopted_hop(dst)
            if adopted is not None:
                if self._down.send([str(adopted).encode(), frame], fallback=True):
                    return
                self.adopted.discard(adopted)  # it went home or away: the tree's way, below
        hop = topology.next_hop(self.rank, dst, self.fanout)
        if hop is not None and hop < self.config.tree_size:
            self._down.send([str(hop).encode(), frame])
        elif self._up is not None:
            self._up.send([frame])
        else:
            log.debug("rank 0 dropped a message for unknown rank %d", dst)

    def _adopted_hop(self, dst: int) -> int | None:
        """The deepest adopted rank on the way down to `dst` (itself included), if any."""
        node: int | None = dst
        while node is not None and node > self.rank:
            if node in self.adopted:
                return node
            node = topology.parent(node, self.fanout)
        return None

    async def _receive(self, sock: zmq.asyncio.Socket, from_child: bool) -> None:
        # What is already queued is read without pyzmq's asyncio machinery (a future, an EVENTS check), which costs
        # several times the read itself: at 1,000 ranks rank 0 reads a heartbeat every millisecond (issue 29).
        # Unlike a send (_Sender), a read here cannot strand the edge-triggered ZMQ_FD: the await that follows
        # checks EVENTS before it waits.
        plain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        while True:
            frames = await sock.recv_multipart()
            self._on_frames(frames, from_child)
            for _ in range(RECEIVE_BATCH):
                if sock.closed:  # a handler may have closed the overlay: its shadow must not be read then
                    return
                try:
                    frames = plain.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_frames(frames, from_child)
            else:
                await asyncio.sleep(0)

    def _on_frames(self, frames: list[bytes], from_child: bool) -> None:
        if from_child:
            child = self._below(frames[0]) if len(frames) == 2 else None
            if child is None:
                self.bad_frames += 1
                return
            if child not in self.adopted and topology.parent(child, self.fanout) != self.rank:
                self.adopted.add(child)
        elif len(frames) != 1:
            self.bad_frames += 1
            return
        frame = frames[-1]
        try:
            kind, _, dst = envelope.peek(frame)
            if dst != self.rank:
                if dst == 0 and kind in RELAYED and from_child and self.relay is not None:
                    self.relay.add(envelope.decode(frame))
                else:
                    self._forward(dst, frame)
                return
            msg = envelope.decode(frame)
        except BadMessage as exc:
            self.bad_frames += 1
            log.warning("rank %d: dropped a bad frame: %s", self.rank, exc)
            if exc.src is not None and exc.code == "version":
                messages.send(self.send, exc.src, messages.refusal("", exc))
            return
        if msg.kind in (ATTACH, HOME):
            if msg.kind == HOME and msg.src == 0:
                self._go_home()
            return  # an `attach` has done its work: its frame made the sender adopted
        try:
            self.handler(msg)
        except Exception:
            # One bad message must never take the rank down.
            log.exception("rank %d: handler failed on %s from %d", self.rank, msg.kind, msg.src)

    def _below(self, ident: bytes) -> int | None:
        """The rank a peer's routing id names, if it is a rank below this one (§2.1); else None."""
        try:
            rank = int(ident)
        except ValueError:
            return None
        if 0 < rank < self.config.tree_size and topology.next_hop(self.rank, rank, self.fanout) is not None:
            return rank
        return None
