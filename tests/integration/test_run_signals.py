"""`mc run` ended by a signal cancels its job, as srun and flux run do (issue 24 item 8): `timeout` (SIGTERM), a
closed terminal (SIGHUP, on a real pty whose master is closed), Ctrl-\\ (SIGQUIT). Followers that do not own the
job (`mc attach`, `mc-submit --wait`) leave it running. Real `mc` processes, real signals."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for


def _env(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "MC_URI": cluster.uri}


def until(what: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.05)


def newest_job(c: Client) -> int:
    until(lambda: c.jobs(all=True))
    return int(max(j["id"] for j in c.jobs(all=True)))


def running_job(c: Client) -> int:
    until(lambda: any(j["state"] == "RUN" for j in c.jobs()))
    return int(next(j["id"] for j in c.jobs() if j["state"] == "RUN"))


def ended_cancelled_and_its_core_is_free(c: Client, job_id: int) -> None:
    """The job ends (bounded: it would run 100 s) as cancelled, and the instance's only core runs a new job."""
    until(lambda: c.job(job_id)["state"] == "INACTIVE")
    assert c.job(job_id)["exception"] == "cancel"
    after = c.submit(job(["true"]))
    assert wait_for(c, after)["status"] == 0


def in_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """Run `argv` as the session leader of a new pseudo-terminal (its controlling terminal); returns the process
    and the master side, whose close hangs the terminal up as a closed window or a dropped ssh session does."""
    master, slave = os.openpty()

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                            preexec_fn=take_the_terminal)
    os.close(slave)
    return proc, master


@pytest.mark.timeout(120)
def test_timeout_sigterm_of_mc_run_cancels_its_job_and_exits_143(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, resources="cores=1") as cluster, cluster.client() as c:
        done = subprocess.run(["timeout", "--preserve-status", "-s", "TERM", "3", "mc", "run", "sleep", "100"],
                              env=_env(cluster), capture_output=True, text=True, timeout=60)
        assert done.returncode == 128 + signal.SIGTERM, done
        ended_cancelled_and_its_core_is_free(c, newest_job(c))
        assert "SIGTERM: cancelling job" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_a_closed_terminal_sighup_cancels_the_job_of_mc_run(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, resources="cores=1") as cluster, cluster.client() as c:
        proc, master = in_a_terminal(["mc", "run", "sh", "-c", "echo started; exec sleep 100"], _env(cluster))
        try:
            job_id = running_job(c)
            started(c, job_id)
            os.close(master)  # the terminal goes away: SIGHUP, and writes to it fail
            assert proc.wait(30) == 128 + signal.SIGHUP
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ended_cancelled_and_its_core_is_free(c, job_id)


@pytest.mark.timeout(120)
def test_sigquit_of_mc_run_cancels_its_job(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, resources="cores=1") as cluster, cluster.client() as c:
        proc = subprocess.Popen(["mc", "run", "sleep", "100"], env=_env(cluster), stderr=subprocess.PIPE)
        job_id = running_job(c)
        proc.send_signal(signal.SIGQUIT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGQUIT and b"Traceback" not in err, err
        ended_cancelled_and_its_core_is_free(c, job_id)


@pytest.mark.timeout(120)
def test_followers_that_do_not_own_the_job_leave_it_running(tmp_path: Path) -> None:
    """`mc attach` and `mc-submit --wait` (as `flux submit --wait`) exit 128+signal, cleanly; the job goes on."""
    with LocalCluster(tmp_path, size=1, resources="cores=1") as cluster, cluster.client() as c:
        waiting = subprocess.Popen(["mc-submit", "--wait", "sh", "-c", "echo up; exec sleep 100"],
                                   env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert waiting.stdout is not None
        job_id = int(waiting.stdout.readline())  # printed once submitted: mc-submit is waiting
        attached = subprocess.Popen(["mc", "attach", str(job_id)], env=_env(cluster), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        assert attached.stdout is not None
        assert attached.stdout.readline() == b"up\n"  # mc attach follows the job
        for proc, sig in ((waiting, signal.SIGTERM), (attached, signal.SIGHUP)):
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 128 + sig and b"Traceback" not in err, err
        assert c.job(job_id)["state"] == "RUN"
        c.cancel([job_id])
        assert wait_for(c, job_id)["exception"] == "cancel"
