"""Task execution on a worker: spawn, bind, capture, reap and kill real processes.

Everything here runs on the worker's single asyncio event loop and never
blocks it: processes are started with posix_spawn (no fork of the big worker
process), reaped through pidfds registered with the loop (no SIGCHLD handler,
no thread per child), and their output is read from non-blocking pipes.
Each task leads its own session/process group so signals reach grandchildren.

`TestExecutor` has the same interface but spawns nothing; it exists so the
control plane can be benchmarked at rates real processes cannot reach.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import resource
import errno
import functools
import logging
import os
import shutil
import signal as _signal
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable

from minicluster.model.idset import IdSet, IdSetError
from minicluster.model.text import cut
from worker.asuser import acting_as_user
from worker.containment import CgroupTasks, Subreaper, kill_orphans, starttime
from worker.fdwatch import FdWatch
from worker.jobenv import accelerator_env
from worker.memlimit import TaskMemoryGroup

log = logging.getLogger(__name__)

TaskKey = tuple[int, int]

READ_CHUNK = 64 * 1024
DRAIN_SECONDS = 0.5  # how long output may trail the exit of a task's main process
STATUS_NOT_FOUND = 127
STATUS_CANNOT_RUN = 126  # also used for every other spawn-time failure (cwd, cores, files)

_CLONE_FS = 0x200
# Python ignores SIGPIPE (and maybe more); ignored dispositions survive exec.
_RESET_SIGNALS = tuple(sorted(_signal.valid_signals() - {_signal.SIGKILL, _signal.SIGSTOP}))


@dataclass(frozen=True, slots=True)
class TaskSpec:
    key: TaskKey
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None = None
    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    stdout_path: str | None = None
    stderr_path: str | None = None
    pass_fds: tuple[int, ...] = ()
    # The read end of a pipe to use as stdin (the caller writes and closes the rest); None: /dev/null.
    stdin_fd: int | None = None
    # The memory cgroup to spawn the task in (worker/memlimit.py), if `--mem` is enforced here.
    memory_group: TaskMemoryGroup | None = None
    # (uid, gid) to open the output files and enter cwd as, when the task runs as another user than the worker.
    user: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class TaskResult:
    key: TaskKey
    status: int  # exit code, or 128+signal
    exit_code: int | None
    signal: int | None
    error: str | None  # why the task could not be started
    pid: int | None
    started: float
    ended: float
    # Accounting: utime + stime of the task and the children it waited for, and its peak RSS in KiB.
    cpu: float = 0.0
    max_rss: int = 0


OnOutput = Callable[[TaskKey, str, bytes], None]
OnExit = Callable[[TaskResult], None]


class _SpawnError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True, eq=False)
class _Task:
    key: TaskKey
    pid: int
    pidfd: int
    pipes: dict[int, str]  # read end -> "stdout" | "stderr"
    started: float
    starttime: int | None  # from /proc, for the orphan pidfile
    ended: float = 0.0
    waitstatus: int | None = None
    rusage: resource.struct_rusage | None = None  # wait4's, for the task's CPU time and peak RSS
    # This process's peak RSS when it spawned the task: posix_spawn's child shares our memory until it execs,
    # and the kernel keeps that high-water mark in the child's ru_maxrss.
    spawner_rss: int = 0
    kill_timer: asyncio.TimerHandle | None = None
    drain_timer: asyncio.TimerHandle | None = None


class _Executor:
    """Bookkeeping shared by the real and the mock executor."""

    def __init__(self, on_exit: OnExit) -> None:
        self._on_exit = on_exit
        self._tasks: dict = {}
        self._idle: asyncio.Future[None] | None = None

    @property
    def running(self) -> int:
        return len(self._tasks)

    def terminate(self, key: TaskKey, grace: float) -> None:
        raise NotImplementedError

    async def shutdown(self, grace: float) -> None:
        for key in list(self._tasks):
            self.terminate(key, grace)
        if self._tasks:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def _check_new(self, key: TaskKey) -> asyncio.AbstractEventLoop:
        if key in self._tasks:
            raise ValueError(f"task {key} is already running")
        return asyncio.get_running_loop()

    def _fail_soon(self, loop: asyncio.AbstractEventLoop, key: TaskKey, status: int,
                   error: str, started: float) -> None:
        result = TaskResult(key, status, None, None, error, None, started, time.time())
        loop.call_soon(self._on_exit, result)

    def _report(self, result: TaskResult) -> None:
        """Call after removing the task from self._tasks."""
        self._on_exit(result)
        if not self._tasks and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)


class TaskExecutor(_Executor):
    def __init__(self, on_output: OnOutput, on_exit: OnExit, pidfile: str | None = None,
                 containment: CgroupTasks | Subreaper | None = None) -> None:
        super().__init__(on_exit)
        self._on_output = on_output
        if pidfile and os.path.exists(pidfile):
            # What this rank's previous run left (a kill -9 of its worker, or of the broker for rank 0).
            killed = kill_orphans(pidfile)
            if killed:
                log.warning("killed %d task(s) left behind by this rank's previous run", killed)
        # In a cgroup tree every task is spawned inside its group, and the next run of this rank kills what the
        # tree holds (CgroupTasks.detect): no pidfile is kept then, saving a /proc read and a write per spawn.
        self._pidfile = None if isinstance(containment, CgroupTasks) else pidfile
        self._contained = containment
        self._next_sweep: asyncio.TimerHandle | None = None
        self._pidfile_fd: int | None = None
        self._pidfile_lines = 0
        self._allowed_cores = frozenset(os.sched_getaffinity(0))
        self._watch = FdWatch()  # every task's pidfd and output pipes
        # The cores the loop thread is bound to while it spawns; None: all of _allowed_cores (see _bind).
        self._bound: frozenset[int] | None = None
        self._private_cwd_threads: set[int] = set()

    def start(self, spec: TaskSpec) -> int | None:
        loop = self._check_new(spec.key)
        started = time.time()
        try:
            pid, pidfd, pipes = self._spawn(spec)
        except _SpawnError as e:
            self._fail_soon(loop, spec.key, e.status, str(e), started)
            return None
        task = _Task(spec.key, pid, pidfd, pipes, started,
                     starttime(pid) if self._pidfile else None)
        task.spawner_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._tasks[spec.key] = task
        self._watch.add(pidfd, functools.partial(self._on_pidfd, task))
        for fd in pipes:
            self._watch.add(fd, functools.partial(self._on_pipe, task, fd))
        self._record_pid(task)
        return pid

    def signal(self, key: TaskKey, sig: int) -> None:
        task = self._tasks.get(key)
        if task is not None:
            self._signal_all(task, sig)

    def _signal_all(self, task: _Task, sig: int) -> None:
        """The task's process group, and in a cgroup tree also what left that group."""
        _killpg(task.pid, sig)
        if isinstance(self._contained, CgroupTasks):
            self._contained.signal(task.key, sig)

    def terminate(self, key: TaskKey, grace: float) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        if grace <= 0:
            self._signal_all(task, _signal.SIGKILL)
            return
        self._signal_all(task, _signal.SIGTERM)
        self._signal_all(task, _signal.SIGCONT)  # a stopped task could not act on SIGTERM
        if task.kill_timer is None:
            task.kill_timer = asyncio.get_running_loop().call_later(
                grace, self._signal_all, task, _signal.SIGKILL)

    async def shutdown(self, grace: float) -> None:
        await super().shutdown(grace)
        if self._next_sweep is not None:
            self._next_sweep.cancel()
        self._watch.close()
        self._write_pidfile()
        if isinstance(self._contained, CgroupTasks):
            self._contained.close()

    # -- spawning ---------------------------------------------------------

    def _spawn(self, spec: TaskSpec) -> tuple[int, int, dict[int, str]]:
        path = _resolve(spec)
        if spec.cwd is not None and not _is_dir(spec.cwd, spec.user):
            raise _SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(spec.cwd)}: no such directory")
        bad = sorted(set(spec.cores) - self._allowed_cores)
        if bad:
            raise _SpawnError(STATUS_CANNOT_RUN, f"cores {bad} are not in this worker's"
                              f" allowed set {sorted(self._allowed_cores)}")
        if any(fd < 3 for fd in spec.pass_fds):
            raise _SpawnError(STATUS_CANNOT_RUN, f"pass_fds {spec.pass_fds}: 0-2 are taken")
        env = accelerator_env(spec.env, spec.gpus)
        pipes: dict[int, str] = {}
        child_fds: list[int] = []
        try:
            child_fds.append(_open_output("stdout", spec.stdout_path, pipes, spec.user))
            if spec.stderr_path is not None and spec.stderr_path == spec.stdout_path:
                child_fds.append(_dup_output(child_fds[0]))  # one file for both (--output): opened once
            else:
                child_fds.append(_open_output("stderr", spec.stderr_path, pipes, spec.user))
            stdin = ((os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0) if spec.stdin_fd is None
                     else (os.POSIX_SPAWN_DUP2, spec.stdin_fd, 0))
            actions = [stdin,
                       (os.POSIX_SPAWN_DUP2, child_fds[0], 1),
                       (os.POSIX_SPAWN_DUP2, child_fds[1], 2)]
            # dup2 onto itself clears close-on-exec in the child only.
            actions += [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in spec.pass_fds]
            pid = self._spawn_bound(path, spec, env, actions)
        except BaseException:
            for fd in pipes:
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        return pid, _pidfd_or_kill(pid, pipes), pipes

    def _spawn_bound(self, path: str, spec: TaskSpec, env: dict[str, str],
                     actions: list[tuple]) -> int:
        # posix_spawn can set neither affinity nor cwd, and the child copies
        # both from the calling thread, so the thread wears them briefly.
        # Affinity is per-thread on Linux; cwd is made per-thread by unshare.
        saved_cwd = None
        try:
            if spec.cores:
                self._bind(frozenset(spec.cores))
            if spec.cwd is not None:
                self._make_cwd_private()
                saved_cwd = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
                _chdir(spec.cwd, spec.user)
            with spec.memory_group.spawning() if spec.memory_group else contextlib.nullcontext(), \
                    self._contained.spawning(spec.key) if isinstance(self._contained, CgroupTasks) \
                    else contextlib.nullcontext():
                return os.posix_spawn(path, list(spec.argv), env, file_actions=actions,
                                      setsid=True, setsigmask=(), setsigdef=_RESET_SIGNALS)
        except OSError as e:
            status = STATUS_NOT_FOUND if e.errno == errno.ENOENT else STATUS_CANNOT_RUN
            raise _SpawnError(status, f"{cut(spec.argv[0])}: {e.strerror}") from None
        except ValueError as e:  # a NUL byte in argv or env, or '=' in an env name: nothing execve could carry
            raise _SpawnError(STATUS_CANNOT_RUN, f"{cut(spec.argv[0])}: {e}") from None
        finally:
            if saved_cwd is not None:
                os.fchdir(saved_cwd)
                os.close(saved_cwd)

    def _bind(self, cores: frozenset[int]) -> None:
        """Bind the loop thread to `cores` for the next spawn: once per batch of spawns, not twice per task.

        Every sched_setaffinity migrates the thread to another CPU.  So the mask stays on while the spawns of one
        loop iteration (a `run` message) go on, and the worker's own mask is put back once, after them; tasks on
        the same cores (or on all of the worker's) need no change at all.
        """
        current = self._bound or self._allowed_cores
        if cores == current:
            return
        os.sched_setaffinity(0, cores)
        if self._bound is None:
            asyncio.get_running_loop().call_soon(self._unbind)
        self._bound = cores

    def _unbind(self) -> None:
        if self._bound is not None:
            self._bound = None
            os.sched_setaffinity(0, self._allowed_cores)

    def _make_cwd_private(self) -> None:
        tid = threading.get_ident()
        if tid in self._private_cwd_threads:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_FS) != 0:
            log.warning("unshare(CLONE_FS) failed (%s): other threads may briefly see"
                        " a task's cwd", os.strerror(ctypes.get_errno()))
        self._private_cwd_threads.add(tid)

    # -- reaping and output -----------------------------------------------

    def _on_pidfd(self, task: _Task) -> None:
        try:
            pid, status, task.rusage = os.wait4(task.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = task.pid, None  # reaped behind our back: status unknown
        if pid == 0:
            return
        loop = asyncio.get_running_loop()
        self._watch.remove(task.pidfd)
        os.close(task.pidfd)
        task.ended = time.time()
        task.waitstatus = status
        if task.pipes:
            # A background grandchild may hold the pipes open indefinitely.
            task.drain_timer = loop.call_later(DRAIN_SECONDS, self._finish, task)
        else:
            self._finish(task)

    def _on_pipe(self, task: _Task, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        if data:
            self._on_output(task.key, task.pipes[fd], data)
            return
        self._close_pipe(task, fd)
        if not task.pipes and task.ended:
            self._finish(task)

    def _close_pipe(self, task: _Task, fd: int) -> None:
        self._watch.remove(fd)
        os.close(fd)
        del task.pipes[fd]

    def _finish(self, task: _Task) -> None:
        for timer in (task.drain_timer, task.kill_timer):
            if timer is not None:
                timer.cancel()
        for fd, name in list(task.pipes.items()):
            # Take what is already buffered, but not forever from a chatty straggler.
            for _ in range(16):
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._on_output(task.key, name, data)
            self._close_pipe(task, fd)
        # Leftover group members would otherwise outlive the task unaccounted.
        _killpg(task.pid, _signal.SIGKILL)
        del self._tasks[task.key]
        if isinstance(self._contained, CgroupTasks):
            self._contained.kill(task.key)
        elif self._contained is not None:
            self._sweep_orphans()
        if self._pidfile_lines > 2 * len(self._tasks) + 256:
            self._write_pidfile()
        self._report(_result(task))

    # -- orphan bookkeeping -------------------------------------------------

    def _sweep_orphans(self) -> None:
        assert isinstance(self._contained, Subreaper)
        if self._next_sweep is not None:
            self._next_sweep.cancel()
        killed = self._contained.sweep(set(self._tasks), {t.pid for t in self._tasks.values()})
        # A killed orphan's own children are orphaned in turn: sweep again soon. Otherwise once a second: an orphan
        # killed with its task's group may only become ours, a zombie to reap, after the sweep at the task's end.
        self._next_sweep = asyncio.get_running_loop().call_later(0.05 if killed else 1.0, self._sweep_orphans)

    def _record_pid(self, task: _Task) -> None:
        """Append the new task to the pidfile: one write(2) per spawn.

        Ended tasks stay listed until the next compaction; that is harmless because containment.kill_orphans only kills
        a pid whose start time still matches.
        """
        if not self._pidfile:
            return
        try:
            if self._pidfile_fd is None:
                self._write_pidfile()  # lists every running task, this one included
                return
            os.write(self._pidfile_fd, f"{task.pid} {task.pid} {task.starttime}\n".encode())
        except OSError as exc:
            # A full disk: the task runs all the same; only a restart of this worker would miss it.
            log.warning("could not record task pid %d in %s: %s", task.pid, self._pidfile, exc)
            return
        self._pidfile_lines += 1

    def _write_pidfile(self) -> None:
        """Rewrite the pidfile with just the running tasks (start-up, compaction, shutdown)."""
        if not self._pidfile:
            return
        tmp = f"{self._pidfile}.tmp"
        with open(tmp, "w") as f:
            f.writelines(f"{t.pid} {t.pid} {t.starttime}\n" for t in self._tasks.values())
        os.replace(tmp, self._pidfile)
        if self._pidfile_fd is not None:
            os.close(self._pidfile_fd)
        self._pidfile_fd = os.open(self._pidfile, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._pidfile_lines = len(self._tasks)


def _resolve(spec: TaskSpec) -> str:
    """argv[0] looked up like execvp, but with the task's PATH and cwd."""
    if not spec.argv:
        raise _SpawnError(STATUS_NOT_FOUND, "empty argv")
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
            raise _SpawnError(STATUS_CANNOT_RUN, f"{cut(name)}: permission denied")
    raise _SpawnError(STATUS_NOT_FOUND, f"{cut(name)}: command not found")


def _is_dir(path: str, user: tuple[int, int] | None) -> bool:
    """Whether `path` is a directory, as `user` sees it: a guest learns nothing of what it may not look into."""
    try:
        with acting_as_user(user):
            return os.path.isdir(path)
    except OSError as e:
        raise _SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(path)}: {e}") from None


def _chdir(cwd: str, user: tuple[int, int] | None) -> None:
    try:
        with acting_as_user(user):
            os.chdir(cwd)
    except OSError as e:
        raise _SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(cwd)}: {e.strerror}") from None


def _open_output(name: str, path: str | None, pipes: dict[int, str], user: tuple[int, int] | None) -> int:
    """The fd the child gets as stdout/stderr, a file opened as `user`; pipe read ends are added to `pipes`."""
    if path is not None:
        try:
            with acting_as_user(user):
                return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
            raise _SpawnError(STATUS_CANNOT_RUN, f"{name} {cut(path)}: {getattr(e, 'strerror', None) or e}") from None
    try:
        r, w = os.pipe2(os.O_CLOEXEC)
    except OSError as e:  # EMFILE: the worker is out of fds, not the user's fault
        raise _SpawnError(STATUS_CANNOT_RUN, f"{name} pipe: {e.strerror}") from None
    os.set_blocking(r, False)  # not O_NONBLOCK on pipe2: the child's end must block
    pipes[r] = name
    return w


def _dup_output(fd: int) -> int:
    try:
        return os.dup(fd)  # close-on-exec, like every fd of ours: the child gets it by its file action only
    except OSError as e:
        raise _SpawnError(STATUS_CANNOT_RUN, f"stderr: {e.strerror}") from None


def _pidfd_or_kill(pid: int, pipes: dict[int, str]) -> int:
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        # Without a pidfd we cannot reap without blocking: undo the spawn.
        _killpg(pid, _signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in pipes:
            os.close(fd)
        raise _SpawnError(STATUS_CANNOT_RUN, f"pidfd_open: {e.strerror}") from None


def _result(task: _Task) -> TaskResult:
    ws = task.waitstatus
    if ws is None:
        return TaskResult(task.key, 255, None, None, "exit status lost (reaped elsewhere)",
                          task.pid, task.started, task.ended)
    if os.WIFSIGNALED(ws):
        result = _exited(task.key, task.pid, None, os.WTERMSIG(ws), task.started, task.ended)
    else:
        result = _exited(task.key, task.pid, os.WEXITSTATUS(ws), None, task.started, task.ended)
    ru = task.rusage
    if ru is None:
        return result
    # ru_maxrss (KiB) is the largest single process among the task and the children it waited for, but never less
    # than the spawner's own peak (see spawner_rss): only a larger value is the task's; else it is not known here.
    rss = ru.ru_maxrss if ru.ru_maxrss > task.spawner_rss else 0
    return dataclasses.replace(result, cpu=ru.ru_utime + ru.ru_stime, max_rss=rss)


def _exited(key: TaskKey, pid: int, code: int | None, sig: int | None,
            started: float, ended: float) -> TaskResult:
    # Exactly one of code and sig is given (os.WIFSIGNALED decides which).
    status = 128 + sig if sig is not None else code if code is not None else 0
    return TaskResult(key, status, code, sig, None, pid, started, ended)


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


# -- mock execution ----------------------------------------------------------

# Above the largest possible pid_max, so a stray kill() can never hit a real process.
_FAKE_PID_BASE = 1 << 22


@functools.lru_cache(maxsize=16)
def _idset(text: str) -> IdSet:
    return IdSet.parse(text)
# Signals whose default action does not end a process.
_NON_FATAL = frozenset({0, _signal.SIGCHLD, _signal.SIGCONT, _signal.SIGURG, _signal.SIGWINCH,
                        _signal.SIGSTOP, _signal.SIGTSTP, _signal.SIGTTIN, _signal.SIGTTOU})


@dataclass(slots=True, eq=False)
class _MockTask:
    key: TaskKey
    pid: int
    code: int
    started: float
    sig: int | None = None
    timer: asyncio.TimerHandle | None = None
    done: bool = False


class TestExecutor(_Executor):
    """Pretends to run tasks: each lasts MC_TEST_RUN_DURATION s and exits MC_TEST_EXIT_CODE.

    MC_TEST_FAIL_ONCE=IDSET makes the first attempt (MC_TASK_ATTEMPT 0) of those array indexes exit
    MC_TEST_FAIL_CODE (default 1) instead, so retries can be measured (benchmarks/workflows.py).

    Zero-length tasks complete in one batch on the next loop iteration, so the
    cost per task is a few dict operations and a TaskResult.
    """
    __test__ = False  # not a pytest test class despite the name

    def __init__(self, on_output: OnOutput, on_exit: OnExit, pidfile: str | None = None) -> None:
        # on_output and pidfile are accepted for interface parity: nothing runs,
        # so there is neither output nor a process to record.
        super().__init__(on_exit)
        self._due: list[_MockTask] = []
        self._next_pid = _FAKE_PID_BASE

    def start(self, spec: TaskSpec) -> int | None:
        loop = self._check_new(spec.key)
        started = time.time()
        try:
            duration = float(spec.env.get("MC_TEST_RUN_DURATION", "0"))
            code = int(spec.env.get("MC_TEST_EXIT_CODE", "0"))
            fail_once = spec.env.get("MC_TEST_FAIL_ONCE")
            if fail_once and spec.env.get("MC_TASK_ATTEMPT", "0") == "0" and \
                    int(spec.env.get("MC_TASK_INDEX", "-1")) in _idset(fail_once):
                code = int(spec.env.get("MC_TEST_FAIL_CODE", "1"))
        except (ValueError, IdSetError) as e:
            self._fail_soon(loop, spec.key, STATUS_CANNOT_RUN, f"mock task: {e}", started)
            return None
        self._next_pid += 1
        task = _MockTask(spec.key, self._next_pid, code, started)
        self._tasks[spec.key] = task
        if duration > 0:
            task.timer = loop.call_later(duration, self._complete, task)
        else:
            self._make_due(task, loop)
        return task.pid

    def signal(self, key: TaskKey, sig: int) -> None:
        task = self._tasks.get(key)
        if task is None or sig in _NON_FATAL or task.sig is not None:
            return
        task.sig = sig
        if task.timer is not None:
            task.timer.cancel()
        self._make_due(task, asyncio.get_running_loop())

    def terminate(self, key: TaskKey, grace: float) -> None:
        self.signal(key, _signal.SIGTERM)

    def _make_due(self, task: _MockTask, loop: asyncio.AbstractEventLoop) -> None:
        self._due.append(task)
        if len(self._due) == 1:
            loop.call_soon(self._complete_due)

    def _complete_due(self) -> None:
        due, self._due = self._due, []
        for task in due:
            self._complete(task)

    def _complete(self, task: _MockTask) -> None:
        if task.done:
            return
        task.done = True
        del self._tasks[task.key]
        code = task.code if task.sig is None else None
        self._report(_exited(task.key, task.pid, code, task.sig, task.started, time.time()))
