"""asyncio PMI-1 server for the tasks of one job on one worker.

Implements the "Connection" section of Flux RFC 13 (a pre-connected
``PMI_FD`` per task, plus the environment of "Environment") and, as an
option, MPICH's ``PMI_PORT`` + ``PMI_ID`` mode where tasks dial a local TCP
port and name their rank with ``cmd=initack``.  The protocol itself lives in
:mod:`worker.pmi.engine`; the barrier exchange in :mod:`worker.pmi.barrier`.

Everything runs on the caller's event loop and never blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from worker.pmi.barrier import JobBarrier, PMIExchange
from worker.pmi.engine import (
    Abort,
    EnterBarrier,
    JobInfo,
    Phase,
    ProtocolError,
    PutBudget,
    PutRefused,
    Reply,
    TaskEngine,
    failure,
    initack_reply,
    parse_initack,
)
from worker.pmi.wire import WireError, decode, encode

log = logging.getLogger(__name__)

# Longest request line accepted; a put with a 1024-byte value is ~1.1 KiB.
MAX_LINE = 64 * 1024
PROCESS_MAPPING_KEY = "PMI_process_mapping"

AbortCallback = Callable[[int, int, str], None]


class PMIJobServer:
    """Serves PMI-1 to the local tasks of one job; one instance per job per worker."""

    def __init__(
        self,
        *,
        kvsname: str,
        universe_size: int,
        local_ranks: list[int],
        process_mapping: str,
        exchange: PMIExchange,
        on_abort: AbortCallback,
        on_init: Callable[[], None] | None = None,
        appnum: int = 0,
    ) -> None:
        bad = [r for r in local_ranks if not 0 <= r < universe_size]
        if bad:
            raise ValueError(f"ranks {bad} outside 0..{universe_size - 1}")
        self.job = JobInfo(kvsname=kvsname, size=universe_size, appnum=appnum)
        self.kvs: dict[str, str] = {PROCESS_MAPPING_KEY: process_mapping}
        self.barrier = JobBarrier(kvsname, local_ranks, exchange, self.kvs)
        self.puts = PutBudget(universe_size, len(local_ranks))  # shared by the local tasks' engines
        self._put_refused_logged = False
        self._on_abort = on_abort
        # Called once, when the first local task initializes PMI.
        self._on_init = on_init
        self._child_fds: dict[int, socket.socket] = {}
        self._unserved: set[socket.socket] = set()  # parent ends whose handler has not started
        self._connected: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tcp: asyncio.Server | None = None
        self._closed = False

    # -- PMI_FD mode -------------------------------------------------------

    def socket_for(self, rank: int) -> int:
        """Create the socketpair for ``rank``; return the inheritable child fd.

        Must be called from the running event loop, which serves the parent end.
        """
        self._claim(rank)
        parent, child = socket.socketpair()
        child.set_inheritable(True)
        self._child_fds[rank] = child
        self._unserved.add(parent)
        self._spawn(self._serve_fd(rank, parent), f"pmi-fd-{self.job.kvsname}-{rank}")
        return child.fileno()

    def env_for(self, rank: int, fd: int) -> dict[str, str]:
        """Environment that points task ``rank`` at its PMI_FD."""
        return {"PMI_FD": str(fd), **self._common_env(rank)}

    def close_child_fds(self) -> None:
        """Close the child ends in this process once the tasks are spawned."""
        for child in self._child_fds.values():
            child.close()
        self._child_fds.clear()

    # -- PMI_PORT mode -----------------------------------------------------

    async def listen_tcp(self) -> int:
        """Listen on 127.0.0.1 for ``PMI_PORT`` clients; return the port."""
        if self._tcp is None:
            self._tcp = await asyncio.start_server(
                self._accept_tcp, host="127.0.0.1", port=0, limit=MAX_LINE
            )
        return int(self._tcp.sockets[0].getsockname()[1])

    def env_for_port(self, rank: int, port: int) -> dict[str, str]:
        """Environment that makes task ``rank`` dial the PMI port.

        PMI_ID is what lets the server tell connections apart: without it
        MPICH skips the initack handshake and the server refuses its init.
        """
        return {"PMI_PORT": f"127.0.0.1:{port}", "PMI_ID": str(rank), **self._common_env(rank)}

    def close(self) -> None:
        """Stop serving: close sockets, cancel handlers and any exchange."""
        self._closed = True
        self.close_child_fds()
        if self._tcp is not None:
            self._tcp.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        for sock in self._unserved:
            sock.close()
        self._unserved.clear()
        self.barrier.close()

    # -- internals ---------------------------------------------------------

    def _common_env(self, rank: int) -> dict[str, str]:
        local = sorted(self.barrier.local_ranks)
        return {
            "PMI_RANK": str(rank),
            "PMI_SIZE": str(self.job.size),
            "PMI_SPAWNED": "0",
            # Hints Hydra also sets; libraries use them, e.g. to pick a GPU.
            "MPI_LOCALNRANKS": str(len(local)),
            "MPI_LOCALRANKID": str(local.index(rank)),
            # MPICH picks PMI-1 vs PMIx by sniffing the environment and gives
            # up if a pod also carries PMIX_* variables; pin it.
            "MPIR_CVAR_PMI_VERSION": "1",
        }

    def _claim(self, rank: int) -> None:
        if self._closed:
            raise RuntimeError("PMI server is closed")
        if rank not in self.barrier.local_ranks:
            raise ValueError(f"rank {rank} is not local to job {self.job.kvsname}")
        if rank in self._connected:
            raise ValueError(f"rank {rank} already has a PMI connection")
        self._connected.add(rank)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_fd(self, rank: int, sock: socket.socket) -> None:
        self._unserved.discard(sock)
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_LINE)
        except BaseException:
            sock.close()
            raise
        await self._serve(rank, reader, writer)

    async def _accept_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            rank = await self._tcp_handshake(reader, writer)
        except (WireError, ValueError, ConnectionError, EOFError, asyncio.LimitOverrunError) as exc:
            log.warning("PMI_PORT connection for %s refused: %s", self.job.kvsname, exc)
            await _close(writer)
            self._writers.discard(writer)
            return
        await self._serve(rank, reader, writer)

    async def _tcp_handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        first = decode(await reader.readuntil(b"\n"))
        try:
            rank = parse_initack(first)
        except WireError:
            # The client has no PMI_ID: answer its init with a failure so
            # MPI_Init errors out instead of running a world of one.
            writer.write(encode(failure("response_to_init", "PMI_ID is required with PMI_PORT").text))
            await writer.drain()
            raise
        self._claim(rank)
        writer.write(encode(initack_reply(rank, self.job.size)))
        await writer.drain()
        return rank

    async def _serve(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        engine = TaskEngine(rank, self.job, self.kvs, self.puts)
        try:
            await self._loop(engine, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.LimitOverrunError:
            self._protocol_error(engine, f"rank {rank}: request line longer than {MAX_LINE} bytes")
        except Exception:
            # A bug here would leave the task waiting for a reply until the
            # time limit; end the job now instead.
            log.exception("PMI server failed serving rank %d of %s", rank, self.job.kvsname)
            self._report_abort(rank, 1, "PMI server internal error")
        finally:
            if engine.phase not in (Phase.FINALIZED, Phase.ABORTED):
                # Not an error by itself: the task's exit status decides.
                log.debug("rank %d of %s closed PMI in phase %s", rank, self.job.kvsname, engine.phase.value)
            self._writers.discard(writer)
            await _close(writer)

    async def _loop(self, engine: TaskEngine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            raw = await reader.readuntil(b"\n")
            log.debug("rank %d PMI <- %r", engine.rank, raw[:200])
            effects = engine.handle(decode(raw))
            if self._on_init is not None and engine.phase is not Phase.NEW:
                on_init, self._on_init = self._on_init, None
                on_init()
            for effect in effects:
                if isinstance(effect, Reply):
                    writer.write(encode(effect.text))
                elif isinstance(effect, EnterBarrier):
                    ok = await self.barrier.enter(engine.rank, effect.puts)
                    writer.write(encode(engine.barrier_done(ok).text))
                elif isinstance(effect, Abort):
                    self._report_abort(engine.rank, effect.exit_code, effect.message)
                elif isinstance(effect, ProtocolError):
                    self._protocol_error(engine, effect.message)
                    return
                elif isinstance(effect, PutRefused) and not self._put_refused_logged:
                    self._put_refused_logged = True  # once per job: a task may retry many times
                    log.warning("PMI job %s: put refused: %s", self.job.kvsname, effect.message)
            await writer.drain()

    def _protocol_error(self, engine: TaskEngine, message: str) -> None:
        # RFC 13 "Error Handling": close the connection and abort the program.
        log.error("PMI protocol error in job %s: %s", self.job.kvsname, message)
        self._report_abort(engine.rank, 1, f"PMI protocol error: {message}")

    def _report_abort(self, rank: int, code: int, message: str) -> None:
        try:
            self._on_abort(rank, code, message)
        except Exception:
            log.exception("on_abort callback failed for rank %d of %s", rank, self.job.kvsname)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()

