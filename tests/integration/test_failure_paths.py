"""Failure paths of the broker's own loops (issue 10 item 10): a loop that raises ends the broker loudly, to be
restarted, instead of leaving it up without liveness detection or time limits; and liveness and time limits
measure intervals on the monotonic clock, so a wall clock that jumps neither ends jobs early nor keeps them
(or a dead rank) forever.  Faults are injected into the broker process by tests/integration/faults."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minicluster import exitcodes
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for

FAULTS = str(Path(__file__).parent / "faults")
DAY = 86_400


def start_with_broker_env(cluster: LocalCluster, env: dict[str, str], stderr: object = None) -> None:
    """Like LocalCluster.start, with faults in rank 0's process only."""
    pythonpath = os.pathsep.join(p for p in (FAULTS, os.environ.get("PYTHONPATH")) if p)
    cluster.start_rank(0, env={"PYTHONPATH": pythonpath, **env}, stderr=stderr)
    for rank in range(1, cluster.config.size):
        cluster.start_rank(rank)
    cluster.wait_up()


@pytest.mark.slow
@pytest.mark.long
def test_a_failing_time_limit_loop_ends_the_broker_loudly(tmp_path: Path) -> None:
    trigger, log = tmp_path / "fail-now", tmp_path / "broker.log"
    cluster = LocalCluster(tmp_path / "mc", size=2)
    try:
        with log.open("wb") as stderr:
            start_with_broker_env(cluster, {"MC_TEST_FAIL": f"broker.execution:Execution.check_deadlines:{trigger}"},
                                  stderr)
        trigger.touch()
        assert cluster.procs[0].wait(20) == exitcodes.CRASHED
        text = log.read_text()
        assert "the time-limit loop failed" in text and "RuntimeError: injected fault" in text
        trigger.unlink()
        cluster.restart(0)  # what Kubernetes does with a crashed broker
        with cluster.client() as c:
            assert wait_for(c, c.submit(job(["true"])))["status"] == 0
    finally:
        cluster.stop()


def test_a_wall_clock_jump_forward_ends_no_job_early(tmp_path: Path) -> None:
    shift = tmp_path / "shift"
    cluster = LocalCluster(tmp_path / "mc", size=2)
    try:
        start_with_broker_env(cluster, {"MC_TEST_CLOCK_SHIFT": str(shift)})
        with cluster.client() as c:
            long = c.submit(job(["sleep", "60"], time_limit=3600, nnodes=1, ntasks=1))
            started(c, long)
            shift.write_text(str(2 * DAY))
            # A job whose limit passes after the jump: once it timed out, the time-limit loop has run past it.
            witness = c.submit(job(["sleep", "60"], time_limit=0.5, nnodes=1, ntasks=1))
            assert wait_for(c, witness)["exception"] == "timeout"
            assert c.job(long)["state"] == "RUN", "a wall clock two days ahead ended a job of an hour"
            assert {r["state"] for r in c.status()["ranks"]} == {"up"}
            c.cancel([long])
            wait_for(c, long)
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.long
def test_a_wall_clock_jump_back_delays_no_time_limit_and_no_lost_rank(tmp_path: Path) -> None:
    shift = tmp_path / "shift"
    cluster = LocalCluster(tmp_path / "mc", size=2)
    try:
        start_with_broker_env(cluster, {"MC_TEST_CLOCK_SHIFT": str(shift)})
        with cluster.client() as c:
            limited = c.submit(job(["sleep", "60"], time_limit=2, nnodes=1, ntasks=1))
            started(c, limited)
            shift.write_text(str(-DAY))
            assert wait_for(c, limited, timeout=20)["exception"] == "timeout"
        cluster.kill(1)
        cluster.wait_states({1: "lost"}, timeout=20)
    finally:
        cluster.stop()
