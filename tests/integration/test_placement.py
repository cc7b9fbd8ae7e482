"""Scheduling through the matcher on a real cluster: node properties and constraints, policies, exclusive
nodes, drain and undrain, the allocation bound to exact cores, and backfill estimates in `jobs`."""
from __future__ import annotations

import json
import sys
import time

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, output_of, started, wait_for

ZONES = {0: "zone=a", 1: "zone=a,spot", 2: "zone=b"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("place"), size=3, fanout=2, resources="cores=2")
    for rank, props in ZONES.items():
        c.start_rank(rank, env={"MC_PROPERTIES": props})
    c.wait_up()
    yield c
    c.stop()


def ranks_of(client: Client, spec: dict) -> str:
    job_id = client.submit(spec)
    assert wait_for(client, job_id)["status"] == 0
    return client.job(job_id)["ranks"]


def test_constraints_pick_nodes(client: Client) -> None:
    assert ranks_of(client, job(["true"], requires=["zone=b"])) == "2"
    assert ranks_of(client, job(["true"], requires=["spot"])) == "1"
    assert ranks_of(client, job(["true"], nnodes=2, ntasks=2, mpi="none", requires=["zone=a"])) == "0-1"
    with pytest.raises(ClientError) as info:
        client.submit(job(["true"], requires=["zone=c"]))
    assert info.value.code == "infeasible" and "zone=c" in str(info.value)


def test_policies(client: Client) -> None:
    assert ranks_of(client, job(["true"], ntasks=2, mpi="none", policy="pack")) in ("0", "1", "2")
    assert ranks_of(client, job(["true"], ntasks=3, mpi="none", policy="spread")) == "0-2"
    assert ranks_of(client, job(["true"], policy="high-id")) == "2"


def test_exclusive_job_gets_whole_nodes(client: Client) -> None:
    code = "import os;print(sorted(os.sched_getaffinity(0)))"
    job_id = client.submit(job([sys.executable, "-c", code], nnodes=1, ntasks=1, exclusive=True))
    assert wait_for(client, job_id)["status"] == 0
    rank = int(client.job(job_id)["ranks"])
    row = next(r for r in client.resources() if r["rank"] == rank)
    assert row["cores_total"] == 2
    assert json.loads(output_of(client, job_id)[0]) in ([0], [1])


def test_drain_and_undrain(client: Client) -> None:
    client.drain([2], "maintenance")
    row = next(r for r in client.resources() if r["rank"] == 2)
    assert "drain" in row["state"] and row["reason"] == "maintenance"
    blocked = client.submit(job(["true"], requires=["zone=b"]))
    assert client.job(blocked)["state"] == "SCHED"
    client.undrain([2])
    assert wait_for(client, blocked)["status"] == 0


def test_backfill_estimate_for_blocked_head(client: Client) -> None:
    long = client.submit(job(["sleep", "5"], nnodes=3, ntasks=6, mpi="none", time_limit=30))
    started(client, long)
    head = client.submit(job(["true"], nnodes=3, ntasks=3, mpi="none", time_limit=10))
    small = client.submit(job(["true"], time_limit=5))
    # The reservation is made by the scheduler's next pass, after the submit is acknowledged.
    summary = client.job(head)
    deadline = time.monotonic() + 10
    while summary["est_start"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
        summary = client.job(head)
    assert summary["state"] == "SCHED" and summary["est_start"] is not None
    # The holder's planned end: allocated (after its submit, before its start event) plus its 30 s limit.
    holder = client.job(long)
    assert holder["t_submit"] + 30 <= summary["est_start"] <= holder["t_run"] + 30 + 1e-3
    # The small job does not fit either (every core is busy) and must not jump ahead of the reservation.
    client.cancel([long])
    for j in (head, small):
        assert wait_for(client, j)["status"] == 0


def test_no_estimate_rests_on_the_default_time_limit(client: Client) -> None:
    holder = client.submit(job(["sleep", "5"], nnodes=3, ntasks=6, mpi="none"))  # no -t
    head = client.submit(job(["true"], nnodes=3, ntasks=3, mpi="none"))
    summary = client.job(head)
    assert summary["state"] == "SCHED" and summary["est_start"] is None
    client.cancel([holder])
    assert wait_for(client, head)["status"] == 0


def test_default_placement_follows_rank_order_not_join_order(tmp_path_factory: pytest.TempPathFactory) -> None:
    c = LocalCluster(tmp_path_factory.mktemp("order"), size=4, fanout=3, resources="cores=1")
    try:
        for rank in (0, 3, 1, 2):  # rank 3 joins before ranks 1 and 2
            c.start_rank(rank)
            c.wait_states({rank: "up"})
        with c.client() as client:
            assert ranks_of(client, job(["true"], nnodes=3, ntasks=3, mpi="none")) == "0-2"
            assert ranks_of(client, job(["true"])) == "0"
    finally:
        c.stop()
