"""`mc shutdown` then a start on the same state directory (issue 24 item 7, broker/stop.py): a planned stop requeues
what it interrupts, as Slurm does, so it never costs more than a crash would; `--cancel` ends running jobs as
cancelled, `--drain` waits for them. Real processes, real signals, the real journal."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """Where the tasks leave their marks."""
    path = tmp_path / "work"
    path.mkdir()
    return path


def once_then_done(workdir: Path, name: str) -> list[str]:
    """A task whose first run records itself and sleeps (to be interrupted); a later run records itself and ends."""
    log, mark = workdir / f"{name}.runs", workdir / f"{name}.mark"
    return ["sh", "-c", f'echo run >> "{log}"; [ -e "{mark}" ] && exit 0; touch "{mark}"; exec sleep 120']


def runs(workdir: Path, name: str) -> int:
    path = workdir / f"{name}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def stop_all(cluster: LocalCluster, mode: list[str]) -> None:
    """`mc shutdown [mode]`, and every rank exits by itself with 0 (a clean end)."""
    subprocess.run(["mc", "shutdown", *mode], check=True, timeout=30, env={**os.environ, "MC_URI": cluster.uri})
    for proc in cluster.procs.values():
        assert proc.wait(60) == 0


def start_again(cluster: LocalCluster) -> None:
    for rank in range(cluster.config.size):
        cluster.start_rank(rank)
    cluster.wait_up()


def counts_agree(c: Client, expected: dict[str, int]) -> None:
    """`mc jobs -a` (each job's end) and `mc status` (the counts) say the same."""
    listed = c.jobs(all=True)
    ends = {"succeeded": 0, "failed": 0, "cancelled": 0}
    for row in listed:
        assert row["state"] == "INACTIVE", row
        kind = "cancelled" if row["exception"] == "cancel" else "failed" if row["status"] else "succeeded"
        ends[kind] += 1
    assert ends == expected, listed
    assert c.status()["queue"]["INACTIVE"] == len(listed)


def test_a_planned_stop_requeues_running_jobs_without_using_a_retry_and_a_restart_runs_them(
        tmp_path: Path, work: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=2, resources="cores=1")
    with cluster:
        with cluster.client() as c:
            retried = c.submit(job(once_then_done(work, "retries1"), retries=1))
            plain = c.submit(job(once_then_done(work, "retries0")))
            after = c.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [retried, plain]}]))
            started(c, retried)
            started(c, plain)
        stop_all(cluster, [])
        assert runs(work, "retries1") == runs(work, "retries0") == 1
        start_again(cluster)
        with cluster.client() as c:
            for job_id in (retried, plain, after):
                result = wait_for(c, job_id, timeout=60)
                assert result["status"] == 0 and result["exception"] is None, (job_id, list(c.eventlog(job_id)))
            assert runs(work, "retries1") == runs(work, "retries0") == 2
            for job_id in (retried, plain):
                assert c.job(job_id)["retries"] == 0  # the stop used no retry
                outcomes = [row[10] for row in c.attempts(job_id)]
                assert outcomes[0] == "shutdown", outcomes
            counts_agree(c, {"succeeded": 3, "failed": 0, "cancelled": 0})


def test_shutdown_cancel_ends_running_jobs_as_cancelled_and_their_dependants_fail(tmp_path: Path, work: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=2, resources="cores=1")
    with cluster:
        with cluster.client() as c:
            running = c.submit(job(once_then_done(work, "cancelled"), retries=1))
            after = c.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [running]}]))
            started(c, running)
        stop_all(cluster, ["--cancel"])
        start_again(cluster)
        with cluster.client() as c:
            assert wait_for(c, running)["exception"] == "cancel"
            assert wait_for(c, after)["exception"] == "dependency"
            assert runs(work, "cancelled") == 1
            counts_agree(c, {"succeeded": 0, "failed": 1, "cancelled": 1})


@pytest.mark.long
def test_shutdown_drain_refuses_new_work_lets_running_jobs_end_and_a_second_stop_requeues_the_rest(
        tmp_path: Path, work: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=2, resources="cores=1")
    with cluster:
        with cluster.client() as c:
            short = c.submit(job(["sleep", "3"]))
            long = c.submit(job(once_then_done(work, "long")))
            queued = c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none"))
            started(c, short)
            started(c, long)
            c.shutdown("drain")
            queued_too = []  # accepted in the moment before the stop began: queued like the others
            while True:
                try:
                    queued_too.append(c.submit(job(["true"])))
                except ClientError as exc:
                    assert exc.code == "shutting-down", exc
                    break
            assert wait_for(c, short)["status"] == 0  # the drain let it run to its end
            assert c.job(long)["state"] == "RUN" and c.job(queued)["state"] == "SCHED"
        stop_all(cluster, [])  # no more waiting: what still runs is requeued
        start_again(cluster)
        with cluster.client() as c:
            for job_id in (long, queued, *queued_too):
                assert wait_for(c, job_id)["status"] == 0
            assert c.attempts(long)[0][10] == "shutdown"
            assert runs(work, "long") == 2
            counts_agree(c, {"succeeded": 3 + len(queued_too), "failed": 0, "cancelled": 0})


def test_a_planned_stop_requeues_the_running_elements_of_an_array_and_each_index_ends_once(
        tmp_path: Path, work: Path) -> None:
    # Until the stop an element runs on (to be interrupted); once the instance was stopped, it ends at once.
    element = ["sh", "-c", f'echo {{cc}} >> "{work}/ran"; [ -e "{work}/stopped" ] && exit 0; exec sleep 120']
    cluster = LocalCluster(tmp_path / "state", size=2, resources="cores=1", dispatch_window=0)
    with cluster:
        with cluster.client() as c:
            array = c.submit(job(element, array="0-5"))
            started(c, array)
        stop_all(cluster, [])
        (work / "stopped").touch()
        first = sorted(int(i) for i in (work / "ran").read_text().split())
        assert first, "elements ran before the stop"
        start_again(cluster)
        with cluster.client() as c:
            result = wait_for(c, array, timeout=60)
            assert result["status"] == 0 and result["exception"] is None
            assert c.job(array)["counts"]["succeeded"] == 6
            interrupted = {row[1]: row[10] for row in c.attempts(array) if row[10] != "final"}
            assert set(interrupted) == set(first) and set(interrupted.values()) == {"shutdown"}, interrupted
            counts_agree(c, {"succeeded": 1, "failed": 0, "cancelled": 0})
    ran = sorted(int(i) for i in (work / "ran").read_text().split())
    assert ran == sorted([*range(6), *first]), "each interrupted index ran again, every other one once"
