"""kill -9 of the broker, of everything, and in the middle of submissions and a large array: no acknowledged job
and no recorded result is lost, running work is reattached or ended by the documented rule."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from minicluster.client import ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import event_names, job, until, wait_for


def _started(c, job_id: int) -> None:
    for event in c.eventlog(job_id, follow=True):
        if event[2] == "start":
            return


@pytest.mark.smoke
def test_broker_kill9_reattaches_running_and_keeps_everything(tmp_path) -> None:
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=1") as cluster:
        with cluster.client() as c:
            done = c.submit(job(["sh", "-c", "echo finished"]))
            assert wait_for(c, done)["status"] == 0
            # Rank 0's own tasks die with the broker process; keep this job on the workers.
            c.drain([0], "broker only")
            running = c.submit(job(["sh", "-c", "sleep 2; echo survived"], nnodes=2, ntasks=2, mpi="none"))
            _started(c, running)
            queued = c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none"))
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            assert c.job(done)["state"] == "INACTIVE" and c.job(done)["status"] == 0
            assert b"finished" in b"".join(d for _, _, d in c.output(done))
            result = wait_for(c, running)
            assert result["status"] == 0 and result["exception"] is None
            assert b"survived" in b"".join(d for _, _, d in c.output(running))
            assert "alloc" not in event_names(c, running)[6:]
            assert wait_for(c, queued)["status"] == 0
            assert c.job(queued)["ranks"] == "1-2"
            assert {r["rank"]: r["state"] for r in c.resources()}[0].startswith("drain")
            fresh = c.submit(job(["true"]))
            assert fresh > queued
            assert c.status()["epoch"] == 2


def test_everything_kill9_ends_running_jobs_and_runs_queued_ones(tmp_path) -> None:
    with LocalCluster(tmp_path, size=2, fanout=2, resources="cores=1", reattach_timeout=2.0) as cluster:
        with cluster.client() as c:
            running = c.submit(job(["sleep", "60"], nnodes=2, ntasks=2, mpi="none"))
            _started(c, running)
            queued = c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none"))
        for rank in (0, 1):
            cluster.kill(rank)
        for rank in (0, 1):
            cluster.start_rank(rank)
        cluster.wait_up()
        with cluster.client() as c:
            result = wait_for(c, running)
            assert result["exception"] == "broker-restart"
            note = next(e[3]["note"] for e in c.eventlog(running) if e[2] == "exception")
            assert "reclaimed" in note
            assert wait_for(c, queued)["status"] == 0


def test_acknowledged_submissions_survive_kill9_mid_stream(tmp_path) -> None:
    acked: list[int] = []
    with LocalCluster(tmp_path, size=1, test_exec=True) as cluster:
        stop = threading.Event()

        def submit_forever() -> None:
            try:
                with cluster.client() as c:
                    while not stop.is_set():
                        for item in c.submit_many([job(["true"])] * 50):
                            if isinstance(item, int):
                                acked.append(item)
            except (ClientError, OSError):
                pass  # the broker died under us: what was acknowledged is what counts

        thread = threading.Thread(target=submit_forever)
        thread.start()
        deadline = time.monotonic() + 60
        while len(acked) <= 100:  # well into the stream, however long that takes on a loaded machine
            assert thread.is_alive() and time.monotonic() < deadline, f"{len(acked)} submissions acknowledged"
            time.sleep(0.01)
        cluster.kill(0)
        stop.set()
        thread.join(10)
        cluster.restart(0)
        with cluster.client() as c:
            known = {j["id"] for j in c.jobs(all=True, limit=len(acked) + 1000)}
            assert set(acked) <= known


@pytest.mark.slow
@pytest.mark.long
def test_kill9_during_a_50k_array_loses_no_index(tmp_path) -> None:
    with LocalCluster(tmp_path, size=3, fanout=2, test_exec=True, resources="cores=16") as cluster:
        with cluster.client() as c:
            array = c.submit(job(["true", "{cc}"], array="1-50000", env={"MC_TEST_RUN_DURATION": "0.001"}))
            until(lambda: c.job(array)["counts"]["succeeded"] >= 500, "the array is under way")
        cluster.kill(0, signal.SIGKILL)
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, array, timeout=300)
            assert result["status"] == 0
            summary = c.job(array)
            assert summary["counts"]["succeeded"] == 50000 and summary["failed"] == ""
            tasks = c.task_results(array, limit=60000)
            assert sorted(t[1] for t in tasks) == list(range(1, 50001))
            assert "clean" in event_names(c, array)


def test_results_produced_while_the_broker_is_down_are_kept(tmp_path) -> None:
    # The task says it runs, then ends only once rank 0 is stopped. Waiting for its `start` event is not enough: a
    # plain job's `start` is durable (and shown) before its `run` has left rank 0, and a rank 0 frozen in between
    # never sends it; restarted, it sees a running job no worker reports, ended `broker-restart` (137) by the
    # restart rule (docs/architecture.md#restart): how this test, waiting for `start`, failed in about 1 run in 20.
    pid_file, go = tmp_path / "task.pid", tmp_path / "go"
    script = f"echo $$ > {pid_file}.new; mv {pid_file}.new {pid_file}; until [ -e {go} ]; do sleep 0.05; done; exit 3"
    with LocalCluster(tmp_path, size=2, fanout=2, resources="cores=1") as cluster:
        with cluster.client() as c:
            c.drain([0], "keep the job on the worker")
            job_id = c.submit(job(["sh", "-c", script]))
            until(pid_file.exists, "the task starts on its worker")
        task = Path(f"/proc/{int(pid_file.read_text())}")
        cluster.procs[0].send_signal(signal.SIGSTOP)
        go.touch()
        # Ended and reaped by its worker while rank 0 cannot hear it: the worker keeps the result.
        until(lambda: not task.exists(), "the task ends")
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, job_id)
            assert result["status"] == 3 and result["exception"] is None
            assert [row[3] for row in c.task_results(job_id)] == [3]


def test_cancel_recorded_before_a_broker_crash_still_ends_the_job(tmp_path) -> None:
    with LocalCluster(tmp_path, size=2, fanout=2, resources="cores=1", kill_grace=2.0) as cluster:
        with cluster.client() as c:
            c.drain([0], "keep the job on the worker")
            job_id = c.submit(job(["sh", "-c", 'trap "" TERM; sleep 30']))
            _started(c, job_id)
            c.cancel([job_id])
            for event in c.eventlog(job_id, follow=True):
                if event[2] == "exception":
                    break
        cluster.kill(0)  # inside the kill grace: the exception is durable, the finish is not
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, job_id)
            assert result["exception"] == "cancel" and result["status"] in (137, 143)
