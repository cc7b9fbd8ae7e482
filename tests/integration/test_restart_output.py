"""Broker restarts with jobs that print (issue 10 item 4): every per-job counter (event sequence, output
sequence and bytes, task counts) comes back from the journal, so output, events and results written after
the restart are kept."""
from __future__ import annotations

import time

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, output_of, started, wait_for


def assert_gapless(c: Client, job_id: int) -> list[str]:
    """The job's event log is numbered 0, 1, 2, ... and ends with `clean`; returns the event names."""
    events = list(c.eventlog(job_id))
    assert [e[0] for e in events] == list(range(len(events))), events
    assert events[-1][2] == "clean"
    return [e[2] for e in events]


def wait_output(c: Client, job_id: int, needle: bytes, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b"".join(d for _, _, d in c.output(job_id)).count(needle) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not print {needle!r} {count} times in {timeout}s")


@pytest.mark.timeout(60)
def test_reattached_job_keeps_every_line_and_its_success_across_two_restarts(tmp_path) -> None:
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=1") as cluster:
        with cluster.client() as c:
            c.drain([0], "keep the job on the workers")  # rank 0's tasks die with the broker
            job_id = c.submit(job(["sh", "-c", "echo before$MC_TASK_RANK; sleep 2; echo after$MC_TASK_RANK"],
                                  nnodes=2, ntasks=2, mpi="none"))
            started(c, job_id)
            wait_output(c, job_id, b"before", 2)
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, job_id)
            assert result["status"] == 0 and result["exception"] is None
            assert output_of(c, job_id) == {0: b"before0\nafter0\n", 1: b"before1\nafter1\n"}
            names = assert_gapless(c, job_id)
            assert names.count("start") == 1 and "exception" not in names
            assert c.job(job_id)["counts"]["succeeded"] == 2
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            summary = c.job(job_id)
            assert summary["status"] == 0 and summary["exception"] is None
            assert output_of(c, job_id) == {0: b"before0\nafter0\n", 1: b"before1\nafter1\n"}
            assert_gapless(c, job_id)
            # What is written after the restarts still fits: a new job prints and ends.
            fresh = c.submit(job(["echo", "fresh"]))
            assert wait_for(c, fresh)["status"] == 0, (c.job(fresh), list(c.eventlog(fresh)))
            assert output_of(c, fresh) == {0: b"fresh\n"}


@pytest.mark.timeout(60)
@pytest.mark.long
def test_array_that_prints_keeps_every_result_and_line_across_a_restart(tmp_path) -> None:
    indexes = range(1, 13)
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=2") as cluster:
        with cluster.client() as c:
            c.drain([0], "keep the elements on the workers")
            array = c.submit(job(["sh", "-c", "echo a$MC_TASK_INDEX; sleep 1.5; echo b$MC_TASK_INDEX"],
                                 array="1-12"))
            # The first 4 elements print, then run through the crash; the rest run after it. (A line in flight
            # to rank 0 at the instant it dies is lost: the kill falls between lines.)
            wait_output(c, array, b"a", 4)
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, array)
            assert result["status"] == 0 and result["exception"] is None
            summary = c.job(array)
            assert summary["counts"]["succeeded"] == 12 and summary["counts"]["failed"] == 0
            assert sorted(row[1] for row in c.task_results(array)) == list(indexes)
            lines = b"".join(d for _, stream, d in c.output(array) if stream == 1).split()
            assert sorted(lines) == sorted([f"a{i}".encode() for i in indexes] + [f"b{i}".encode() for i in indexes])
            assert_gapless(c, array)
