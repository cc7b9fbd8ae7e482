"""The worker agent's edge (worker/agent.py `handle`): every message is decoded once before a handler runs; a
malformed one is answered with `error` and changes nothing (protocol.md §2.5). No sockets: a RecordingSender."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from minicluster.config import from_mapping
from minicluster.proto.envelope import Message
from minicluster.testing import RecordingSender
from minicluster.testing.builders import resources
from worker.agent import WorkerAgent


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
