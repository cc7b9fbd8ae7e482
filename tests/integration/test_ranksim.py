"""The rank simulator (minicluster/testing/ranksim.py) against a real rank 0: every simulated rank joins, and an
array runs on all of them, each task done exactly once. benchmarks/ranksim.py measures with it at scale."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from minicluster.testing.ranksim import SimulatedCluster
from tests.integration.conftest import job, wait_for

pytestmark = pytest.mark.timeout(180)

SIZE = 64
TASKS = 2000


@pytest.mark.parametrize("fanout", [None, 16], ids=["flat", "fanout16"])
def test_simulated_ranks_join_and_run_an_array_once_each(tmp_path: Path, fanout: int | None) -> None:
    # 4 cores a rank: the 2,000 tasks need every rank's cores, so every simulated rank must answer `run`.
    with SimulatedCluster(tmp_path, size=SIZE, processes=2, fanout=fanout, resources="cores=4") as sim:
        sim.wait_joined(timeout=60)
        with sim.local.client() as client:
            states = {row["rank"]: row["state"] for row in client.status()["ranks"]}
            assert states == dict.fromkeys(range(SIZE), "up")
            assert len(client.resources()) == SIZE
            array = client.submit(job(["true"], array=f"1-{TASKS}"))
            result = wait_for(client, array, timeout=120)
            assert result["status"] == 0
            rows = client.task_results(array)
    assert Counter(row[1] for row in rows) == Counter(range(1, TASKS + 1))
    assert all(row[3] == 0 for row in rows)
    assert {row[2] for row in rows} == set(range(SIZE))
