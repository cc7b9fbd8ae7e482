"""The test kit (minicluster/testing/) and the broker<->worker seam (worker/rank0.py), without sockets."""
from __future__ import annotations

import os

import pytest

from broker.job import Event, State, TransitionError
from minicluster.model.jobspec import InvalidJobspec
from minicluster.proto.envelope import Message
from minicluster.testing import FakeClock, RecordingSender, flushed, job, jobspec, resources, temp_journal
from worker import rank0
from worker.agent import PEER_KINDS, WORKER_KINDS


def test_fake_clock_moves_only_forward_and_only_when_told() -> None:
    clock = FakeClock(50.0)
    assert clock() == clock.now() == 50.0
    assert clock.advance(2.5) == 52.5 == clock()
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)
    assert clock() == 52.5


def test_recording_sender_keeps_what_the_wire_carries() -> None:
    sender = RecordingSender(rank=3)
    sender.send("done", 0, {"results": [(1, 0, 2)], "blob": b"\x00\xff", 7: "int keys survive"})
    sender.send("heartbeat", 0, {})
    assert sender.kinds() == ["done", "heartbeat"]
    done = sender.only("done")
    assert done == Message("done", 3, 0, {"results": [[1, 0, 2]], "blob": b"\x00\xff", 7: "int keys survive"})
    assert sender.take() == [Message("heartbeat", 3, 0, {})] and sender.sent == []
    with pytest.raises(AssertionError, match="expected one 'run'"):
        sender.only("run")


def test_recording_sender_refuses_what_the_codec_cannot_carry() -> None:
    sender = RecordingSender()
    with pytest.raises(TypeError):
        sender.send("run", 1, {"ranks": {1, 2}})  # a set has no msgpack form
    assert sender.sent == []


def test_builders_go_through_the_real_parsers() -> None:
    spec = jobspec(["sleep", "1"], ntasks=4, name="four")
    assert tuple(spec.argv) == ("sleep", "1") and spec.ntasks == 4 and spec.name == "four"
    with pytest.raises(InvalidJobspec, match="unknown jobspec field"):
        jobspec(no_such_field=1)
    record = job(7, ntasks=2)
    assert record.id == 7 and record.state is State.NEW and record.ntasks == 2
    assert (record.uid, record.gid) == (os.getuid(), os.getgid())
    record.apply(Event("submit"))
    assert record.state is State.DEPEND
    with pytest.raises(TransitionError):
        record.apply(Event("alloc"))
    with pytest.raises(TypeError):
        job(1, spec, ntasks=2)
    node = resources("cores=3,memory=2048", "rack=r1")
    assert node.to_wire()["sockets"] == [[0, [0, 1, 2]]] and node.to_wire()["properties"] == {"rack": "r1"}


async def test_temp_journal_is_the_real_durable_journal(tmp_path) -> None:
    async with temp_journal(tmp_path / "state") as journal:
        journal.append([("INSERT INTO drains (rank, reason) VALUES (?, ?)", (3, "disk"))])
        await flushed(journal)
        assert journal.query("SELECT rank, reason FROM drains") == [(3, "disk")]
    async with temp_journal(tmp_path / "state") as journal:
        assert journal.query("SELECT rank, reason FROM drains") == [(3, "disk")], "it outlives its process"


@pytest.mark.parametrize("kind", sorted(WORKER_KINDS))
def test_rank0_gives_its_agent_the_worker_kinds_rank0_sends_itself(kind: str) -> None:
    assert rank0.for_agent(Message(kind, 0, 0, {}))
    assert rank0.for_agent(Message(kind, 5, 0, {})) is (kind in PEER_KINDS)


@pytest.mark.parametrize("kind", ["join", "heartbeat", "done", "out", "pmi-put", "no-such-kind"])
def test_rank0_keeps_the_brokers_kinds_for_the_broker(kind: str) -> None:
    assert kind not in WORKER_KINDS
    assert not rank0.for_agent(Message(kind, 0, 0, {})) and not rank0.for_agent(Message(kind, 4, 0, {}))
