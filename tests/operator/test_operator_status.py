"""Tier (a): status derivation, conditions and metrics are pure functions."""
from __future__ import annotations

from typing import Any

import pytest

from minicluster.operator.metrics import Metrics
from minicluster.operator.spec import MiniCluster
from minicluster.operator.status import changed, derive, set_condition

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
BROKER = {"ready": False, "ranks": {"up": 1, "expected": 4, "unresponsive": 1, "lost": 0},
          "jobs": {"queued": 2, "running": 0, "finished": 0, "failed": 0}, "command": None}


def job(suspend: bool = False, **conditions: str) -> dict[str, Any]:
    return {"spec": {"suspend": suspend},
            "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": f"{t} because {r}"}
                                      for t, r in conditions.items()]}}


def conditions(fields: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in fields["conditions"]}


@pytest.fixture
def mc(body: dict[str, Any]) -> MiniCluster:
    return MiniCluster.from_body(body)


@pytest.mark.parametrize("the_job, broker, phase, reason", [
    (job(), None, "Pending", "BrokerUnreachable"),
    (job(), BROKER, "Pending", "RanksJoining"),
    (job(), {**BROKER, "ready": True}, "Running", "AllRanksJoined"),
    (job(suspend=True), None, "Suspended", "SuspendedBySpec"),
    (job(Complete="Completed"), None, "Succeeded", "BrokerSucceeded"),
    (job(SuccessCriteriaMet="SuccessPolicy"), None, "Succeeded", "BrokerSucceeded"),
    (job(Failed="PodFailurePolicy"), None, "Failed", "PodFailurePolicy"),
    (job(FailureTarget="DeadlineExceeded"), BROKER, "Failed", "DeadlineExceeded"),
    (job(), {**BROKER, "command": {"state": "exited", "status": 2}}, "Failed", "CommandFailed"),
])
def test_phase(mc: MiniCluster, the_job: dict[str, Any], broker: Any, phase: str, reason: str) -> None:
    fields = derive(mc, {}, the_job, broker, NOW)
    assert fields["phase"] == phase
    states = conditions(fields)
    if phase in ("Suspended", "Succeeded", "Failed"):
        assert states[phase] == ("True", reason)
    assert states["Ready"][0] == ("True" if phase == "Running" else "False")
    assert states["Ready"][1] == reason or phase != "Pending"


def test_ready_only_when_every_expected_rank_joined(mc: MiniCluster) -> None:
    fields = derive(mc, {}, job(), BROKER, NOW)
    assert fields["ranks"] == {"joined": 1, "expected": 4, "unresponsive": 1, "lost": 0}
    ready = next(c for c in fields["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["message"] == "1/4 ranks joined"


def test_unreachable_broker_keeps_the_last_known_counts(mc: MiniCluster) -> None:
    old = {"jobs": {"queued": 0, "running": 0, "finished": 9, "failed": 1}}
    assert "jobs" not in changed(old, derive(mc, old, job(), None, NOW))


def test_transition_time_moves_only_on_a_flip() -> None:
    first = set_condition([], "Ready", False, "RanksJoining", "1/4", NOW)
    same = set_condition(first, "Ready", False, "RanksJoining", "3/4", LATER)
    flipped = set_condition(same, "Ready", True, "AllRanksJoined", "", LATER)
    assert same[0]["lastTransitionTime"] == NOW and same[0]["message"] == "3/4"
    assert flipped[0]["lastTransitionTime"] == LATER and "message" not in flipped[0]


def test_unchanged_status_costs_no_write(mc: MiniCluster) -> None:
    fields = derive(mc, {}, job(), BROKER, NOW)
    assert changed(fields, derive(mc, fields, job(), BROKER, LATER)) == {}


def test_metrics_text() -> None:
    metrics = Metrics()
    metrics.reconciled("reconcile")
    metrics.failed("status")
    metrics.set_phase("a", "x", "Running")
    metrics.set_phase("b", "y", "Running")
    metrics.set_phase("b", "z", "Failed")
    metrics.forget("b", "z")
    text = metrics.render()
    assert 'minicluster_operator_reconciles_total{handler="reconcile"} 1' in text
    assert 'minicluster_operator_errors_total{handler="status"} 1' in text
    assert 'minicluster_operator_miniclusters{phase="Running"} 2' in text
    assert 'minicluster_operator_miniclusters{phase="Failed"} 0' in text


async def test_metrics_endpoint_serves_prometheus_text() -> None:
    import socket

    import aiohttp

    from minicluster.operator.metrics import serve
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics()
    metrics.reconciled("status")
    runner = await serve(metrics, "127.0.0.1", port)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert resp.status == 200 and resp.content_type == "text/plain"
                assert 'handler="status"} 1' in await resp.text()
    finally:
        await runner.cleanup()
