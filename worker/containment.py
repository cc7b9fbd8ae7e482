"""Keeping a task's processes contained, so none outlives its task (issue 10 item 6).

A task leads its own process group, but a child that calls setsid() or setpgid() leaves that group and a
killpg() misses it. Two ways to find such children:

* `CgroupTasks`, where this process may write a cgroup v2 tree (pods; hosts with a writable unified
  hierarchy): one group per running task, <our cgroup>/mc-<instance>-rank<R>/t<N>. The task is spawned from
  inside its group, so it and everything it forks is there from its first instruction; `cgroup.kill` ends them
  all, and a new process of the same rank kills whatever a crashed one left in the tree. No controller is
  needed, only cgroup.procs and cgroup.kill (Linux 5.14). Making and removing a cgroup is costly (this runs
  once per task) and cgroup v2 cannot rename one, so groups are numbered, not named after their task: the
  group of a task that left nothing behind serves the next task.
* `Subreaper` elsewhere: the worker is a child subreaper (PR_SET_CHILD_SUBREAPER), so an orphaned descendant
  of a task becomes the worker's child. It still carries the task's MC_JOB_ID and MC_TASK_RANK, which tell
  whose it is; orphans of tasks that ended are killed and reaped.

Both need a live worker. Its death, however it dies (kill -9 included), is covered by `kill_rank_leftovers` (issue
24 item 4): the pidfile's groups, the cgroup tree, and every process that carries this instance's MC_URI and this
rank's MC_NODE_RANK (what escaped to PID 1 or another subreaper). `mc start`'s launcher runs it when it reaps a
worker; `mc boot` as a pod's PID 1 needs none (its exit ends the PID namespace); elsewhere `guard` forks a small
process from the worker before its threads start that waits on the worker's pidfd and runs it.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from worker.memlimit import write_control
from worker.spawn import in_cgroup

log = logging.getLogger(__name__)

Key = tuple[int, int]
CGROUP_FS = Path("/sys/fs/cgroup")
PR_SET_CHILD_SUBREAPER = 36
# Empty task groups kept for reuse: about the tasks that end between two spawns; more are removed.
SPARE_GROUPS = 64
# The guards this process forked (`guard`): children of the worker that are no task's, never swept.
_GUARDS: set[int] = set()
# What stops a process; a guard ignores them all (a Ctrl-C or a signal to the process group must not end it before
# the worker it watches).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class CgroupTasks:
    """One cgroup v2 group per task under this rank's own subtree."""

    def __init__(self, own: Path, base: Path) -> None:
        self.own = own
        self.base = base
        self._groups: dict[Key, str] = {}  # the group of each task spawned and not yet killed
        self._spare: list[str] = []  # empty groups of ended tasks, for the next ones
        self._made = 0

    @classmethod
    def at(cls, instance: str, rank: int, fs: Path = CGROUP_FS) -> CgroupTasks | None:
        """Where the tree of this rank of `instance` (its state dir) is, if this process may write there."""
        root = fs if (fs / "cgroup.controllers").exists() else fs / "unified"
        own = _own_v2_group(root)
        if own is None or not os.access(own, os.W_OK) or not os.access(own / "cgroup.procs", os.W_OK):
            return None
        digest = hashlib.sha256(os.path.realpath(instance).encode()).hexdigest()[:12]
        return cls(own, own / f"mc-{digest}-rank{rank}")

    @classmethod
    def detect(cls, instance: str, rank: int, fs: Path = CGROUP_FS) -> CgroupTasks | None:
        """The tree for this rank's tasks, where usable; it starts empty: what a previous run of this rank
        left there is killed first."""
        tree = cls.at(instance, rank, fs)
        if tree is None:
            return None
        own = tree.own
        try:
            killed = tree.kill_leftovers()
            tree.base.mkdir()
        except OSError as exc:
            log.warning("cannot keep tasks in cgroup %s (%s): using a subreaper", tree.base, exc)
            return None
        try:
            if not (tree.base / "cgroup.kill").exists():  # before Linux 5.14
                raise OSError(errno.ENOTSUP, "no cgroup.kill")
            with tree.spawning((0, 0)):  # spawning moves this process in and out: try it once now
                pass
            tree.kill((0, 0))
        except OSError as exc:
            log.warning("cannot keep tasks in cgroup %s (%s): using a subreaper", tree.base, exc)
            with contextlib.suppress(OSError):
                write_control(own / "cgroup.procs", str(os.getpid()))
            tree.close()
            return None
        if killed:
            log.warning("killed %d process(es) left behind by this rank's previous run", killed)
        return tree

    def kill_leftovers(self) -> int:
        """Kill every process a previous run of this rank left in its tree and remove it; returns how many."""
        if not self.base.is_dir():
            return 0
        left = len(self._pids(self.base))
        write_control(self.base / "cgroup.kill", "1")
        for group in reversed(_subgroups(self.base)):
            _rmdir_when_empty(Path(group))
        _rmdir_when_empty(self.base)
        return left

    def close(self) -> None:
        """Remove the tree once its tasks ended (the rank stops): the spare groups, and those whose removal was
        still pending."""
        self._spare.clear()
        for group in reversed(_subgroups(self.base)):
            with contextlib.suppress(OSError):
                os.rmdir(group)
        with contextlib.suppress(OSError):
            os.rmdir(self.base)

    def group(self, key: Key) -> str | None:
        """The group of a task spawned and not yet killed."""
        return self._groups.get(key)

    @contextlib.contextmanager
    def spawning(self, key: Key) -> Iterator[None]:
        """Give the task a group and hold this process in it while the task is spawned."""
        group = self.take(key)
        try:
            with in_cgroup(group, str(self.own)):
                yield
        except BaseException:
            self.abandon(key)
            raise

    def take(self, key: Key) -> str:
        """The group the task is to be spawned in (by this process, or by a spawn helper that joins it)."""
        group = self._new_group(key)
        self._groups[key] = group
        return group

    def abandon(self, key: Key) -> None:
        """No task started in the group taken for `key`. Not reused: what failed may be the group itself (a task
        run as root can change its group, e.g. enable controllers in it, and then no process can join it)."""
        group = self._groups.pop(key, None)
        if group is not None:
            self._remove(group, tries=40)

    def _new_group(self, key: Key) -> str:
        old = self._groups.pop(key, None)
        if old is not None:  # a new attempt of a task whose group is still there: that one is ended now
            self._end(old)
        if self._spare:
            return self._spare.pop()
        self._made += 1
        group = os.path.join(self.base, f"t{self._made}")
        os.mkdir(group)
        return group

    def signal(self, key: Key, sig: int) -> None:
        group = self.group(key)
        for pid in self._pids(group) if group is not None else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self, key: Key, empty: bool = False) -> None:
        """SIGKILL everything left in the task's group and remove it, or keep it for the next task if empty.
        `empty`: known to be (a spawn helper read it when it reaped the task; nothing can enter an empty group)."""
        group = self._groups.pop(key, None)
        if group is not None:
            self._end(group, empty)

    def _end(self, group: str, empty: bool = False) -> None:
        # Most tasks leave nothing behind (this runs once per task): one read says so, and the group is reused.
        if empty or not populated(group):
            if len(self._spare) < SPARE_GROUPS:  # a group the task made below it, empty too, may stay
                self._spare.append(group)
            else:
                self._remove(group, tries=40)
            return
        if os.getpid() in self._pids(group):
            log.error("not killing cgroup %s: this process is in it", group)
            return
        write_control(Path(group) / "cgroup.kill", "1")
        self._remove(group, tries=40)

    def _remove(self, group: str, tries: int) -> None:
        # cgroup.kill returns before the processes are gone; the group can be removed once they are.
        try:
            for path in reversed(_subgroups(group)):
                os.rmdir(path)
            os.rmdir(group)
        except FileNotFoundError:
            pass
        except OSError:
            if tries:
                asyncio.get_running_loop().call_later(0.05, self._remove, group, tries - 1)
            else:
                log.warning("cgroup %s is still busy; left behind", group)

    @staticmethod
    def _pids(group: Path | str) -> set[int]:
        """The processes in `group` and the groups below it (a task may make its own)."""
        pids: set[int] = set()
        for g in [str(group), *_subgroups(group)]:
            with contextlib.suppress(OSError), open(os.path.join(g, "cgroup.procs")) as f:
                pids.update(int(line) for line in f.read().split())
        return pids


class Subreaper:
    """Adopts the orphans of tasks (setsid/setpgid escapes) and kills those of tasks that ended."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        self._adopted: set[int] = set()

    def sweep(self, running: set[Key], tracked: set[int]) -> int:
        """Kill adopted descendants of tasks not in `running`, reap those that died; returns how many it killed.

        `tracked`: the pids this process waits for itself (its tasks), left alone. Only processes that carry a
        task's variables are touched, and zombies of another session: other children (a batch command, in this
        process's own session) are someone else's to reap.
        """
        killed = 0
        own_session = os.getsid(0)
        for pid in _children(os.getpid()) - tracked - _GUARDS:
            key = _task_of(pid)
            if key is None:
                # An orphan killed with its task's group before a sweep saw it: a zombie whose environment is
                # gone, but tasks lead sessions of their own and a zombie keeps its session id.
                if _zombie_of_another_session(pid, own_session):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                continue
            self._adopted.add(pid)
            if key not in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        for pid in list(self._adopted):
            try:
                reaped = os.waitpid(pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                reaped = True
            if reaped:
                self._adopted.discard(pid)
        return killed


def kill_orphans(pidfile: str) -> int:
    """SIGKILL the groups of the tasks a pidfile lists (a crashed rank's); returns how many.

    A group is only killed if its leader still has the recorded start time, so a recycled pid is left alone.
    """
    try:
        with open(pidfile) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    killed = 0
    for line in lines:
        try:
            pid, pgid, started = (int(x) for x in line.split())
        except ValueError:
            log.warning("%s: ignoring malformed line %r", pidfile, line)
            continue
        if starttime(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
    with contextlib.suppress(FileNotFoundError):  # a rank's guard and its launcher may both clean up after it
        os.unlink(pidfile)
    return killed


def kill_instance_leftovers(state_dir: str, ranks: Iterable[int]) -> None:
    """What the ranks of the instance at `state_dir` left running on this host (its launcher, after they exit)."""
    for rank in ranks:
        kill_orphans(os.path.join(state_dir, f"tasks-rank{rank}.pids"))
        tree = CgroupTasks.at(state_dir, rank)
        if tree is not None:
            try:
                tree.kill_leftovers()
            except OSError as exc:
                log.warning("cgroup %s: %s", tree.base, exc)


def guard(state_dir: str, rank: int, uri: str) -> int | None:
    """Fork this worker's guard, which kills what the worker's tasks left once the worker is gone (module doc).

    Call it before any thread starts (a fork copies only the calling thread). Returns the guard's pid, or None
    where it cannot watch (no pidfd_open: Linux before 5.3), said in the log."""
    worker = os.getpid()
    try:
        watch = os.pidfd_open(worker)
    except OSError as exc:
        log.warning("a killed worker's tasks may outlive it: %s", exc)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(watch)
        _GUARDS.add(pid)
        return pid
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        select.select([watch], [], [])  # a pidfd reads ready once its process has exited
        killed = kill_rank_leftovers(state_dir, rank, uri)
        if killed:
            log.warning("the worker of rank %d is gone: killed %d process(es) its tasks left", rank, killed)
    except OSError as exc:
        log.warning("the guard of rank %d could not clean up after it: %s", rank, exc)
    except BaseException:
        log.exception("the guard of rank %d failed", rank)
    finally:
        os._exit(0)


def kill_rank_leftovers(state_dir: str, rank: int, uri: str) -> int:
    """Kill what the tasks of a rank that just ended left on this host; returns how many processes were found.

    Only processes started by then are taken, and their descendants, so a new run of the rank keeps its tasks;
    its cgroup tree is killed but left in place (no wait for it to empty): the rank's next run, or its launcher,
    removes it."""
    by = int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))  # /proc's start-time clock
    kill_orphans(os.path.join(state_dir, f"tasks-rank{rank}.pids"))
    tree = CgroupTasks.at(state_dir, rank)
    if tree is not None and tree.base.is_dir():
        try:
            write_control(tree.base / "cgroup.kill", "1")
        except OSError as exc:
            log.warning("cgroup %s: %s", tree.base, exc)
    marks = {b"MC_URI=" + uri.encode(), b"MC_NODE_RANK=%d" % rank}
    stopped: set[int] = set()
    while True:
        # Stopped first, killed together at the end: a stopped process forks no more, and a child it forked before
        # is found by its parent in the next round (a killed parent would hand it to PID 1, unrecognizable).
        found = {pid for pid, parent in _processes()
                 if pid not in stopped and (parent in stopped or (_started_by(pid, by) and _marked(pid, marks)))}
        found.discard(os.getpid())
        if not found:
            break
        for pid in found:
            # PermissionError: a child of a task that runs a set-user-ID program, where this worker is not root.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= found
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def _processes() -> Iterator[tuple[int, int]]:
    """(pid, parent pid) of every process this one can see."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            yield int(name), int(fields[1])


def _started_by(pid: int, tick: int) -> bool:
    started = starttime(pid)
    return started is not None and started <= tick


def _marked(pid: int, marks: set[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marks <= set(f.read().split(b"\0"))
    except OSError:
        return False


def starttime(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot."""
    try:
        # os.open/os.read, not open(): this runs once per spawn and the buffered file object costs more.
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _own_v2_group(root: Path) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            group = root / line[3:].strip().lstrip("/")
            return group if (group / "cgroup.procs").exists() else None
    return None


def _children(pid: int) -> set[int]:
    children: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                children.update(int(c) for c in f.read().split())
    return children


def _zombie_of_another_session(pid: int, session: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return False
    return fields[:1] == [b"Z"] and len(fields) > 3 and int(fields[3]) != session


def _task_of(pid: int) -> Key | None:
    """(MC_JOB_ID, MC_TASK_RANK) from a process's environment, if it has both."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
        return int(env[b"MC_JOB_ID"]), int(env[b"MC_TASK_RANK"])
    except (OSError, KeyError, ValueError):
        return None


def _subgroups(group: Path | str) -> list[str]:
    """The groups below `group`, parents before their children (no stat per control file: scandir's d_type)."""
    found: list[str] = []
    pending = [str(group)]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    found.append(entry.path)
                    pending.append(entry.path)
    return found


def populated(group: str) -> bool:
    """Whether any process is in `group` or below it (cgroup.events); a missing group holds none."""
    try:
        # os.open/os.read, not open(): this runs once per task and the buffered file object costs more.
        fd = os.open(os.path.join(group, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return b"populated 1" in os.read(fd, 4096)
    finally:
        os.close(fd)


def _rmdir_when_empty(group: Path, seconds: float = 2.0) -> None:
    """rmdir a group whose processes were just killed, waiting for them to go (start-up only: this blocks)."""
    for _ in range(int(seconds / 0.01)):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
    group.rmdir()  # raises: the caller says why the tree cannot be used


def contain(instance: str, rank: int) -> CgroupTasks | Subreaper | None:
    """How this rank keeps its tasks' processes contained: a cgroup tree where writable, else a subreaper."""
    tree = CgroupTasks.detect(instance, rank)
    if tree is not None:
        return tree
    try:
        return Subreaper()
    except OSError as exc:
        log.warning("tasks' children that leave their process group may outlive them: %s", exc)
        return None
