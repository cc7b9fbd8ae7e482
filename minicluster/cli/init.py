"""What `mc boot` does when it is a container's PID 1: the two duties of an init.

Orphaned processes (a task's background children, anything that daemonizes) are re-parented to PID 1, which must
reap them or they stay zombies for the pod's life; and the kernel gives PID 1 no default signal actions, so a
stop signal is only ever what PID 1 makes of it.  So PID 1 forks the rank as its only child, forwards stop
signals to it, reaps every child that ends, and exits with the rank's own status (minicluster/exitcodes.py).
When PID 1 exits the kernel kills whatever is left in the pod's PID namespace.
"""
from __future__ import annotations

import os
import signal
import sys

from minicluster import exitcodes
import contextlib

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def fork_rank() -> None:
    """As PID 1: fork; the child returns and runs the rank, this process reaps until the rank ends and exits
    with its status (it never returns).  Anything else returns at once: orphans are the real init's job."""
    if os.getpid() != 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    rank = os.fork()
    if rank == 0:
        return
    for signum in FORWARDED:
        signal.signal(signum, lambda sig, _frame: _forward(rank, sig))
    os._exit(reap_until(rank))


def reap_until(rank: int) -> int:
    """Reap every child (orphans included) until `rank` ends; its exit status."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return exitcodes.DISRUPTED  # cannot happen while the rank lives; never report success by accident
        if pid == rank:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else exitcodes.stopped_by(-code)


def _forward(rank: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(rank, signum)
