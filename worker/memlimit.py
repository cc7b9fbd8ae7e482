"""`--mem` as a limit: one memory cgroup per task, where this worker may create them (protocol.md §3.4).

cgroup v1 (a writable `memory` hierarchy, as on hybrid hosts): the task's group is made under the worker's own,
with `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, so swap is no way around it). The spawning
thread joins the group for the duration of posix_spawn (v1 places threads, and a child starts in its parent
thread's groups), so the task is inside from its first instruction, and so is everything it forks.

cgroup v2 (pods): creating limited groups needs the memory controller delegated to the worker's cgroup, which
the v2 "no internal processes" rule forbids while the worker itself lives there; unprivileged pods have none.
There `--mem` stays a scheduling hint (`detect()` returns None). The per-job cgroups that contain tasks for
killing them are worker/executor.py's business, not this module's.

A task the kernel killed for exceeding its limit is recognised by the group's OOM-kill counter.
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")


class TaskMemoryGroup:
    """The memory cgroup of one task."""

    def __init__(self, path: Path, parent: Path, limit_mb: int) -> None:
        self.path = path
        self.parent = parent
        self.limit_mb = limit_mb

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Hold the calling thread in this group while a child is spawned from it."""
        tid = str(threading.get_native_id())
        try:
            write_control(self.path / "tasks", tid)
        except OSError as exc:
            # Reported as a task that could not start (126), so not as ENOENT (127, command not found).
            code = errno.EIO if exc.errno == errno.ENOENT else exc.errno
            raise OSError(code, f"cannot enter memory cgroup {self.path}: {exc.strerror}") from None
        try:
            yield
        finally:
            write_control(self.parent / "tasks", tid)

    def oom_killed(self) -> bool:
        try:
            text = (self.path / "memory.oom_control").read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", "0")) > 0

    def peak_kb(self) -> int:
        """The group's peak memory use in KiB (its tasks and their children, page cache included); 0 if unknown."""
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text()) // 1024
        except (OSError, ValueError):
            return 0

    def remove(self) -> bool:
        """rmdir the group; False while processes are still leaving it."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


class MemoryLimits:
    """Makes task memory groups under the worker's own v1 memory cgroup."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent
        self._prefix = f"mc-{os.getpid()}-"

    @classmethod
    def detect(cls, root: Path = V1_ROOT) -> MemoryLimits | None:
        """A limiter if this process may create memory cgroups (cgroup v1), else None (`--mem` is a hint)."""
        parent = _own_v1_group(root)
        if parent is None or not os.access(parent, os.W_OK) or not (parent / "memory.limit_in_bytes").exists():
            return None
        limits = cls(parent)
        limits.sweep()
        return limits

    def create(self, job: int, task: int, limit_mb: int) -> TaskMemoryGroup:
        path = self.parent / f"{self._prefix}{job}-{task}"
        path.mkdir(exist_ok=True)
        limit = str(limit_mb << 20)
        write_control(path / "memory.limit_in_bytes", limit)
        with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel
            write_control(path / "memory.memsw.limit_in_bytes", limit)
        return TaskMemoryGroup(path, self.parent, limit_mb)

    def sweep(self) -> None:
        """Remove empty task groups of worker processes that are gone (a kill -9 leaves them behind)."""
        for path in self.parent.glob("mc-*-*-*"):
            pid = path.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    path.rmdir()


def _own_v1_group(root: Path) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group = root / path.lstrip("/")
            return group if group.is_dir() else None
    return None


def write_control(path: Path | str, value: str) -> None:
    """One write(2) to a cgroup control file (its value must arrive whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
