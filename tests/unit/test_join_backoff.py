"""A worker's `join` repeated with backoff until the welcome (protocol.md §2.6): the schedule (minicluster/proto/
backoff.py) and the agent that follows it (worker/agent.py), with a RecordingSender: no sockets, no rank 0."""
from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from minicluster.config import from_mapping
from minicluster.proto.backoff import JOIN_REPEAT_CAP, JOIN_REPEAT_FIRST, Backoff
from minicluster.proto.envelope import Message
from minicluster.testing import RecordingSender, until_true
from minicluster.testing.builders import resources
from worker.agent import WorkerAgent


def test_the_waits_double_up_to_the_cap_each_drawn_from_its_upper_half() -> None:
    low = Backoff(first=0.2, cap=5.0, uniform=lambda: 0.0)
    assert [round(low.next_wait(), 6) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5, 2.5]
    high = Backoff(first=0.2, cap=5.0, uniform=lambda: 0.999999)
    assert [round(high.next_wait(), 3) for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    high.reset()
    assert round(high.next_wait(), 3) == 0.2, "a reset starts over from the first wait"


def test_drawn_waits_stay_within_the_rule() -> None:
    schedule = Backoff()
    for n in range(200):
        step = min(JOIN_REPEAT_CAP, JOIN_REPEAT_FIRST * 2 ** n)
        assert step / 2 <= schedule.next_wait() < step


class TimedSender(RecordingSender):
    """Records when each message left, on the monotonic clock."""

    def __init__(self) -> None:
        super().__init__(rank=1)
        self.times: list[tuple[str, float]] = []

    def send(self, kind: str, dst: int, body: dict[str, object]) -> None:
        super().send(kind, dst, body)
        self.times.append((kind, time.monotonic()))


@pytest.fixture
def agent_and_sender(tmp_path: Path) -> tuple[WorkerAgent, TimedSender]:
    config = from_mapping({"state_dir": str(tmp_path), "resources": "cores=2", "test_exec": True,
                           "heartbeat_interval": 0.05})
    sender = TimedSender()
    return WorkerAgent(config, 1, sender.send, resources("cores=2"), "unix:///nonexistent"), sender


async def test_an_agent_repeats_its_join_backing_off_and_sends_no_heartbeat_before_the_welcome(
        agent_and_sender: tuple[WorkerAgent, TimedSender]) -> None:
    agent, sender = agent_and_sender
    agent.join_repeats = Backoff(first=0.04, cap=0.32)
    running = asyncio.get_running_loop().create_task(agent.run())
    try:
        await until_true(lambda: len(sender.times) >= 5, "five joins")
        kinds = [kind for kind, _ in sender.times]
        assert set(kinds) == {"join"}, f"only joins before the welcome, not {kinds}"
        sent = [t for _, t in sender.times]
        for n, (before, after) in enumerate(itertools.pairwise(sent)):
            # A loaded machine only makes the waits longer: each is at least its step's lower half.
            assert after - before >= min(0.32, 0.04 * 2 ** n) / 2 - 0.005, f"repeat {n + 1} came too soon"

        agent.handle(Message("welcome", 0, 1, {"epoch": 1, "size": 2}))
        sender.take()
        await until_true(lambda: "hb" in sender.kinds(), "a heartbeat")
        assert "join" not in sender.kinds(), "welcomed: no more joins"

        agent.handle(Message("rejoin", 0, 1, {"epoch": 2}))
        assert sender.take("join") != [], "a rejoin while welcomed: a join at once"
        agent.handle(Message("rejoin", 0, 1, {"epoch": 2}))
        assert sender.take("join") == [], "a rejoin while a join is out: none more than the backoff's"
        await until_true(lambda: "join" in sender.kinds(), "a join")  # the repeat, on the restarted schedule
    finally:
        agent.stopped.set()
        await asyncio.wait_for(running, 10)
