"""The agent's end of its spawn helpers (worker/spawnhelper.py; docs/architecture.md, "Spawn helpers").

Requests asked for during one loop iteration leave together, one frame per helper, from a callback at the end of
the iteration; sends never block (a full socket waits for it to drain).  Reports come back in frames too and are
handed on in one call per frame.  A helper that dies is reaped through its pidfd, what it reported before it died
is handed on, the tasks it still had are handed to `on_lost`, and a new helper takes its place and the requests
not yet sent to the dead one.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

import worker
from minicluster import runtime
from worker.fdwatch import FdWatch
from worker.spawn import STATUS_CANNOT_RUN
from worker.spawnhelper import AGENTS_SIGNALS, CHANNEL_FD, MAX_PACKET, Request, frames, socket_pair

log = logging.getLogger(__name__)

Key = tuple[int, int]
# spawn_helpers = "auto": none below this many cores, where spawning on the loop costs less in all; above, one
# helper per CORES_PER_HELPER cores (docs/performance.md, "Spawn helpers").
AUTO_MIN_CORES = 16
CORES_PER_HELPER = 16
# A helper that dies sooner than this after its start, having reported nothing, is replaced only this much later: a
# helper that cannot run (a broken installation) must not be restarted in a busy loop.  Spawns asked for meanwhile
# fail at once when no helper runs.
RESTART_DELAY = 1.0
# An order larger than this is spawned on the loop instead: a channel packet may hold as little as the host's
# wmem_max (208 KiB by default) while execve takes up to ARG_MAX (2 MiB), so a big environment must not fail only
# because helpers run.
LARGEST_ORDER = 128 * 1024

OnReports = Callable[[list[list[Any]]], None]
OnLost = Callable[[set[Key], str], None]


def helper_count(setting: int | str, cores: int) -> int:
    """How many helpers a rank with `cores` cores runs for the `spawn_helpers` config value (validated there)."""
    if setting == "auto":
        return 0 if cores < AUTO_MIN_CORES else max(1, cores // CORES_PER_HELPER)
    return int(setting)


@dataclass(eq=False)
class _Helper:
    pid: int
    pidfd: int
    channel: socket.socket
    keys: set[Key] = field(default_factory=set)  # asked for and not yet reported ended
    queued: list[tuple[Request, bytes, list[int]]] = field(default_factory=list)  # not yet sent, with our fds
    waiting_to_write: bool = False
    started: float = field(default_factory=time.monotonic)
    reported: bool = False  # it sent something: it works


class SpawnHelpers:
    def __init__(self, count: int, home_cgroup: str | None, record_starttime: bool, watch: FdWatch,
                 on_reports: OnReports, on_lost: OnLost) -> None:
        self._home = home_cgroup or ""
        self._record = record_starttime
        self._watch = watch
        self._on_reports = on_reports
        self._on_lost = on_lost
        self._helpers = [self._start() for _ in range(count)]
        self._flush_scheduled = False
        self._closing = False
        # Received into, not allocated per packet: a packet may be as large as this.
        self._buffer = bytearray(MAX_PACKET)

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self._helpers]

    def send(self, request: Request, fds: list[int]) -> None:
        """Ask for a spawn; `fds` (in the request's order) are ours to close once sent."""
        if not self._helpers:
            for fd in fds:
                os.close(fd)
            asyncio.get_running_loop().call_soon(self._on_reports, [
                ["f", *request.key, STATUS_CANNOT_RUN, "no spawn helper runs: they die as they start"]])
            return
        helper = min(self._helpers, key=lambda h: len(h.keys))
        helper.keys.add(request.key)
        helper.queued.append((request, request.pack(), fds))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def ended(self, key: Key) -> None:
        """The task's end (or failure to start) was handled: its helper owes nothing more for it."""
        for helper in self._helpers:
            helper.keys.discard(key)

    async def close(self) -> None:
        """End the helpers (end of file on their channel) and reap them."""
        self._closing = True
        for helper in self._helpers:
            self._watch.remove(helper.pidfd)
            if helper.channel.fileno() in self._watch:  # else it read the end of file already
                self._watch.remove(helper.channel.fileno())
            if helper.waiting_to_write:
                asyncio.get_running_loop().remove_writer(helper.channel)
            helper.channel.close()
        for helper in self._helpers:
            for _ in range(200):
                if os.waitpid(helper.pid, os.WNOHANG)[0]:  # noqa: ASYNC222 (WNOHANG: never waits)
                    break
                await asyncio.sleep(0.01)
            else:
                log.warning("spawn helper %d did not exit", helper.pid)
            os.close(helper.pidfd)
        self._helpers.clear()

    # -- sending ----------------------------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        for helper in self._helpers:
            if not helper.waiting_to_write:
                self._write(helper)

    def _write(self, helper: _Helper) -> None:
        sent = 0
        try:
            for start, end in list(frames([(packed, len(fds)) for _, packed, fds in helper.queued])):
                batch = helper.queued[start:end]
                fds = [fd for *_, owned in batch for fd in owned]
                try:
                    socket.send_fds(helper.channel, [b"".join(packed for _, packed, _ in batch)], fds)
                except BlockingIOError:
                    helper.waiting_to_write = True
                    asyncio.get_running_loop().add_writer(helper.channel, self._writable, helper)
                    return
                except OSError as e:
                    if e.errno != errno.EMSGSIZE or len(batch) > 1:
                        return  # the helper died: its pidfd says so soon, and what it had is failed then
                    self._on_reports([["f", *batch[0][0].key, STATUS_CANNOT_RUN,
                                       f"too large for the spawn helper's channel ({e.strerror})"]])
                sent = end
                for fd in fds:
                    os.close(fd)
        finally:
            del helper.queued[:sent]

    def _writable(self, helper: _Helper) -> None:
        asyncio.get_running_loop().remove_writer(helper.channel)
        helper.waiting_to_write = False
        self._write(helper)

    # -- receiving --------------------------------------------------------------------------------------------

    def _readable(self, helper: _Helper) -> None:
        while True:
            try:
                size = helper.channel.recv_into(self._buffer)
            except (BlockingIOError, OSError):
                return
            if not size:  # the helper is going: its pidfd follows
                self._watch.remove(helper.channel.fileno())
                return
            helper.reported = True
            self._on_reports(msgpack.unpackb(self._buffer[:size]))

    def _died(self, helper: _Helper) -> None:
        try:
            _, status = os.waitpid(helper.pid, os.WNOHANG)
        except ChildProcessError:
            status = 0
        self._watch.remove(helper.pidfd)
        os.close(helper.pidfd)
        if helper.channel.fileno() in self._watch:
            self._readable(helper)  # what it reported before it died counts, up to the end of file
        if helper.channel.fileno() in self._watch:
            self._watch.remove(helper.channel.fileno())
        if helper.waiting_to_write:
            asyncio.get_running_loop().remove_writer(helper.channel)
        helper.channel.close()
        how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exited with status {os.WEXITSTATUS(status)}")
        unsent, helper.queued = helper.queued, []  # they never reached it: another helper spawns them
        helper.keys.difference_update(request.key for request, _, _ in unsent)
        log.error("spawn helper %d %s; %d task(s) it had are lost, %d not yet sent go to another", helper.pid, how,
                  len(helper.keys), len(unsent))
        self._helpers.remove(helper)
        loop = asyncio.get_running_loop()
        if not helper.reported and time.monotonic() - helper.started < RESTART_DELAY:
            loop.call_later(RESTART_DELAY, self._restart)
        else:
            self._restart()
        if helper.keys:
            self._on_lost(set(helper.keys), f"spawn helper (pid {helper.pid}) {how}")
        for request, _, fds in unsent:
            self.send(request, fds)

    # -- starting ---------------------------------------------------------------------------------------------

    def _restart(self) -> None:
        if self._closing:
            return
        try:
            self._helpers.append(self._start())
        except OSError as exc:  # e.g. EAGAIN: out of processes for now
            log.error("cannot start a spawn helper: %s", exc)
            asyncio.get_running_loop().call_later(RESTART_DELAY, self._restart)

    def _start(self) -> _Helper:
        ours, theirs = socket_pair()
        ours.setblocking(False)
        env = {k: v for k, v in os.environ.items() if k not in ("MC_JOB_ID", "MC_TASK_RANK")}
        root = os.path.dirname(os.path.dirname(os.path.abspath(worker.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        python = runtime.python_argv()  # the view's python stays isolated from the image's PYTHON* variables
        try:
            pid = os.posix_spawn(python[0], [*python, "-m", "worker.spawnhelper", self._home,
                                             "1" if self._record else "0"], env,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), CHANNEL_FD)],
                                 setsigmask=AGENTS_SIGNALS)  # until it ignores them: they are not for it
        finally:
            theirs.close()
        helper = _Helper(pid, os.pidfd_open(pid), ours)
        self._watch.add(helper.pidfd, lambda: self._died(helper))
        self._watch.add(ours.fileno(), lambda: self._readable(helper))
        return helper
