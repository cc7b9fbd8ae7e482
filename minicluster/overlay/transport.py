"""The overlay transport (protocol.md §2.1–2.4): one ROUTER for children, one DEALER to the parent, routing.

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

from minicluster.config import InstanceConfig
from minicluster.overlay import curve
from minicluster.overlay.relay import RELAYED, HeartbeatRelay
from minicluster.proto import envelope, messages, topology
from minicluster.proto.envelope import BadMessage, Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], None]
# Messages read at most in one go once the first is in; then the loop's other work (timers, writes) gets its turn.
RECEIVE_BATCH = 256


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

    def send(self, frames: list[bytes]) -> None:
        # copy=True: zero-copy sends route every frame through pyzmq's gc thread, ~100x slower for our sizes.
        # zmq.asyncio returns a Future; its stubs say only Awaitable.
        fut = cast("asyncio.Future[Any]", self.sock.send_multipart(frames))
        if fut.done():
            self._sent(fut, counted=False)
            return
        self.pending += 1
        self._idle.clear()
        fut.add_done_callback(self._sent)

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
        self.parent = topology.parent(rank, self.fanout)
        self.handler = handler
        self._cert = cert
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: AsyncioAuthenticator | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._down: _Sender | None = None
        self._up: _Sender | None = None
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

    def _make_dealer(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, str(self.rank).encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.MAXMSGSIZE, envelope.MAX_FRAME)
        # Short, capped reconnect backoff: a parent that comes back is rejoined within a second.
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        # A replaced parent pod has a new IP, and a connect to the old one may get no answer at all (its network
        # namespace is gone): give up after 2 s and resolve the name again, instead of the kernel's ~2 min SYN
        # retries (seen in tests/e2e as workers rejoining a new broker 70 s late).
        sock.setsockopt(zmq.CONNECT_TIMEOUT, 2000)
        curve.make_client(sock, self._cert)
        # Without it libzmq resolves names to IPv4 only, and an IPv6-only cluster never connects.
        sock.setsockopt(zmq.IPV6, ipv6_available())
        assert self.parent is not None
        sock.connect(self.config.endpoint_of(self.parent))
        return sock

    @property
    def dropped(self) -> int:
        """Messages dropped because their next hop was not connected (§2.4: best effort)."""
        return sum(sender.dropped for sender in (self._down, self._up) if sender is not None)

    def start(self) -> None:
        """Bind, connect and start receiving (in the running event loop)."""
        if self._ctx is not None:
            raise RuntimeError("the overlay is already started")
        loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        auth = curve.start_authenticator(ctx, self._cert)
        try:
            router = self._make_router(ctx)
            dealer = self._make_dealer(ctx) if self.parent is not None else None
        except BaseException:
            # A bind that failed (address in use) must not leave the ZAP thread and the context behind.
            auth.stop()
            ctx.destroy(linger=0)
            raise
        self._ctx, self._auth = ctx, auth
        self._down = _Sender(router, "router")
        self._tasks.append(loop.create_task(self._receive(router, from_child=True)))
        if dealer is not None:
            self._up = _Sender(dealer, "dealer")
            self.relay = HeartbeatRelay(self.send, self.config.heartbeat_interval / 10, loop.call_later)
            self._tasks.append(loop.create_task(self._receive(dealer, from_child=False)))

    async def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for sender in (self._down, self._up):
            if sender is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sender.drained(), 1.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
        hop = topology.next_hop(self.rank, dst, self.fanout)
        if hop is not None and hop < self.config.tree_size:
            self._down.send([str(hop).encode(), frame])
        elif self._up is not None:
            self._up.send([frame])
        else:
            log.debug("rank 0 dropped a message for unknown rank %d", dst)

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
            if len(frames) != 2 or not self._is_my_child(frames[0]):
                self.bad_frames += 1
                return
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
        try:
            self.handler(msg)
        except Exception:
            # One bad message must never take the rank down.
            log.exception("rank %d: handler failed on %s from %d", self.rank, msg.kind, msg.src)

    def _is_my_child(self, ident: bytes) -> bool:
        try:
            child = int(ident)
        except ValueError:
            return False
        return 0 < child < self.config.tree_size and topology.parent(child, self.fanout) == self.rank
