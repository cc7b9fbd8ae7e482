"""Disruptions do not count against retries (protocol.md §3.9.2): a lost node's tasks and a plain job a restarted
broker could not reattach are requeued, for jobs with a failure policy, whatever their retry budget."""
from __future__ import annotations

import time

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for


def _running_on(c: Client, job_id: int, rank: int, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        summary = c.job(job_id)
        if summary["counts"]["running"] and str(rank) in summary["ranks"].replace("-", ",").split(","):
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never ran on rank {rank}: {c.job(job_id)}")


@pytest.mark.long
def test_lost_node_requeues_array_elements_and_plain_jobs(tmp_path) -> None:
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=2", lost_after=1.5) as cluster, \
            cluster.client() as c:
        c.drain([0], "keep the broker's node free")
        # No retries at all: only the disruption may run an index or the job again.
        array = c.submit(job(["sh", "-c", "sleep 2"], array="0-3", max_retries_per_index=0))
        _running_on(c, array, 2)
        cluster.kill(2)
        result = wait_for(c, array, timeout=60)
        assert result["status"] == 0 and result["exception"] is None
        assert c.job(array)["retries"] == 0 and c.job(array)["counts"]["succeeded"] == 4
        outcomes = [r[10] for r in c.attempts(array)]
        assert outcomes.count("node-lost") == 2 and outcomes.count("final") == 4
        requeues = [e[3] for e in c.eventlog(array) if e[2] == "requeue"]
        assert requeues and all(e["reason"] == "node-lost" for e in requeues)
        cluster.restart(2)

        plain = c.submit(job(["sh", "-c", "sleep 2"], nnodes=2, ntasks=2, mpi="none", retries=0))
        _running_on(c, plain, 2)
        cluster.kill(2)
        cluster.restart(2)
        result = wait_for(c, plain, timeout=60)
        assert result["status"] == 0 and result["exception"] is None
        names = [e[2] for e in c.eventlog(plain)]
        assert names.count("requeue") == 1 and names.count("start") == 2
        exceptions = [e[3] for e in c.eventlog(plain) if e[2] == "exception"]
        assert exceptions[0]["type"] == "node-lost" and exceptions[0]["severity"] == 1
        assert [(r[0], r[2], r[10]) for r in c.attempts(plain)] == [
            (0, 0, "node-lost"), (0, 1, "final"), (1, 0, "node-lost"), (1, 1, "final")]


def test_plain_job_the_restarted_broker_cannot_reattach_is_requeued(tmp_path) -> None:
    with LocalCluster(tmp_path, size=2, fanout=2, resources="cores=2", reattach_timeout=2.0) as cluster:
        with cluster.client() as c:
            job_id = c.submit(job(["sh", "-c", "[ $MC_TASK_ATTEMPT = 1 ] || sleep 60"], nnodes=2, ntasks=2,
                                  mpi="none", retries=0))
            unrelated = c.submit(job(["sleep", "60"], nnodes=2, ntasks=2, mpi="none"))
            started(c, job_id)
            started(c, unrelated)
        cluster.kill(0)
        cluster.kill(1)                             # the worker too: nothing of the attempt survives
        cluster.start_rank(0)
        cluster.start_rank(1)
        cluster.wait_up()
        with cluster.client() as c:
            assert wait_for(c, job_id, timeout=60)["status"] == 0
            requeue = [e[3] for e in c.eventlog(job_id) if e[2] == "requeue"]
            assert requeue == [{"attempt": 1, "reason": "broker-restart"}]
            assert c.job(job_id)["retries"] == 0
            # Without a failure policy the old rule holds.
            assert wait_for(c, unrelated)["exception"] == "broker-restart"
