"""A spawn helper: a small single-threaded process that spawns, reaps and reports tasks for its worker agent.

`python -m worker.spawnhelper HOME_CGROUP RECORD_STARTTIME`, started by worker/helpers.py with its end of an
AF_UNIX SOCK_SEQPACKET socketpair as fd 3 (docs/architecture.md, "Spawn helpers").  Each frame the agent sends is
one or more msgpack requests back to back, with their file descriptors in order as SCM_RIGHTS; each frame the
helper sends back is one msgpack list of reports.  The helper moves itself (one thread: cheap) into a task's
cgroup for its posix_spawn, is the task's parent, so it reaps it and reports its wait status.  When the agent
goes away (end of file on the socket) it kills its tasks' process groups and exits: a new run of the rank would
kill them anyway.
"""
from __future__ import annotations

import array
import contextlib
import fcntl
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from worker.containment import populated, starttime
from worker.memlimit import TaskMemoryGroup
from worker.spawn import STATUS_CANNOT_RUN, Order, SpawnError, Spawner, do_nothing, in_cgroup, killpg

CHANNEL_FD = 3
MAX_FDS = 250  # per frame: SCM_MAX_FD is 253
MAX_FRAME = 256 * 1024  # bytes of requests per frame, unless one request is larger
# What one frame may hold at most (the socket buffers are as large); execve refuses far less (ARG_MAX, 2 MiB).
MAX_PACKET = 4 << 20
MAX_REPORTS = 2000  # per frame
# The signals a helper ignores: meant for its agent (a terminal's Ctrl-C, a SIGTERM to the process group).
AGENTS_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})

_FDS_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Request:
    key: Key
    order: Order
    stdin: bool  # an fd for stdin comes first
    pipes: tuple[bool, bool]  # write ends for stdout, stderr come next
    group: str | None  # the task's cgroup v2 group (worker/containment.py)
    memory: tuple[str, str, int] | None  # its v1 memory group, the parent group, the limit in MiB

    def fd_count(self) -> int:
        return self.stdin + sum(self.pipes) + len(self.order.pass_fds)

    def pack(self) -> bytes:
        o = self.order
        return msgpack.packb([*self.key, o.argv, o.env, o.cwd, o.cores, o.user, o.stdout_path, o.stderr_path,
                              o.pass_fds, self.stdin, self.pipes, self.group, self.memory, o.umask])

    @classmethod
    def unpack(cls, fields: list[Any]) -> Request:
        job, task, argv, env, cwd, cores, user, out, err, passed, stdin, pipes, group, memory, umask = fields
        order = Order(tuple(argv), env, cwd, tuple(cores), tuple(user) if user else None, out, err, tuple(passed),
                      umask)
        return cls((job, task), order, stdin, tuple(pipes), group, tuple(memory) if memory else None)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """The channel: one packet per frame, so a frame and its descriptors arrive together or not at all."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_PACKET + 65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_PACKET + 65536)
    return ours, theirs


class Helper:
    def __init__(self, channel: socket.socket, home: str | None, record_starttime: bool) -> None:
        self.channel = channel
        self.home = home
        self.record_starttime = record_starttime
        self.spawner = Spawner(threads_share_cwd=False)
        # pid -> task, our peak RSS when we spawned it, its cgroup
        self.children: dict[int, tuple[Key, int, str | None]] = {}
        self.reports: list[list[Any]] = []
        self.buffer = bytearray(MAX_PACKET)  # received into, not allocated per packet

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # It lives as long as its channel: a terminal's Ctrl-C or a SIGTERM to the worker's process group is for the
        # agent, which still needs its helpers to end its tasks.  (Tasks get every signal's default back.)  The agent
        # spawned us with them blocked, so one that came while this interpreter started is dropped here.
        for sig in AGENTS_SIGNALS:
            signal.signal(sig, do_nothing)  # caught, not ignored: a disposition of SIG_IGN would pass to a guest's task
        signal.pthread_sigmask(signal.SIG_UNBLOCK, AGENTS_SIGNALS)
        poller = select.poll()
        poller.register(self.channel, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        self.channel.setblocking(False)
        while True:
            self.spawner.unbind()
            poller.poll()
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            if not self.take_requests():
                self.abandon()
                return
            self.reap()
            self.send_reports()

    def take_requests(self) -> bool:
        """Spawn what the agent asked for; False when the agent is gone."""
        while True:
            try:
                size, ancillary, _flags, _addr = self.channel.recvmsg_into([self.buffer], _FDS_SPACE,
                                                                           socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                return True
            if not size:
                return False
            fds = array.array("i")
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            requests = [Request.unpack(fields) for fields in _requests(self.buffer[:size])]
            fds = _above_targets(fds, requests)
            fds.reverse()
            for request in requests:
                mine = [fds.pop() for _ in range(request.fd_count())]
                try:
                    self.spawn(request, mine)
                finally:
                    for fd in mine:
                        os.close(fd)

    def spawn(self, request: Request, fds: list[int]) -> None:
        job, task = request.key
        it = iter(fds)
        stdin = next(it) if request.stdin else None
        pipes = (next(it) if request.pipes[0] else None, next(it) if request.pipes[1] else None)
        passed = list(it)
        try:
            pid = self.spawner.spawn(request.order, stdin, pipes, passed, self._groups(request))
        except SpawnError as e:
            self.reports.append(["f", job, task, e.status, str(e)])
            return
        except Exception as e:  # one bad request must not take the helper, and its other tasks, along
            self.reports.append(["f", job, task, STATUS_CANNOT_RUN, f"cannot start: {e}"])
            return
        self.children[pid] = ((job, task), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, request.group)
        self.reports.append(["s", job, task, pid, starttime(pid) if self.record_starttime else None])

    def _groups(self, request: Request) -> list[AbstractContextManager[None]]:
        groups: list[AbstractContextManager[None]] = []
        if request.memory is not None:
            path, parent, limit = request.memory
            groups.append(TaskMemoryGroup(Path(path), Path(parent), limit).spawning())
        if request.group is not None:
            assert self.home is not None
            groups.append(in_cgroup(request.group, self.home))
        return groups

    def reap(self) -> None:
        while self.children:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            (job, task), spawner_rss, group = child
            # ru_maxrss is never less than ours when we spawned it (posix_spawn's child shares our memory until
            # it execs): only a larger value is the task's.
            rss = ru.ru_maxrss if ru.ru_maxrss > spawner_rss else 0
            # Whether its cgroup is empty now, so stays so: the agent then reuses it without reading it again.
            empty = group is not None and not populated(group)
            self.reports.append(["x", job, task, status, ru.ru_utime + ru.ru_stime, rss, time.time(), empty])

    def send_reports(self) -> None:
        self.channel.setblocking(True)  # the agent reads while it runs: waiting here is waiting for it
        try:
            while self.reports:
                chunk, self.reports = self.reports[:MAX_REPORTS], self.reports[MAX_REPORTS:]
                self.channel.send(msgpack.packb(chunk))
        except (BrokenPipeError, ConnectionResetError):
            self.reports.clear()  # the agent is gone: the next read says so
        finally:
            self.channel.setblocking(False)

    def abandon(self) -> None:
        for pid in self.children:
            killpg(pid, signal.SIGKILL)


def _above_targets(fds: array.array[int], requests: Sequence[Request]) -> array.array[int]:
    """The frame's fds moved above every number a task sees a passed fd at: the dup2s of one spawn then overwrite
    none of the fds another spawn of the frame still needs, and a guest's spawn, which needs its passed fds at
    their numbers here (worker/spawn.py), finds them free."""
    floor = max((target + 1 for request in requests for target in request.order.pass_fds), default=0)
    if all(fd >= floor for fd in fds):
        return fds
    moved = array.array("i")
    for fd in fds:
        if fd >= floor:
            moved.append(fd)
            continue
        try:
            moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor))
        finally:
            os.close(fd)
    return moved


def _requests(data: bytes | bytearray) -> Iterator[list[Any]]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    yield from unpacker


def frames(requests: Sequence[tuple[bytes, int]]) -> Iterator[tuple[int, int]]:
    """Split packed requests (bytes, fd count) into frames: (start, end) index ranges within the limits."""
    start = size = nfds = 0
    for i, (packed, count) in enumerate(requests):
        if i > start and (size + len(packed) > MAX_FRAME or nfds + count > MAX_FDS):
            yield start, i
            start, size, nfds = i, 0, 0
        size += len(packed)
        nfds += count
    if start < len(requests):
        yield start, len(requests)


def main(argv: list[str]) -> None:
    home, record = argv[1], argv[2] == "1"
    # What the agent had open and inheritable when it spawned us (another task's PMI socket) is not ours to hold.
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX"))
    channel = socket.socket(fileno=CHANNEL_FD)
    os.set_inheritable(CHANNEL_FD, False)  # the tasks must not hold the agent's channel open
    Helper(channel, home or None, record).serve()


if __name__ == "__main__":
    main(sys.argv)
