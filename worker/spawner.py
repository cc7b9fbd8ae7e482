"""Spawning tasks off the event loop (issue 17 item 2): posix_spawn and the system calls around it.

Everything a spawn needs (resolving argv[0], opening the output files or pipes, entering the task's cgroup, binding
to its cores, changing to its cwd, posix_spawn itself and pidfd_open) runs on spawner threads, never on the
worker's event loop: posix_spawn releases the GIL while the child is created and execs, so the loop goes on with
messages, exits and output meanwhile.  Finished spawns go back to the loop in batches, with one wake-up for all
of those that finished while it was busy.

Each spawner thread binds itself (affinity is per thread on Linux) and changes its own cwd (made per thread with
unshare(CLONE_FS)), so the loop's thread never wears a task's cores or cwd.  The threads are more on larger
nodes: a node's spawn rate then grows with its cores.  In a cgroup tree (worker/containment.py) a spawn moves the
whole process into the task's group, so such a worker spawns on one thread.

The caller's fds a spawn uses (stdin, pass_fds) are duplicated when the spawn is asked for: the caller may close
its own as soon as `submit` returns.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import queue
import resource
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minicluster.model.text import cut
from worker.asuser import acting_as_user
from worker.containment import CgroupTasks, Subreaper, starttime
from worker.jobenv import accelerator_env

if TYPE_CHECKING:
    from worker.executor import TaskSpec

log = logging.getLogger(__name__)

STATUS_NOT_FOUND = 127
STATUS_CANNOT_RUN = 126  # also used for every other spawn-time failure (cwd, cores, files)
# One spawner thread per this many cores of the worker, at least one and at most MAX_THREADS.
CORES_PER_THREAD = 16
MAX_THREADS = 8

_CLONE_FS = 0x200
# Python ignores SIGPIPE (and maybe more); ignored dispositions survive exec.
_RESET_SIGNALS = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))


class SpawnError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True, eq=False)
class Spawned:
    """How one spawn ended: a running child (pid, pidfd, its output pipes), or `error`."""
    spec: TaskSpec
    started: float
    pid: int = 0
    pidfd: int = -1
    pipes: dict[int, str] = field(default_factory=dict)  # read end -> "stdout" | "stderr"
    starttime: int | None = None  # from /proc, for the orphan pidfile
    # This process's peak RSS at the spawn: posix_spawn's child shares our memory until it execs, and the kernel
    # keeps that high-water mark in the child's ru_maxrss.
    spawner_rss: int = 0
    error: SpawnError | None = None


@dataclass(slots=True)
class _Request:
    spec: TaskSpec
    started: float
    stdin: int | None  # our duplicate of spec.stdin_fd
    passed: tuple[int, ...]  # our duplicates of spec.pass_fds, in their order


@dataclass(slots=True)
class _ThreadState:
    bound: frozenset[int] | None = None  # the cores this thread is bound to; None: all the worker's
    private_cwd: bool = False


def thread_count(cores: int, moves_process: bool) -> int:
    """Spawner threads for a worker of `cores`; one where a spawn moves the whole process (a cgroup tree)."""
    if moves_process:
        return 1
    return max(1, min(MAX_THREADS, cores // CORES_PER_THREAD))


class Spawner:
    """Spawner threads; `deliver` gets every finished spawn on the event loop, in order of completion."""

    def __init__(self, allowed_cores: frozenset[int], containment: CgroupTasks | Subreaper | None,
                 deliver: Callable[[list[Spawned]], None], read_starttime: bool) -> None:
        self._allowed = allowed_cores
        self._contained = containment
        self._deliver = deliver
        self._read_starttime = read_starttime
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._ready: list[Spawned] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = [threading.Thread(target=self._serve, name=f"mc-spawner-{i}", daemon=True)
                         for i in range(thread_count(len(allowed_cores), isinstance(containment, CgroupTasks)))]

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, spec: TaskSpec, started: float) -> None:
        """Spawn `spec` on a spawner thread; must be called on the event loop that gets the result."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            for thread in self._threads:
                thread.start()
        owned: list[int] = []
        try:
            stdin = _dup(spec.stdin_fd, owned) if spec.stdin_fd is not None else None
            passed = tuple(_dup(fd, owned) for fd in spec.pass_fds)
        except SpawnError as exc:
            for fd in owned:
                os.close(fd)
            self._hand_over(Spawned(spec, started, error=exc))
            return
        self._requests.put(_Request(spec, started, stdin, passed))

    def close(self) -> None:
        """Let the threads end once the spawns asked for are done."""
        for _ in self._threads:
            self._requests.put(None)

    # -- on the spawner threads ---------------------------------------------

    def _serve(self) -> None:
        state = _ThreadState()
        while (request := self._requests.get()) is not None:
            try:
                spawned = self._spawn(request, state)
            except SpawnError as exc:
                spawned = Spawned(request.spec, request.started, error=exc)
            except Exception as exc:  # a thread that dies would leave its tasks starting forever
                log.exception("spawning task %s failed", request.spec.key)
                spawned = Spawned(request.spec, request.started,
                                  error=SpawnError(STATUS_CANNOT_RUN, f"cannot start: {cut(str(exc))}"))
            finally:
                for fd in (request.stdin, *request.passed):
                    if fd is not None:
                        os.close(fd)
            self._hand_over(spawned)

    def _hand_over(self, spawned: Spawned) -> None:
        with self._lock:
            self._ready.append(spawned)
            wake = len(self._ready) == 1  # else a wake-up is on its way and takes this one along
        if wake:
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._deliver_ready)
            except RuntimeError:  # the loop is closed: the worker is going away, its next run kills what is left
                log.warning("task %s spawned after the event loop closed", spawned.spec.key)

    def _deliver_ready(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        self._deliver(ready)

    def _spawn(self, request: _Request, state: _ThreadState) -> Spawned:
        spec = request.spec
        path = _resolve(spec)
        if spec.cwd is not None and not _is_dir(spec.cwd, spec.user):
            raise SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(spec.cwd)}: no such directory")
        bad = sorted(set(spec.cores) - self._allowed)
        if bad:
            raise SpawnError(STATUS_CANNOT_RUN, f"cores {bad} are not in this worker's"
                             f" allowed set {sorted(self._allowed)}")
        if any(fd < 3 for fd in spec.pass_fds):
            raise SpawnError(STATUS_CANNOT_RUN, f"pass_fds {spec.pass_fds}: 0-2 are taken")
        env = accelerator_env(spec.env, spec.gpus)
        pipes: dict[int, str] = {}
        child_fds: list[int] = []
        try:
            child_fds.append(_open_output("stdout", spec.stdout_path, pipes, spec.user))
            if spec.stderr_path is not None and spec.stderr_path == spec.stdout_path:
                child_fds.append(_dup_output(child_fds[0]))  # one file for both (--output): opened once
            else:
                child_fds.append(_open_output("stderr", spec.stderr_path, pipes, spec.user))
            stdin = ((os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0) if request.stdin is None
                     else (os.POSIX_SPAWN_DUP2, request.stdin, 0))
            actions = [stdin, (os.POSIX_SPAWN_DUP2, child_fds[0], 1), (os.POSIX_SPAWN_DUP2, child_fds[1], 2)]
            # Last: a passed fd's number may be that of an output fd opened since its owner closed it.
            actions += [(os.POSIX_SPAWN_DUP2, ours, theirs) for ours, theirs in zip(request.passed, spec.pass_fds,
                                                                                   strict=True)]
            pid = self._spawn_bound(path, spec, env, actions, state)
        except BaseException:
            for fd in pipes:
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        return Spawned(spec, request.started, pid, _pidfd_or_kill(pid, pipes), pipes,
                       starttime(pid) if self._read_starttime else None,
                       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    def _spawn_bound(self, path: str, spec: TaskSpec, env: dict[str, str], actions: list[tuple],
                     state: _ThreadState) -> int:
        # posix_spawn can set neither affinity nor cwd, and the child copies both from the calling thread, so
        # this thread wears them: its affinity stays until a spawn needs another, its cwd is put back.
        saved_cwd = None
        try:
            wanted = frozenset(spec.cores) if spec.cores else None
            if wanted != state.bound:
                os.sched_setaffinity(0, wanted or self._allowed)
                state.bound = wanted
            if spec.cwd is not None:
                _make_cwd_private(state)
                saved_cwd = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
                _chdir(spec.cwd, spec.user)
            with spec.memory_group.spawning() if spec.memory_group else contextlib.nullcontext(), \
                    self._contained.spawning(spec.key) if isinstance(self._contained, CgroupTasks) \
                    else contextlib.nullcontext():
                return os.posix_spawn(path, list(spec.argv), env, file_actions=actions,
                                      setsid=True, setsigmask=(), setsigdef=_RESET_SIGNALS)
        except OSError as e:
            status = STATUS_NOT_FOUND if e.errno == errno.ENOENT else STATUS_CANNOT_RUN
            raise SpawnError(status, f"{cut(spec.argv[0])}: {e.strerror}") from None
        except ValueError as e:  # a NUL byte in argv or env, or '=' in an env name: nothing execve could carry
            raise SpawnError(STATUS_CANNOT_RUN, f"{cut(spec.argv[0])}: {e}") from None
        finally:
            if saved_cwd is not None:
                os.fchdir(saved_cwd)
                os.close(saved_cwd)


def _make_cwd_private(state: _ThreadState) -> None:
    if state.private_cwd:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_FS) != 0:
        log.warning("unshare(CLONE_FS) failed (%s): other threads may briefly see a task's cwd",
                    os.strerror(ctypes.get_errno()))
    state.private_cwd = True


def _dup(fd: int, owned: list[int]) -> int:
    try:
        ours = os.dup(fd)  # close-on-exec: the child gets it by its file action only
    except OSError as e:
        raise SpawnError(STATUS_CANNOT_RUN, f"fd {fd}: {e.strerror}") from None
    owned.append(ours)
    return ours


def _resolve(spec: TaskSpec) -> str:
    """argv[0] looked up like execvp, but with the task's PATH and cwd."""
    if not spec.argv:
        raise SpawnError(STATUS_NOT_FOUND, "empty argv")
    name = spec.argv[0]
    if "/" in name:
        candidates = [os.path.join(spec.cwd or "", name)]
    else:
        search = spec.env.get("PATH", os.defpath)
        found = shutil.which(name, path=search)
        if found:
            return os.path.abspath(found)
        candidates = [os.path.join(d or ".", name) for d in search.split(os.pathsep)]
    for c in candidates:
        if os.path.isfile(c):
            if os.access(c, os.X_OK):
                return os.path.abspath(c)
            raise SpawnError(STATUS_CANNOT_RUN, f"{cut(name)}: permission denied")
    raise SpawnError(STATUS_NOT_FOUND, f"{cut(name)}: command not found")


def _is_dir(path: str, user: tuple[int, int] | None) -> bool:
    """Whether `path` is a directory, as `user` sees it: a guest learns nothing of what it may not look into."""
    try:
        with acting_as_user(user):
            return os.path.isdir(path)
    except OSError as e:
        raise SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(path)}: {e}") from None


def _chdir(cwd: str, user: tuple[int, int] | None) -> None:
    try:
        with acting_as_user(user):
            os.chdir(cwd)
    except OSError as e:
        raise SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(cwd)}: {e.strerror}") from None


def _open_output(name: str, path: str | None, pipes: dict[int, str], user: tuple[int, int] | None) -> int:
    """The fd the child gets as stdout/stderr, a file opened as `user`; pipe read ends are added to `pipes`."""
    if path is not None:
        try:
            with acting_as_user(user):
                return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
            raise SpawnError(STATUS_CANNOT_RUN, f"{name} {cut(path)}: {getattr(e, 'strerror', None) or e}") from None
    try:
        r, w = os.pipe2(os.O_CLOEXEC)
    except OSError as e:  # EMFILE: the worker is out of fds, not the user's fault
        raise SpawnError(STATUS_CANNOT_RUN, f"{name} pipe: {e.strerror}") from None
    os.set_blocking(r, False)  # not O_NONBLOCK on pipe2: the child's end must block
    pipes[r] = name
    return w


def _dup_output(fd: int) -> int:
    try:
        return os.dup(fd)  # close-on-exec, like every fd of ours: the child gets it by its file action only
    except OSError as e:
        raise SpawnError(STATUS_CANNOT_RUN, f"stderr: {e.strerror}") from None


def _pidfd_or_kill(pid: int, pipes: dict[int, str]) -> int:
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        # Without a pidfd we cannot reap without blocking: undo the spawn.
        killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in pipes:
            os.close(fd)
        raise SpawnError(STATUS_CANNOT_RUN, f"pidfd_open: {e.strerror}") from None


def killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
