"""The exit-code contract of `mc boot`, `mc broker` and `mc worker` (docs/operator.md#how-the-job-ends-the-exact-rules).

Kubernetes' podFailurePolicy acts on these codes, so they are part of the operator's interface:
  * 0 — the MiniCluster ended: its batch command exited 0, or `mc shutdown` (a worker: told to stop by rank 0);
  * 1..127 — the program reported a failure a restart would not fix: the batch command's own status, or a
    rank that cannot start (bad config, unreadable key).  The Job fails at once;
  * 125 (CANNOT_START) — `mc boot`'s start checks found that the runtime cannot run in this image as this user
    (e.g. nothing writable where it keeps its state); its termination message says what.  Fails at once;
  * 128 (NOT_STARTED) — no signal: the container runtime could not start the container at all (containerd's
    StartError: the runtime missing from the image, an executable of the wrong architecture).  Fails at once;
  * 128 + n — stopped by signal n.  SIGTERM (143) is how pods are stopped (deletion, eviction, a node drain):
    a disruption, never a success.  The Job recreates the pod and the rank rejoins.  A broker whose own
    background loop failed leaves as a crash would, 134 (SIGABRT), to be restarted the same way.
"""
from __future__ import annotations

import signal

SUCCESS = 0
PROGRAM_FAILURE = range(1, 128)
CANNOT_START = 125
# How CANNOT_START's termination message begins: a batch command that itself exits 125 is not mistaken for it.
CANNOT_START_MESSAGE = "mc boot: cannot start in this image: "
NOT_STARTED = 128


def stopped_by(signum: int) -> int:
    """The exit status of a rank stopped by `signum`: 128 + n, as a shell would report it."""
    return 128 + int(signum)


DISRUPTED = stopped_by(signal.SIGTERM)


CRASHED = stopped_by(signal.SIGABRT)
"""The broker's status when one of its supervised loops failed (broker/supervise.py): restart it."""
