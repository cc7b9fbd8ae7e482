"""Task execution on a worker: spawn, bind, capture, reap and kill real processes.

Everything here runs on the worker's single asyncio event loop and never
blocks it: processes are started with posix_spawn (worker/spawn.py: no fork
of the big worker process), either on the loop or by spawn helper processes
(worker/helpers.py), which reap theirs and report how they ended.  Tasks
spawned on the loop are reaped through pidfds registered with the loop (no
SIGCHLD handler, no thread per child); output is read from non-blocking pipes.
Each task leads its own session/process group so signals reach grandchildren.

`TestExecutor` has the same interface but spawns nothing; it exists so the
control plane can be benchmarked at rates real processes cannot reach.
"""
from __future__ import annotations

import asyncio
import resource
import functools
import logging
import os
import signal as _signal
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable

from minicluster.model.idset import IdSet, IdSetError
from worker.containment import CgroupTasks, Subreaper, kill_orphans, starttime
from worker.fdwatch import FdWatch
from worker.helpers import LARGEST_ORDER, SpawnHelpers
from worker.jobenv import accelerator_env
from worker.memlimit import TaskMemoryGroup
from worker.spawn import STATUS_CANNOT_RUN, STATUS_NOT_FOUND, Order, SpawnError, Spawner, killpg
from worker.spawnhelper import Request

__all__ = ["STATUS_CANNOT_RUN", "STATUS_NOT_FOUND", "TaskExecutor", "TaskResult", "TaskSpec", "TestExecutor"]

log = logging.getLogger(__name__)

TaskKey = tuple[int, int]

READ_CHUNK = 64 * 1024
DRAIN_SECONDS = 0.5  # how long output may trail the exit of a task's main process


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
    # The task's umask, its output files' too (None: the worker's own).
    umask: int | None = None


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


@dataclass(slots=True, eq=False)
class _Task:
    key: TaskKey
    pid: int  # 0 while a spawn helper has not reported it spawned
    pidfd: int  # -1 for a helper's task: the helper reaps it
    pipes: dict[int, str]  # read end -> "stdout" | "stderr"
    started: float
    starttime: int | None = None  # from /proc, for the orphan pidfile
    ended: float = 0.0
    waitstatus: int | None = None
    lost: str | None = None  # why its exit status is not known
    group_empty: bool = False  # its cgroup was empty when its helper reaped it
    # Accounting: utime + stime of the task and the children it waited for, and its peak RSS in KiB.
    cpu: float = 0.0
    max_rss: int = 0
    # This process's peak RSS when it spawned the task: posix_spawn's child shares our memory until it execs,
    # and the kernel keeps that high-water mark in the child's ru_maxrss.
    spawner_rss: int = 0
    # Sent while a helper spawns it: (signal, grace), a grace for a terminate; replayed once it runs.
    pending: list[tuple[int, float | None]] = field(default_factory=list)
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
                 containment: CgroupTasks | Subreaper | None = None, spawn_helpers: int = 0) -> None:
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
        self._watch = FdWatch()  # every task's pidfd and output pipes, and the helpers' channels
        self._spawner = Spawner(threads_share_cwd=True)
        self._unbind_scheduled = False
        self._helper_count = spawn_helpers
        self._helpers: SpawnHelpers | None = None  # started with the first task

    def start(self, spec: TaskSpec) -> int | None:
        """Spawn the task; its pid, or None when a helper spawns it or it failed (on_exit says how it ends)."""
        loop = self._check_new(spec.key)
        started = time.time()
        order = Order(spec.argv, accelerator_env(spec.env, spec.gpus), spec.cwd, spec.cores, spec.user,
                      spec.stdout_path, spec.stderr_path, spec.pass_fds, spec.umask)
        try:
            pipes, writes = _pipes(order)
        except SpawnError as e:
            self._fail_soon(loop, spec.key, e.status, str(e), started)
            return None
        # Another user's task is forked (worker/spawn.py): by a small helper, as the agent's fork costs milliseconds.
        # A task with a cwd or umask too where the loop thread cannot have them of its own (a pod's seccomp profile
        # forbids unshare): a helper has one thread, so no other thread sees the cwd or umask it wears for the spawn.
        cwd_seen = self._spawner.wears_fs(order) and not self._spawner.cwd_is_private()
        if (self._helper_count or spec.user is not None or cwd_seen) and order.size() <= LARGEST_ORDER:
            self._start_in_helper(spec, order, started, pipes, writes)
            return None
        try:
            pid = self._spawn_here(spec, order, pipes, writes)
            pidfd = _pidfd_or_kill(pid, pipes)
        except SpawnError as e:
            self._fail_soon(loop, spec.key, e.status, str(e), started)
            return None
        task = _Task(spec.key, pid, pidfd, pipes, started, starttime(pid) if self._pidfile else None)
        task.spawner_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._add(task)
        self._record_pid(task)
        return pid

    def _add(self, task: _Task) -> None:
        self._tasks[task.key] = task
        if task.pidfd >= 0:
            self._watch.add(task.pidfd, functools.partial(self._on_pidfd, task))
        for fd in task.pipes:
            self._watch.add(fd, functools.partial(self._on_pipe, task, fd))

    def signal(self, key: TaskKey, sig: int) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        if not task.pid:
            task.pending.append((sig, None))
            return
        self._signal_all(task, sig)

    def _signal_all(self, task: _Task, sig: int) -> None:
        """The task's process group, and in a cgroup tree also what left that group."""
        killpg(task.pid, sig)
        if isinstance(self._contained, CgroupTasks):
            self._contained.signal(task.key, sig)

    def terminate(self, key: TaskKey, grace: float) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        if not task.pid:
            task.pending.append((_signal.SIGTERM, grace))
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
        if self._helpers is not None:
            await self._helpers.close()
        self._watch.close()
        self._write_pidfile()
        if isinstance(self._contained, CgroupTasks):
            self._contained.close()

    # -- spawning on the loop -----------------------------------------------

    def _spawn_here(self, spec: TaskSpec, order: Order, pipes: dict[int, str],
                    writes: tuple[int | None, int | None]) -> int:
        groups: list[AbstractContextManager[None]] = []
        if spec.memory_group is not None:
            groups.append(spec.memory_group.spawning())
        if isinstance(self._contained, CgroupTasks):
            groups.append(self._contained.spawning(spec.key))
        try:
            return self._spawner.spawn(order, spec.stdin_fd, writes, spec.pass_fds, groups)
        except BaseException:
            _close(pipes)
            raise
        finally:
            _close(writes)
            # One affinity change per batch: the loop thread keeps a task's mask while the spawns of one loop
            # iteration (a `run` message) go on, and gets the worker's back once, after them.
            if self._spawner.bound and not self._unbind_scheduled:
                self._unbind_scheduled = True
                asyncio.get_running_loop().call_soon(self._unbind)

    def _unbind(self) -> None:
        self._unbind_scheduled = False
        self._spawner.unbind()

    # -- spawning in a helper -----------------------------------------------

    def _start_in_helper(self, spec: TaskSpec, order: Order, started: float, pipes: dict[int, str],
                         writes: tuple[int | None, int | None]) -> None:
        fds: list[int] = []
        try:
            # Ours to hand over, in the request's order: the caller closes its own fds when start returns.
            if spec.stdin_fd is not None:
                fds.append(os.dup(spec.stdin_fd))
            fds += [fd for fd in writes if fd is not None]
            writes = (None, None)
            fds += [os.dup(fd) for fd in spec.pass_fds]
        except OSError as e:
            _close([*fds, *writes, *pipes])
            self._fail_soon(asyncio.get_running_loop(), spec.key, STATUS_CANNOT_RUN, f"dup: {e.strerror}", started)
            return
        if self._helpers is None:
            self._helpers = SpawnHelpers(max(self._helper_count, 1), _home(self._contained), self._pidfile is not None,
                                         self._watch, self._on_reports, self._on_lost)
        group = self._contained.take(spec.key) if isinstance(self._contained, CgroupTasks) else None
        memory = spec.memory_group
        request = Request(spec.key, order, spec.stdin_fd is not None,
                          (order.stdout_path is None, order.stderr_path is None), group,
                          (str(memory.path), str(memory.parent), memory.limit_mb) if memory else None)
        self._add(_Task(spec.key, 0, -1, pipes, started))
        self._helpers.send(request, fds)

    def _on_reports(self, reports: list[list]) -> None:
        """What a helper did: "s" spawned (pid, start time), "f" failed (status, why), "x" exited."""
        for kind, job, number, *rest in reports:
            task = self._tasks.get((job, number))
            if task is None or task.ended:
                continue
            if kind == "s":
                task.pid, task.starttime = rest
                self._record_pid(task)
                for sig, grace in task.pending:  # sent while it was being spawned
                    if grace is None:
                        self.signal(task.key, sig)
                    else:
                        self.terminate(task.key, grace)
                task.pending.clear()
            elif kind == "f":
                status, error = rest
                for fd in list(task.pipes):
                    self._close_pipe(task, fd)
                if isinstance(self._contained, CgroupTasks):
                    self._contained.abandon(task.key)
                del self._tasks[task.key]
                self._release(task)
                self._report(TaskResult(task.key, status, None, None, error, None, task.started, time.time()))
            else:
                task.waitstatus, task.cpu, task.max_rss, task.ended, task.group_empty = rest
                self._exited(task)

    def _on_lost(self, keys: set[TaskKey], reason: str) -> None:
        """A helper died with these tasks: their exit statuses are lost, and what they left is killed."""
        for key in keys:
            task = self._tasks.get(key)
            if task is None or task.ended:
                continue
            task.lost = f"{reason}: exit status lost"
            task.ended = time.time()
            self._finish(task)

    def _release(self, task: _Task) -> None:
        if self._helpers is not None and task.pidfd < 0:
            self._helpers.ended(task.key)

    # -- reaping and output -----------------------------------------------

    def _on_pidfd(self, task: _Task) -> None:
        try:
            pid, status, rusage = os.wait4(task.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status, rusage = task.pid, None, None  # reaped behind our back: status unknown
        if pid == 0:
            return
        self._watch.remove(task.pidfd)
        os.close(task.pidfd)
        task.ended = time.time()
        task.waitstatus = status
        if rusage is not None:
            task.cpu = rusage.ru_utime + rusage.ru_stime
            # ru_maxrss (KiB) is the largest single process among the task and the children it waited for, but
            # never less than the spawner's own peak (see spawner_rss): only a larger value is the task's.
            task.max_rss = rusage.ru_maxrss if rusage.ru_maxrss > task.spawner_rss else 0
        self._exited(task)

    def _exited(self, task: _Task) -> None:
        if task.pipes:
            # A background grandchild may hold the pipes open indefinitely.
            task.drain_timer = asyncio.get_running_loop().call_later(DRAIN_SECONDS, self._finish, task)
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
        if task.pid:
            killpg(task.pid, _signal.SIGKILL)
        del self._tasks[task.key]
        self._release(task)
        if isinstance(self._contained, CgroupTasks):
            self._contained.kill(task.key, task.group_empty)
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
            f.writelines(f"{t.pid} {t.pid} {t.starttime}\n" for t in self._tasks.values() if t.pid)
        os.replace(tmp, self._pidfile)
        if self._pidfile_fd is not None:
            os.close(self._pidfile_fd)
        self._pidfile_fd = os.open(self._pidfile, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._pidfile_lines = len(self._tasks)


def _pipes(order: Order) -> tuple[dict[int, str], tuple[int | None, int | None]]:
    """Pipes for the streams without a file: their read ends (ours, non-blocking) and write ends (the task's)."""
    pipes: dict[int, str] = {}
    writes: list[int | None] = []
    for name, path in (("stdout", order.stdout_path), ("stderr", order.stderr_path)):
        if path is not None:
            writes.append(None)
            continue
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
        except OSError as e:  # EMFILE: the worker is out of fds, not the user's fault
            _close([*pipes, *writes])
            raise SpawnError(STATUS_CANNOT_RUN, f"{name} pipe: {e.strerror}") from None
        os.set_blocking(r, False)  # not O_NONBLOCK on pipe2: the child's end must block
        pipes[r] = name
        writes.append(w)
    return pipes, (writes[0], writes[1])


def _close(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _home(contained: CgroupTasks | Subreaper | None) -> str | None:
    """The cgroup a helper goes back to after a spawn in a task's group: the worker's own, where it starts."""
    return str(contained.own) if isinstance(contained, CgroupTasks) else None


def _pidfd_or_kill(pid: int, pipes: dict[int, str]) -> int:
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        # Without a pidfd we cannot reap without blocking: undo the spawn.
        killpg(pid, _signal.SIGKILL)
        os.waitpid(pid, 0)
        _close(pipes)
        raise SpawnError(STATUS_CANNOT_RUN, f"pidfd_open: {e.strerror}") from None


def _result(task: _Task) -> TaskResult:
    ws = task.waitstatus
    if ws is None:
        return TaskResult(task.key, 255, None, None, task.lost or "exit status lost (reaped elsewhere)",
                          task.pid or None, task.started, task.ended)
    if os.WIFSIGNALED(ws):
        return _exited(task.key, task.pid, None, os.WTERMSIG(ws), task.started, task.ended, task.cpu, task.max_rss)
    return _exited(task.key, task.pid, os.WEXITSTATUS(ws), None, task.started, task.ended, task.cpu, task.max_rss)


def _exited(key: TaskKey, pid: int, code: int | None, sig: int | None,
            started: float, ended: float, cpu: float = 0.0, max_rss: int = 0) -> TaskResult:
    # Exactly one of code and sig is given (os.WIFSIGNALED decides which).
    status = 128 + sig if sig is not None else code if code is not None else 0
    return TaskResult(key, status, code, sig, None, pid, started, ended, cpu, max_rss)


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
