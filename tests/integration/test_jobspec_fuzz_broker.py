"""Fuzzing submit on a real broker (issue 10): hostile jobspecs (huge, nested, NUL-laden) are each answered,
accepted or refused with a clear, short error, and the broker keeps serving. Accepted jobs are held, so nothing
a fuzzed spec names is ever run or opened."""
from __future__ import annotations

from typing import Any

import pytest
import msgpack
from hypothesis import HealthCheck, assume, given, settings

from minicluster.client import ClientError
from minicluster.proto import frames
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for
from tests.unit.jobspecgen import SPEC

# Codes a submit may answer with for a bad spec; anything else (an internal error, a dropped connection) fails.
REFUSALS = {"invalid-jobspec", "infeasible", "bad-request", "not-found", "permission"}
MAX_MESSAGE = 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("fuzz"), size=1).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def tally() -> dict[str, int]:
    return {"accepted": 0, "refused": 0}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(spec=SPEC)
def test_every_submit_is_answered_clearly(cluster: LocalCluster, tally: dict[str, int], spec: dict[str, Any]) -> None:
    spec = {**spec, "hold": True}
    assume(len(msgpack.packb(spec)) < frames.MAX_FRAME - 4096)  # a bigger frame is refused unread (test_bad_input)
    with cluster.client() as c:
        try:
            job_id = c.call("submit", jobspec=spec)["job"]
        except ClientError as exc:
            assert exc.code in REFUSALS, exc
            assert exc.message and len(exc.message) <= MAX_MESSAGE, exc.message[:200]
            tally["refused"] += 1
            return
        tally["accepted"] += 1
        assert c.cancel([job_id])[0] == [job_id]


def test_the_broker_still_serves_after_the_fuzzing(cluster: LocalCluster, tally: dict[str, int]) -> None:
    assert tally["refused"] > 0
    with cluster.client() as c:
        assert wait_for(c, c.submit(job(["true"])))["status"] == 0
        assert c.hello()["owner_uid"] >= 0
