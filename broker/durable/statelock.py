"""One instance per state dir: an exclusive flock held for the broker's lifetime (architecture.md#where-state-lives).

Two brokers on one journal would each take the other's workers and interleave their writes. The lock is a
`flock` on `STATE_DIR/lock`, which names the holder's pid; the kernel drops it when the holder dies, even by
`kill -9`, so a stale lock file never blocks a restart. `mc start` takes it before it forks any rank and hands
it to its broker; a broker started alone (`mc broker`, a pod) takes it itself. The journal file is locked the
same way (broker/durable/journal.py), so a second Journal on it is refused whatever its state dir is called.
"""
from __future__ import annotations

import contextlib
import fcntl
import os


class StateDirInUse(OSError):
    """Another live process holds the lock."""


def lock_file(path: str, what: str) -> int:
    """Open `path` and take an exclusive flock on it; returns the descriptor, which holds the lock while open.

    Raises StateDirInUse naming `what` and the holder's pid (when the file records it).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        by = f" by pid {holder}" if holder else ""
        raise StateDirInUse(f"{what} is in use{by}: another MiniCluster runs on it; stop it first "
                            f"(`mc shutdown`) or use another --state-dir") from None
    return fd


def _holder(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "0") or None
    return None


class StateLock:
    """The lock on a state dir; the file records the pid of the process that took it."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, "lock")
        self.fd: int | None = lock_file(self.path, f"state dir {state_dir}")
        with contextlib.suppress(OSError):  # a full disk must not stop a broker that could serve reads
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def forget(self) -> None:
        """In a forked child that must not hold the lock (a worker rank): close its copy of the descriptor."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
