"""The overlay transport (protocol.md §2.1–2.4): one ROUTER for children, one DEALER to the parent, routing, and
the healing around a lost parent (§2.4.1).

Liveness, joining and everything else with meaning lives in the broker and worker; this module only moves
envelopes between ranks without blocking the event loop.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from minicluster.config import InstanceConfig
from minicluster.overlay import curve
from minicluster.overlay.relay import RELAYED, HeartbeatRelay
from minicluster.overlay.sockets import Sender, drain_then_cancel, set_common_options
from minicluster.overlay.uplink import ATTACH, HOME, Uplink
from minicluster.proto import envelope, messages, topology
from minicluster.proto.envelope import BadMessage, Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], None]
# Messages read at most in one go once the first is in; then the loop's other work (timers, writes) gets its turn.
RECEIVE_BATCH = 256


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
        self.handler = handler
        self._cert = cert
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: AsyncioAuthenticator | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._down: Sender | None = None
        # The link to the parent (rank > 0), made by start(); it moves around a lost parent (§2.4.1).
        self.uplink: Uplink | None = None
        # Ranks below this one, not its children, that linked to it around a lost rank (§2.4.1).
        self.adopted: set[int] = set()
        self.adoptions = 0
        self.bad_frames = 0
        # An interior rank sends its subtree's heartbeats up together (protocol.md §2.6); made by start().
        self.relay: HeartbeatRelay | None = None

    def _make_router(self, ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        set_common_options(sock)
        # A restarted child reuses its routing id; let the new connection take over the old one.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        curve.make_server(sock, self._cert)
        for address in self.config.bind_addresses(self.rank):
            sock.bind(address)
        return sock

    @property
    def dropped(self) -> int:
        """Messages dropped because their next hop was not connected (§2.4: best effort)."""
        return sum(part.dropped for part in (self._down, self.uplink) if part is not None)

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
        self._down = Sender(router, "router")
        self._tasks.append(loop.create_task(self._receive(router, from_child=True)))
        if self.rank != 0:
            self.uplink = Uplink(ctx, self.config, self.rank, self._cert,
                                 functools.partial(self._receive, from_child=False))
            self.uplink.start()
            self.relay = HeartbeatRelay(self.send, self.config.heartbeat_interval / 10, loop.call_later)

    async def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        if self.uplink is not None:
            await self.uplink.close()
        await drain_then_cancel(self._down, self._tasks)
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
        elif self.uplink is not None:
            self.uplink.send([frame])
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
        # Unlike a send (Sender), a read here cannot strand the edge-triggered ZMQ_FD: the await that follows
        # checks EVENTS before it waits.
        plain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        while not sock.closed:  # an uplink that moved closed its old DEALER (§2.4.1)
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
                self.adoptions += 1
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
            if msg.kind == HOME and msg.src == 0 and self.uplink is not None:
                self.uplink.go_home()
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
