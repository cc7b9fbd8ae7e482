"""SIGTERM is how Kubernetes stops a pod: a disruption, never the MiniCluster's end (minicluster/exitcodes.py).

A rank stopped by SIGTERM exits 143; the broker does not tell workers to stop, so they keep their tasks and rejoin
the broker that replaces it.  Only the batch command or `mc shutdown` ends a MiniCluster with status 0."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from minicluster import exitcodes
from minicluster.testing import LocalCluster
from tests.host import cmdline, descendants
from tests.integration.conftest import job, until, wait_for


def _started(client, job_id: int) -> None:
    for event in client.eventlog(job_id, follow=True):
        if event[2] == "start":
            return


def test_sigterm_of_the_broker_leaves_workers_and_their_tasks_running(tmp_path) -> None:
    with LocalCluster(tmp_path, size=2, fanout=2, resources="cores=1", policy="high-id") as cluster:
        with cluster.client() as c:
            job_id = c.submit(job(["sleep", "60"]))  # high-id: on rank 1, the worker
            _started(c, job_id)
        cluster.procs[0].send_signal(signal.SIGTERM)
        assert cluster.procs[0].wait(15) == exitcodes.DISRUPTED
        cluster.restart(0)
        with cluster.client() as c:
            # The same worker process joins the broker that replaces the evicted one: told to stop, it would have
            # exited instead (so no wait is needed to see that it was not).
            cluster.wait_states({1: "up"}, timeout=15)
            assert cluster.procs[1].poll() is None, "the worker was told to stop by a broker that was only evicted"
            [row] = [j for j in c.jobs() if j["id"] == job_id]
            assert row["state"] == "RUN", [e[2] for e in c.eventlog(job_id)]  # reattached, not ended
            c.cancel([job_id])
            assert wait_for(c, job_id)["exception"] == "cancel"
    assert cluster.procs[0].returncode == 0 and cluster.procs[1].returncode == 0  # mc shutdown: the clean end


def test_sigterm_of_a_worker_ends_its_tasks_and_exits_as_a_disruption(tmp_path) -> None:
    with (LocalCluster(tmp_path, size=2, fanout=2, resources="cores=1", policy="high-id") as cluster,
          cluster.client() as c):
        job_id = c.submit(job(["sleep", "60"]))
        _started(c, job_id)
        cluster.procs[1].send_signal(signal.SIGTERM)
        assert cluster.procs[1].wait(15) == exitcodes.DISRUPTED
        result = wait_for(c, job_id)
        assert result["status"] != 0  # its task was ended, and says so
        cluster.restart(1)


def test_batch_broker_stopped_by_sigterm_does_not_report_its_command(tmp_path) -> None:
    cluster = LocalCluster(tmp_path, size=1, kill_grace=2.0)
    argv = [sys.executable, "-m", "minicluster", "broker", "--config", cluster.config_path, "--", "sleep", "60"]
    proc = subprocess.Popen(argv)
    try:
        cluster.wait_socket(30)
        until(lambda: "sleep 60" in map(cmdline, descendants(proc.pid)), "the batch command runs")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == exitcodes.DISRUPTED
        assert time.monotonic() - t0 < 10  # within the command's grace, not when the command ends
    finally:
        proc.kill()
        proc.wait()
