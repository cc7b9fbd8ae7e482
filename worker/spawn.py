"""One task's spawn in the calling process: argv[0] looked up, output files opened, cores, cwd and groups
worn for the spawn.  The worker agent's loop calls it when it spawns inline, a spawn helper process
(worker/spawnhelper.py) when the agent has helpers; it therefore imports little.

The caller makes the output pipes (it reads them) and gives their write ends; files are opened here, as the
task's user.  Neither spawn path sets affinity or cwd, and the child copies both from the calling thread, so
the thread wears them briefly: `Spawner.bind` keeps a task's mask on for a batch of spawns, `unbind` puts the
process's own back once after them.

A task of the worker's own user is posix_spawned.  A task of another user (a guest of a root instance) is forked
by subprocess, whose child takes the user's groups (NSS's, as initgroups), gid and uid before it execs: no process
with the worker's privileges ever runs with the job's environment (LD_PRELOAD, LD_AUDIT, GCONV_PATH ... would
otherwise run the guest's code as root in a helper such as setpriv), and the command is looked up on the task's
PATH by that child, as the user, as execvp would (docs/security.md, "What runs, and what is opened").
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from minicluster.model.text import cut
from worker.asuser import acting_as_user, user_groups
from worker.memlimit import write_control

STATUS_NOT_FOUND = 127
STATUS_CANNOT_RUN = 126  # also used for every other spawn-time failure (cwd, cores, files)

_CLONE_FS = 0x200
# Python ignores SIGPIPE (and maybe more); ignored dispositions survive exec.
_RESET_SIGNALS = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))
# What a guest task's Popen is told its exit status is: the executor reaps it (pidfd, wait4), and subprocess must
# never wait for it (a Popen dropped with no return code is polled by the next Popen, which would steal it).
_REAPED_ELSEWHERE = -1


class SpawnError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Order:
    """What one spawn needs besides file descriptors: plain values, so a helper can receive it."""
    argv: tuple[str, ...]
    env: dict[str, str]  # complete, the accelerator variables included
    cwd: str | None
    cores: tuple[int, ...]
    user: tuple[int, int] | None
    stdout_path: str | None  # None: the caller's pipe
    stderr_path: str | None
    pass_fds: tuple[int, ...]  # the numbers the task sees them at
    umask: int | None = None  # the task's and its output files' (None: the spawning process's own)

    def size(self) -> int:
        """About how many bytes the order's strings take (argv and environment dominate)."""
        return (sum(map(len, self.argv)) + sum(len(k) + len(v) + 2 for k, v in self.env.items())
                + len(self.cwd or "") + len(self.stdout_path or "") + len(self.stderr_path or ""))


class Spawner:
    """Spawns in this process; `threads_share_cwd`: other threads would see a task's cwd (made the calling thread's
    own then, see `cwd_is_private`; where it cannot be, a spawn with a cwd fails)."""

    def __init__(self, threads_share_cwd: bool) -> None:
        self.allowed_cores = frozenset(os.sched_getaffinity(0))
        self._bound: frozenset[int] | None = None  # None: all of allowed_cores
        self._cwd_private = not threads_share_cwd
        self._unshare_error: str | None = None  # why the calling thread's cwd could not be made its own
        self._signals_caught = False
        self._umask = _thread_umask()

    def wears_fs(self, order: Order) -> bool:
        """Whether the spawn of `order` changes the calling thread's cwd or umask, which threads share unless
        `cwd_is_private`."""
        return order.cwd is not None or (order.umask is not None and order.umask != self._umask)

    def check(self, order: Order) -> None:
        bad = sorted(set(order.cores) - self.allowed_cores)
        if bad:
            raise SpawnError(STATUS_CANNOT_RUN, f"cores {bad} are not in this worker's"
                             f" allowed set {sorted(self.allowed_cores)}")
        if any(fd < 3 for fd in order.pass_fds):
            raise SpawnError(STATUS_CANNOT_RUN, f"pass_fds {order.pass_fds}: 0-2 are taken")

    def spawn(self, order: Order, stdin: int | None, pipes: tuple[int | None, int | None], passed: Sequence[int],
              groups: Sequence[AbstractContextManager[None]]) -> int:
        """Start the task; `pipes`: write ends for the streams without a path, `passed`: our fds of
        order.pass_fds, `groups`: held around the spawn (cgroups the task starts in).  Raises SpawnError."""
        if not order.argv:
            raise SpawnError(STATUS_NOT_FOUND, "empty argv")
        path = _resolve(order) if order.user is None else ""  # another user's task looks its command up itself
        if order.cwd is not None and not _is_dir(order.cwd, order.user):
            raise SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(order.cwd)}: no such directory")
        self.check(order)
        opened: list[int] = []
        saved_umask = self._wear_umask(order.umask)
        try:
            out = pipes[0] if order.stdout_path is None else _open_output("stdout", order.stdout_path, order.user,
                                                                          opened)
            if order.stderr_path is not None and order.stderr_path == order.stdout_path:
                err = out  # one file for both (--output): opened once
            else:
                err = pipes[1] if order.stderr_path is None else _open_output("stderr", order.stderr_path,
                                                                              order.user, opened)
            assert out is not None and err is not None
            if order.user is not None:
                self._catch_ignored_signals()
                return self._spawn_bound(order, functools.partial(_start_as, order.user, order, stdin, out, err,
                                                                  passed), groups)
            actions: list[tuple] = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0) if stdin is None
                                    else (os.POSIX_SPAWN_DUP2, stdin, 0),
                                    (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
            # Last: dup2 onto itself clears close-on-exec in the child only.
            actions += [(os.POSIX_SPAWN_DUP2, ours, theirs) for ours, theirs in zip(passed, order.pass_fds,
                                                                                   strict=True)]
            return self._spawn_bound(order, functools.partial(
                os.posix_spawn, path, list(order.argv), order.env, file_actions=actions, setsid=True, setsigmask=(),
                setsigdef=_RESET_SIGNALS), groups)
        finally:
            for fd in opened:
                os.close(fd)
            if saved_umask is not None:
                os.umask(saved_umask)

    def _spawn_bound(self, order: Order, start: Callable[[], int],
                     groups: Sequence[AbstractContextManager[None]]) -> int:
        saved_cwd = None
        try:
            if order.cores:
                self.bind(frozenset(order.cores))
            if order.cwd is not None:
                self._make_cwd_private(order.cwd)
                saved_cwd = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
                _chdir(order.cwd, order.user)
            with contextlib.ExitStack() as stack:
                for group in groups:
                    stack.enter_context(group)
                return start()
        except OSError as e:
            status = STATUS_NOT_FOUND if e.errno == errno.ENOENT else STATUS_CANNOT_RUN
            raise SpawnError(status, f"{cut(order.argv[0])}: {e.strerror}") from None
        except ValueError as e:  # a NUL byte in argv or env, or '=' in an env name: nothing execve could carry
            raise SpawnError(STATUS_CANNOT_RUN, f"{cut(order.argv[0])}: {e}") from None
        finally:
            if saved_cwd is not None:
                os.fchdir(saved_cwd)
                os.close(saved_cwd)

    def _catch_ignored_signals(self) -> None:
        """Make the signals this process ignores caught ones that do nothing, once: an ignored disposition survives
        fork and exec, a caught one is reset to the default at exec, and subprocess's restore_signals resets only
        SIGPIPE and SIGXFSZ.  A guest's task so gets every disposition at its default, as posix_spawn's setsigdef
        gives the others.  Only the main thread may set handlers; the loop runs there."""
        if self._signals_caught:
            return
        self._signals_caught = True
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in set(_RESET_SIGNALS) - {signal.SIGPIPE, signal.SIGXFSZ}:  # restore_signals resets these two
            with contextlib.suppress(OSError, ValueError):
                if signal.getsignal(sig) == signal.SIG_IGN:
                    signal.signal(sig, do_nothing)

    @property
    def bound(self) -> bool:
        """Whether the calling thread wears a task's cores (call `unbind` after the batch)."""
        return self._bound is not None

    def bind(self, cores: frozenset[int]) -> bool:
        """Bind the calling thread to `cores` for the next spawns; True if it changed (call `unbind` after the
        batch).  Every sched_setaffinity migrates the thread, so tasks on the same cores need no change."""
        if cores == (self._bound or self.allowed_cores):
            return False
        os.sched_setaffinity(0, cores)
        self._bound = cores
        return True

    def unbind(self) -> None:
        if self._bound is not None:
            self._bound = None
            os.sched_setaffinity(0, self.allowed_cores)

    def cwd_is_private(self) -> bool:
        """Whether the calling thread (the one that spawns) may enter a task's cwd unseen by the process's other
        threads: unshare(CLONE_FS), tried once, gives it a cwd of its own.  A container runtime's default seccomp
        profile forbids unshare without CAP_SYS_ADMIN: the caller then spawns tasks with a cwd elsewhere."""
        if not self._cwd_private and self._unshare_error is None:
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_FS) == 0:
                self._cwd_private = True
            else:
                self._unshare_error = os.strerror(ctypes.get_errno())
        return self._cwd_private

    def _wear_umask(self, umask: int | None) -> int | None:
        """Give the calling thread the task's umask for the spawn: its output files are created under it and the
        task inherits it.  Returns the umask to put back, None when unchanged (the common case costs no call)."""
        if umask is None or umask == self._umask:
            return None
        if not self.cwd_is_private():
            raise SpawnError(STATUS_CANNOT_RUN, f"umask {umask:04o}: not set: a task this large is spawned by the"
                             f" worker itself, whose other threads would create their files under it"
                             f" (unshare(CLONE_FS): {self._unshare_error})")
        return os.umask(umask)

    def _make_cwd_private(self, cwd: str) -> None:
        """Refuse the spawn rather than show the task's cwd to the other threads (their relative paths would open in
        it)."""
        if not self.cwd_is_private():
            raise SpawnError(STATUS_CANNOT_RUN, f"cwd {cut(cwd)}: not entered: a task this large is spawned by the"
                             f" worker itself, whose other threads would see it (unshare(CLONE_FS):"
                             f" {self._unshare_error})")


@contextlib.contextmanager
def in_cgroup(group: str, home: str) -> Iterator[None]:
    """Hold this process in cgroup v2 `group` (a directory) while a child is spawned, then go back to `home`."""
    write_control(os.path.join(group, "cgroup.procs"), str(os.getpid()))
    try:
        yield
    finally:
        write_control(os.path.join(home, "cgroup.procs"), str(os.getpid()))


def killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _thread_umask() -> int:
    """The calling thread's umask, read without setting it (os.umask would, for every thread sharing it)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError(errno.ENOENT, "no Umask line in /proc/self/task/*/status")


def _resolve(order: Order) -> str:
    """argv[0] looked up like execvp, but with the task's PATH and cwd (a task of the worker's own user)."""
    name = order.argv[0]
    if "/" in name:
        candidates = [os.path.join(order.cwd or "", name)]
    else:
        search = order.env.get("PATH", os.defpath)
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


def _start_as(user: tuple[int, int], order: Order, stdin: int | None, out: int, err: int, passed: Sequence[int]) -> int:
    """Fork the task of `user` (uid, gid): the child takes the user's groups (`user_groups`), the gid, then the uid,
    and only then execs, looking argv[0] up on the task's PATH itself (every directory in turn, as execvp): the lookup,
    the exec and whatever the dynamic loader does with the job's environment run as the user.  Everything else
    is posix_spawn's: a new session, every signal at its default and none blocked (restore_signals, and
    `_catch_ignored_signals`; the child inherits this thread's mask), stdin from /dev/null unless given, only
    0-2 and pass_fds open, cwd, cores and cgroup from the calling thread."""
    placed = _on_their_numbers(passed, order.pass_fds)
    name = cut(order.argv[0])
    try:
        with _no_signals_blocked():
            child = subprocess.Popen(
                list(order.argv), env=order.env, stdin=subprocess.DEVNULL if stdin is None else stdin,
                stdout=out, stderr=err, close_fds=True, pass_fds=order.pass_fds, restore_signals=True,
                start_new_session=True, user=user[0], group=user[1],
                extra_groups=user_groups(*user))
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise SpawnError(STATUS_NOT_FOUND, f"{name}: command not found") from None
        if e.errno == errno.EACCES:
            raise SpawnError(STATUS_CANNOT_RUN, f"{name}: permission denied") from None
        raise SpawnError(STATUS_CANNOT_RUN, f"{name}: {e.strerror or e}") from None
    except subprocess.SubprocessError as e:
        raise SpawnError(STATUS_CANNOT_RUN, f"{name}: {e}") from None
    finally:
        for fd in placed:
            os.close(fd)
    child.returncode = _REAPED_ELSEWHERE
    return child.pid


def _on_their_numbers(passed: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Copies of our `passed` fds at the numbers the task sees them at (subprocess keeps pass_fds where they are),
    close-on-exec here; returns the copies made, to close after the spawn.  A spawn helper receives its fds above
    every target (worker/spawnhelper.py), so a target in use is one of the process's own: the spawn fails then."""
    placed: list[int] = []
    try:
        for ours, theirs in zip(passed, targets, strict=True):
            if ours == theirs:
                continue
            if _is_open(theirs):
                raise SpawnError(STATUS_CANNOT_RUN, f"pass_fds: fd {theirs} is taken in the spawning process")
            placed.append(os.dup2(ours, theirs, inheritable=False))
    except BaseException:
        for fd in placed:
            os.close(fd)
        raise
    return placed


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _no_signals_blocked() -> Iterator[None]:
    """The calling thread's signal mask empty for a fork: the child keeps it across exec."""
    blocked = signal.pthread_sigmask(signal.SIG_SETMASK, ())
    try:
        yield
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def do_nothing(_signum: int, _frame: object) -> None:
    """A caught signal's handler that ignores it (see Spawner._catch_ignored_signals)."""


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


def _open_output(name: str, path: str, user: tuple[int, int] | None, opened: list[int]) -> int:
    """The task's output file, opened as `user`, for appending: a regular file, a FIFO some process reads, or a
    character device (/dev/null).  Opened without blocking: a FIFO no process reads would otherwise hold the
    spawning process (the loop, or a helper every task of the rank shares) until one does."""
    try:
        with acting_as_user(user):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY,
                         0o666)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        reason = (_not_openable(path, user) if getattr(e, "errno", None) == errno.ENXIO
                  else getattr(e, "strerror", None) or e)
        raise SpawnError(STATUS_CANNOT_RUN, f"{name} {cut(path)}: {reason}") from None
    opened.append(fd)
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFCHR):
        raise SpawnError(STATUS_CANNOT_RUN, f"{name} {cut(path)}: not a regular file, a FIFO or a character device")
    os.set_blocking(fd, True)  # the task writes as to any file: blocking when a pipe is full
    return fd


def _not_openable(path: str, user: tuple[int, int] | None) -> str:
    """Why opening `path` for writing without blocking said ENXIO: a FIFO no process reads, or a socket."""
    with contextlib.suppress(OSError), acting_as_user(user):
        if stat.S_ISFIFO(os.stat(path).st_mode):
            return "a FIFO no process reads"
    return "not a regular file, a FIFO or a character device"
