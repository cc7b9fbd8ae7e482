"""The worker agent's edge (worker/agent.py `handle`): every message is decoded once before a handler runs; a
malformed one is answered with `error` and changes nothing (protocol.md §2.5). No sockets: a RecordingSender."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from minicluster.config import from_mapping
from minicluster.proto.envelope import Message
from minicluster.testing import RecordingSender
from minicluster.testing.builders import resources
from worker.agent import RESEND_HEARTBEATS, WorkerAgent


@pytest.fixture
def agent_and_sender(tmp_path: Path) -> tuple[WorkerAgent, RecordingSender]:
    config = from_mapping({"state_dir": str(tmp_path), "resources": "cores=2", "test_exec": True})
    sender = RecordingSender(rank=1)
    return WorkerAgent(config, 1, sender.send, resources("cores=2"), "unix:///nonexistent"), sender


@pytest.mark.parametrize(("kind", "body", "says"), [
    ("kill", {"keys": [[1, 0]]}, "kill: missing field 'signal'"),
    ("welcome", {"epoch": "3"}, "welcome: field 'epoch' has the wrong type"),
    ("run", {"jobs": {1: {"argv": "true"}}, "tasks": [[1, 0, 0, [0], []]]}, "run: jobs[1]: field 'argv' has the "
                                                                            "wrong type"),
    ("stdin", {"job": 1, "seq": 0, "tasks": ["0"]}, "stdin: field 'tasks' has the wrong type"),
    ("pmi-kvs", {"job": 1, "seq": 0}, "pmi-kvs: exactly one of 'kvs' and 'data' is expected"),
    ("done-ack", {"keys": 7}, "done-ack: field 'keys' has the wrong type"),
])
def test_a_malformed_message_is_answered_and_changes_nothing(agent_and_sender: tuple[WorkerAgent, RecordingSender],
                                                             kind: str, body: dict[str, Any], says: str) -> None:
    agent, sender = agent_and_sender
    agent.handle(Message(kind, 0, 1, body))
    refusal = sender.only("error")
    assert (refusal.dst, refusal.body) == (0, {"code": "bad-request", "message": says, "ref": kind})
    assert sender.sent == [] and agent.epoch == 0 and not agent.jobs and not agent.running


async def test_malformed_rows_of_a_run_are_reported_and_the_rest_started(
        agent_and_sender: tuple[WorkerAgent, RecordingSender]) -> None:
    agent, sender = agent_and_sender
    info = {"argv": ["true"], "env": {}, "ntasks": 2, "layout": [[1, 2]], "uid": 0, "gid": 0}
    agent.handle(Message("run", 0, 1, {"jobs": {1: info}, "tasks": [[1, "0", 0, [0], []], [1, 1, 1, [1], []]]}))
    assert sender.only("error").body == {"code": "bad-request", "message": "run: 1 malformed rows were dropped",
                                         "ref": "run"}
    try:
        assert list(agent.running) == [(1, 1)]
    finally:
        await agent.shutdown()


async def test_an_unacknowledged_result_goes_again_only_once_it_is_overdue(
        agent_and_sender: tuple[WorkerAgent, RecordingSender]) -> None:
    """Results re-sent at every heartbeat while their commit was on its way doubled rank 0's CPU per task."""
    agent, sender = agent_and_sender
    agent.handle(Message("welcome", 0, 1, {"epoch": 1, "size": 2}))
    info = {"argv": ["true"], "env": {}, "ntasks": 1, "layout": [[1, 1]], "uid": 0, "gid": 0}
    try:
        agent.handle(Message("run", 0, 1, {"jobs": {1: info}, "tasks": [[1, 0, 0, [0], []]]}))
        for _ in range(200):
            if agent.unacked and "done" in sender.kinds():
                break
            await asyncio.sleep(0.01)
        assert [row[:2] for m in sender.take("done") for row in m.body["results"]] == [[1, 0]]
        def heartbeats(n: int) -> list[list[Any]]:
            for _ in range(n):
                agent._resend_overdue_results()
            return [row[:2] for m in sender.take("done") for row in m.body["results"]]

        assert heartbeats(RESEND_HEARTBEATS) == [], "the first time after it was sent it is on its way"
        assert heartbeats(RESEND_HEARTBEATS - 1) == [], "only every RESEND_HEARTBEATS heartbeats"
        assert heartbeats(1) == [[1, 0]], "still unacknowledged the next time: lost, so again"
        agent.handle(Message("done-ack", 0, 1, {"keys": [[1, 0]]}))
        assert heartbeats(2 * RESEND_HEARTBEATS) == []
        assert not agent.unacked
    finally:
        await agent.shutdown()
