"""`mc boot` as a container's PID 1 (in its own PID namespace, as in a pod): it reaps orphans and passes
SIGTERM on to the rank, which leaves as a disruption.  Needs root for the PID namespace."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minicluster import exitcodes
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, until, wait_for

pytestmark = pytest.mark.needs("unshare", root=True)  # a PID namespace


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _state_and_ppid(pid: int) -> tuple[str, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _zombies_under(pid: int) -> list[int]:
    zombies = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid = _state_and_ppid(int(entry.name))
            except (OSError, IndexError):
                continue
            if ppid == pid and state == "Z":
                zombies.append(int(entry.name))
    return zombies


def test_boot_as_pid_1_reaps_orphans_and_forwards_sigterm(tmp_path) -> None:
    cluster = LocalCluster(tmp_path, size=1, kill_grace=1.0)
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
            sys.executable, "-m", "minicluster", "boot", "--config", cluster.config_path, "--rank", "0"]
    proc = subprocess.Popen(argv, env={**os.environ, "MC_URI": cluster.uri})
    try:
        cluster.wait_socket(30)
        [pid1] = _children(proc.pid)
        [rank] = _children(pid1)
        with cluster.client() as c:
            # The shell exits at once; its background children become orphans of PID 1.
            job_id = c.submit(job(["sh", "-c", "for i in 1 2 3 4 5; do sleep 0.2 & done; exit 0"]))
            assert wait_for(c, job_id)["status"] == 0
        # Orphans, then their zombies, are PID 1's children until it reaps them.
        until(lambda: _children(pid1) == [rank], "the orphans ended and PID 1 reaped them")
        assert _zombies_under(pid1) == [], "orphans were left unreaped by PID 1"
        os.kill(pid1, signal.SIGTERM)
        assert proc.wait(15) == exitcodes.DISRUPTED
    finally:
        proc.kill()
        proc.wait()
