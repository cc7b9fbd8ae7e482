"""`broker_runs_tasks = false`: rank 0 keeps its node for the broker; every task runs on the workers."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for


@pytest.fixture(scope="module")
def broker_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with (LocalCluster(tmp_path_factory.mktemp("brt"), size=3, fanout=2, resources="cores=1",
                       broker_runs_tasks=False) as cluster, cluster.client() as client):
        yield client


def test_no_task_lands_on_rank_0(broker_only: Client) -> None:
    # Four one-core jobs at once on three one-core ranks: with rank 0 offered, two would start there.
    ids = [broker_only.submit(job(["sleep", "0.3"])) for _ in range(4)]
    assert [wait_for(broker_only, i)["status"] for i in ids] == [0] * 4
    assert sorted(broker_only.job(i)["ranks"] for i in ids) == ["1", "1", "2", "2"]
    gang = broker_only.submit(job(["true"], nnodes=2, ntasks=2, mpi="none"))
    assert wait_for(broker_only, gang)["status"] == 0 and broker_only.job(gang)["ranks"] == "1-2"


def test_a_job_wanting_every_rank_is_refused_at_submit(broker_only: Client) -> None:
    with pytest.raises(ClientError, match="needs 3 nodes, the MiniCluster has 2"):
        broker_only.submit(job(["true"], nnodes=3, ntasks=3, mpi="none"))


def test_rank_0_is_up_but_offers_no_node(broker_only: Client) -> None:
    assert [r["rank"] for r in broker_only.resources()] == [1, 2]
    assert [r["state"] for r in broker_only.status()["ranks"]] == ["up"] * 3
