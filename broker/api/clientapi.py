"""The client socket (protocol.md §3.1–3.2): a unix-domain listener, peer credentials, framing and dispatch.

Each request is handed to an operation in broker/api/ops.py.  An operation returns a response map, a future of
one (a submission answered once durable, without holding up the requests behind it), or an async iterator
of responses for streaming requests.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import logging
import os
import resource
import socket
import stat
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from broker.jobmanager import JobError
from minicluster.proto import frames

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")

# What one client can make the broker hold is bounded (protocol.md §3.1): bytes read ahead of the request being
# parsed; frame bodies being received, all connections together, and how long one may take; requests awaiting
# their final response per connection; and how much of its input an error message quotes.
READ_AHEAD = 64 * 1024
FRAME_BUDGET = 4 * frames.MAX_FRAME
BODY_TIMEOUT = 30.0
MAX_OPEN_REQUESTS = 256
MAX_ERROR_MESSAGE = 1000
# Connections waiting to be accepted; then accepted per wake-up, so that a burst does not hold up the loop.
BACKLOG = 128
ACCEPT_BATCH = 64
# With no descriptor to spare even for a refusal, accepting pauses this long (connections wait in the backlog).
ACCEPT_PAUSE = 1.0
LOG_EVERY = 60.0  # seconds between log lines about refusals and pauses, however many there are
# Descriptors kept from clients for the broker's own work (journal, overlay, rank 0's tasks and their pipes): at
# least this many, a quarter of the open-files limit above that, so that a flood of clients cannot starve it.
RESERVED_DESCRIPTORS = 64
# At its descriptor limit the broker answers a new connection with this and closes it (protocol.md §3.1).
REFUSED_AT_LIMIT = frames.pack({"v": frames.VERSION, "id": 0, "ok": False, "error": {
    "code": "unavailable", "message": "the broker has no file descriptor to spare (its open-files limit); "
                                      "try again later"}})


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    # Called when the connection closes, once each (e.g. end a job's stdin this client was feeding).
    closers: dict[Any, Callable[[], None]] = field(default_factory=dict, compare=False)
    # Bulk history (output pages) this connection's streams may hold at once while the client reads it.
    bulk_reads: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2), compare=False)


class ByteBudget:
    """Bytes shared by every connection: a taker waits, first come first served, until its share fits."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def take(self, n: int) -> None:
        if not self._waiting and n <= self.free:
            self.free -= n
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(n)  # granted, but its taker is gone
            granted.cancel()
            raise

    def give(self, n: int) -> None:
        self.free += n
        while self._waiting and (self._waiting[0][1].done() or self._waiting[0][0] <= self.free):
            wanted, granted = self._waiting.popleft()
            if not granted.done():
                self.free -= wanted
                granted.set_result(None)


class Connection:
    def __init__(self, writer: asyncio.StreamWriter, peer: Peer) -> None:
        self.writer = writer
        self.peer = peer
        self.streams: dict[int, asyncio.Task[None]] = {}
        # Ids of requests whose final response is still to come; reading pauses while there are too many.
        self.open: set[int] = set()
        self.room = asyncio.Event()
        self.room.set()
        # Streams take turns to write, each once the client has read what went before.
        self.turn = asyncio.Lock()

    def opened(self, req_id: int) -> None:
        self.open.add(req_id)
        if len(self.open) >= MAX_OPEN_REQUESTS:
            self.room.clear()

    def answered(self, req_id: int) -> None:
        self.open.discard(req_id)
        if len(self.open) < MAX_OPEN_REQUESTS:
            self.room.set()

    def respond(self, req_id: Any, body: dict[str, Any], more: bool = False) -> None:
        if self.writer.is_closing():
            return
        message = {"v": frames.VERSION, "id": req_id, "ok": True, **body}
        if more:
            message["more"] = True
        try:
            self.writer.write(frames.pack(message))
        except frames.FrameError as exc:
            self.fail(req_id, "bad-request", f"response too large: {exc}")

    def fail(self, req_id: Any, code: str, message: str) -> None:
        if len(message) > MAX_ERROR_MESSAGE:
            message = message[:MAX_ERROR_MESSAGE - 1] + "…"
        if not self.writer.is_closing():
            self.writer.write(frames.pack({"v": frames.VERSION, "id": req_id, "ok": False,
                                           "error": {"code": code, "message": message}}))


class ClientServer:
    def __init__(self, ops: Any, path: str, access_group: str = "", state_dir: str = "") -> None:
        self.ops = ops
        self.path = path
        self.access_group = access_group
        self.state_dir = state_dir
        self._listener: socket.socket | None = None
        self._spare: int | None = None
        self._serving: set[asyncio.Task[None]] = set()  # one per connection, while it lasts
        self.refused = 0  # connections refused at the descriptor limit, since start
        self.pauses = 0   # times accepting paused, with not even a descriptor for a refusal
        self._refusal_logged = -LOG_EVERY
        self.connections: set[Connection] = set()
        self.frame_budget = ByteBudget(FRAME_BUDGET)

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Create the socket with no access at all, then open it up: no window where others may connect.
        old = os.umask(0o177 if not self.access_group else 0o117)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        listener.listen(BACKLOG)
        listener.setblocking(False)
        self._listener = listener
        self._open_path_to_socket()
        self._spare = _spare_descriptor()
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept)

    def _open_path_to_socket(self) -> None:
        """With `access_group`: the socket 0660 and each directory down to it 0710, all of that group, so that its
        members can reach the socket but not list or open what lies beside it (the journal, keys and config stay
        the owner's, 0600 in 0700 directories). Without: the state directory's part of the path is the owner's
        alone again (0700), whatever an earlier start with a group made of it.  A directory this process does not
        own is left as it is: in a pod the state directory is a volume that the kubelet made (and chose the modes of),
        and only its owner could change them."""
        gid = grp.getgrnam(self.access_group).gr_gid if self.access_group else -1
        for directory in self._path_to_socket():
            if os.stat(directory).st_uid != os.geteuid():
                continue
            os.chmod(directory, 0o710 if self.access_group else 0o700)
            if self.access_group:
                os.chown(directory, -1, gid)
        if self.access_group:
            os.chown(self.path, -1, gid)

    def _path_to_socket(self) -> list[str]:
        """The instance's own directories a client passes through to the socket: from the state directory down to
        the socket's; for a socket elsewhere, its directory alone, if it is ours and not a shared one like /tmp
        (and only to open it up: with `access_group`)."""
        socket_dir = os.path.dirname(os.path.abspath(self.path))
        state_dir = os.path.abspath(self.state_dir) if self.state_dir else ""
        if state_dir and os.path.commonpath([socket_dir, state_dir]) == state_dir:
            path = [socket_dir]
            while path[-1] != state_dir:
                path.append(os.path.dirname(path[-1]))
            return path[::-1]
        info = os.stat(socket_dir)
        own = info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWOTH | stat.S_ISVTX)
        return [socket_dir] if own and self.access_group else []

    def _accept(self) -> None:
        """Accept what waits, each connection served by its own task. Beyond client_room(), or at the descriptor
        limit itself (EMFILE, through the descriptor kept spare for it), a connection is refused with a one-frame
        answer instead: the client hears why at once, and the log has one line, not a traceback per attempt."""
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("accepting a client connection failed: %s", exc)
                    return
                if self._spare is None:
                    self._spare = _spare_descriptor()
                if self._spare is None:
                    self._pause_accepting(exc)
                    return
                if not self._refuse_waiting():
                    return  # the limit was hit with no one waiting
                continue
            if len(self._serving) >= client_room():
                self._refuse(sock)
                continue
            task = loop.create_task(self._open(sock))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    def _refuse_waiting(self) -> bool:
        """Accept one waiting connection with the spare descriptor and refuse it; False if none was waiting."""
        assert self._listener is not None and self._spare is not None
        os.close(self._spare)
        try:
            sock, _address = self._listener.accept()
        except OSError:
            return False
        else:
            self._refuse(sock)
        finally:
            self._spare = _spare_descriptor()  # once the refused connection's descriptor is free again
        return True

    def _refuse(self, sock: socket.socket) -> None:
        """Answer a new connection `unavailable` and close it."""
        with sock, contextlib.suppress(OSError):
            sock.send(REFUSED_AT_LIMIT, socket.MSG_DONTWAIT)
        self.refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= LOG_EVERY:
            self._refusal_logged = now
            log.warning("client connection refused at the open-files limit (%d refused so far, %d clients "
                        "connected, room for %d); raise the limit (ulimit -n)", self.refused, len(self._serving),
                        client_room())

    def _pause_accepting(self, exc: OSError) -> None:
        """Not even a refusal can be made: stop accepting for a while (waiting clients stay in the backlog)."""
        assert self._listener is not None
        self.pauses += 1
        if self.pauses % int(LOG_EVERY / ACCEPT_PAUSE) == 1:
            log.warning("accepting client connections paused for %g s (%d times so far): %s", ACCEPT_PAUSE,
                        self.pauses, exc.strerror or exc)
        loop = asyncio.get_running_loop()
        fd = self._listener.fileno()
        loop.remove_reader(fd)
        loop.call_later(ACCEPT_PAUSE, lambda: self._listener is not None and loop.add_reader(fd, self._accept))

    async def _open(self, sock: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_AHEAD)
        except OSError:
            sock.close()
            return
        await self._serve(reader, writer)

    async def close(self) -> None:
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        for task in list(self._serving):
            task.cancel()
        for conn in list(self.connections):
            for task in conn.streams.values():
                task.cancel()
            conn.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        conn = Connection(writer, Peer(pid, uid, gid))
        self.connections.add(conn)
        try:
            await self._read_requests(reader, conn)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.connections.discard(conn)
            for task in conn.streams.values():
                task.cancel()
            for closer in conn.peer.closers.values():
                closer()
            writer.close()

    async def _read_requests(self, reader: asyncio.StreamReader, conn: Connection) -> None:
        while True:
            await conn.room.wait()
            try:
                message = await read_frame(reader, self.frame_budget)
            except frames.FrameError as exc:
                conn.fail(0, "bad-frame", str(exc))
                await conn.writer.drain()
                return
            if message is None:
                return
            self._dispatch(conn, message)
            await conn.writer.drain()

    def _dispatch(self, conn: Connection, message: dict[str, Any]) -> None:
        req_id = message.get("id")
        if isinstance(req_id, bool) or not isinstance(req_id, int):
            conn.fail(0, "bad-request", "request needs an integer id")
            return
        if message.get("v") != frames.VERSION:
            conn.fail(req_id, "version", f"protocol version {message.get('v')!r}, the broker speaks {frames.VERSION}")
            return
        if req_id in conn.open:
            conn.fail(req_id, "bad-request", f"request id {req_id} is in use by a request still open")
            return
        op = message.get("op")
        handler = self.ops.handler(op)
        if handler is None:
            conn.fail(req_id, "unknown-op", f"unknown operation {op!r}")
            return
        try:
            result = handler(conn.peer, message)
        except JobError as exc:
            conn.fail(req_id, exc.code, str(exc))
            return
        except Exception as exc:
            log.exception("operation %s failed", op)
            conn.fail(req_id, "internal", f"{op} failed: {exc}")
            return
        if isinstance(result, dict):
            conn.respond(req_id, result)
        elif isinstance(result, asyncio.Future):
            conn.opened(req_id)
            result.add_done_callback(lambda f: _answer_future(conn, req_id, f))
        else:
            conn.opened(req_id)
            conn.streams[req_id] = asyncio.get_running_loop().create_task(_stream(conn, req_id, result))


def client_room() -> int:
    """How many client connections may be open at once: the open-files limit less the broker's reserve."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(soft // 2, soft - max(RESERVED_DESCRIPTORS, soft // 4))  # half of a tiny limit, not none of it


def _spare_descriptor() -> int | None:
    """A descriptor held in reserve for refusing a connection at the limit; None when none is left."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


async def read_frame(reader: asyncio.StreamReader, budget: ByteBudget) -> dict[str, Any] | None:
    """The next message, or None at a clean end of stream; its body is read within `budget`."""
    try:
        header = await reader.readexactly(frames.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise frames.FrameError("connection closed inside a frame header") from None
        return None
    (length,) = frames.HEADER.unpack(header)
    if length > frames.MAX_FRAME:
        raise frames.FrameError(f"frame of {length} bytes exceeds {frames.MAX_FRAME}")
    try:
        if length <= READ_AHEAD:  # no more than the read-ahead each connection has anyway
            return frames.unpack_body(await reader.readexactly(length))
        await budget.take(length)
        try:
            body = await asyncio.wait_for(reader.readexactly(length), BODY_TIMEOUT)
        finally:
            budget.give(length)
    except asyncio.IncompleteReadError:
        raise frames.FrameError("connection closed inside a frame") from None
    except TimeoutError:
        raise frames.FrameError(f"a frame's body did not arrive within {BODY_TIMEOUT:g} s") from None
    return frames.unpack_body(body)


def _answer_future(conn: Connection, req_id: int, fut: asyncio.Future[dict[str, Any]]) -> None:
    conn.answered(req_id)
    exc = fut.exception()
    if exc is None:
        conn.respond(req_id, fut.result())
    elif isinstance(exc, JobError):
        conn.fail(req_id, exc.code, str(exc))
    else:
        conn.fail(req_id, "internal", str(exc))


async def _stream(conn: Connection, req_id: int, responses: AsyncIterator[dict[str, Any]]) -> None:
    try:
        async for body in responses:
            async with conn.turn:
                await conn.writer.drain()
                conn.respond(req_id, body, more=True)
        conn.respond(req_id, {})
    except JobError as exc:
        conn.fail(req_id, exc.code, str(exc))
    except (ConnectionError, asyncio.CancelledError):
        pass
    except Exception as exc:  # a stream must end with a response, whatever went wrong
        log.exception("stream %d failed", req_id)
        conn.fail(req_id, "internal", f"failed: {exc}")
    finally:
        conn.streams.pop(req_id, None)
        conn.answered(req_id)
        aclose = getattr(responses, "aclose", None)
        if aclose is not None:
            await aclose()  # now, not when collected: it may hold the connection's bulk_reads
