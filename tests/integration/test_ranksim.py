"""The rank simulator (minicluster/testing/ranksim.py) against a real rank 0: every simulated rank joins, and an
array runs on all of them, each task done exactly once. benchmarks/ranksim.py measures with it at scale."""
from __future__ import annotations

import asyncio
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from minicluster.overlay import curve
from minicluster.overlay.uplink import Uplink
from minicluster.proto import envelope, messages
from minicluster.proto.envelope import Message
from minicluster.testing import LocalCluster
from minicluster.testing.builders import resources
from minicluster.testing.ranksim import SimulatedCluster
from tests.integration.conftest import job, until, wait_for

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


@pytest.mark.long
def test_simulated_children_of_a_killed_interior_rank_link_around_it_and_go_home(tmp_path: Path) -> None:
    """The simulator's leaves heal as real ranks do (protocol.md §2.4.1): fanout 8, real interior ranks 1-7; when
    rank 1 is killed its 8 simulated children link to rank 0, are not lost, and go home once it is back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with SimulatedCluster(tmp_path, size=SIZE, processes=2, fanout=8, status_port=port, resources="cores=4",
                          heartbeat_interval=0.2, unresponsive_after=0.8, lost_after=4.0) as sim:
        sim.wait_joined(timeout=60)
        children = list(range(9, 17))
        before = sim.local.http_status()["counters"]
        sim.local.kill(1)
        until(lambda: sim.local.http_status()["counters"]["overlay_adoptions"] - before["overlay_adoptions"]
              >= len(children), "rank 0 took in rank 1's children")
        sim.local.wait_states({1: "lost"}, timeout=30)
        sim.local.wait_states(dict.fromkeys(children, "up"), timeout=10)
        sim.local.start_rank(1)
        sim.local.wait_states({1: "up"}, timeout=30)
        until(lambda: sim.local.http_status()["counters"]["overlay_homes_sent"] - before["overlay_homes_sent"]
              >= len(children), "rank 0 sent them home")
        with sim.local.client() as client:  # work reaches every rank, rank 1's children through rank 1 again
            array = client.submit(job(["true"], array=f"1-{TASKS}"))
            assert wait_for(client, array, timeout=120)["status"] == 0
            assert {row[2] for row in client.task_results(array)} >= set(children)


def test_a_repeated_join_is_welcomed_again_and_redoes_nothing(tmp_path: Path) -> None:
    """A `join` repeated before the worker read its `welcome` (same pid, an epoch not the broker's: protocol.md
    §2.6) is answered with the `welcome` again, and rank 0 does not redo the rank's membership: the rank keeps the
    `since` of its first join. The rank is a worker's uplink (CURVE, rank 1's routing id) driven by hand."""
    local = LocalCluster(tmp_path, size=2, test_exec=True, unresponsive_after=60.0, lost_after=120.0)
    try:
        local.start_rank(0)
        local.wait_socket()
        welcomes, since = asyncio.run(join_twice(local))
    finally:
        local.stop()
    assert len(welcomes) == 2 and welcomes[0] == welcomes[1] and welcomes[0]["epoch"] != 0
    assert since[0] == since[1], "the repeat was taken for a new join"


async def join_twice(local: LocalCluster) -> tuple[list[dict[str, Any]], list[float]]:
    ctx = zmq.asyncio.Context()
    node = resources("cores=2")
    got: asyncio.Queue[Message] = asyncio.Queue()

    async def receive(sock: zmq.asyncio.Socket) -> None:
        while True:
            got.put_nowait(envelope.decode((await sock.recv_multipart())[-1]))

    uplink = Uplink(ctx, local.config, 1, curve.load(local.config.curve_cert), receive)
    uplink.start()
    join = messages.Join(4242, "sim-1", node.to_wire(), [], [], 0)
    welcomes, since = [], []
    try:
        for _ in range(2):
            messages.send(lambda kind, dst, body: uplink.send([envelope.encode(Message(kind, 1, dst, body))]), 0,
                          join)
            welcomes.append(await welcome(got))
            with local.client() as client:
                since.append(next(row["since"] for row in client.status()["ranks"] if row["rank"] == 1))
    finally:
        await uplink.close()
        ctx.destroy(linger=0)
    return welcomes, since


async def welcome(got: asyncio.Queue[Message]) -> dict[str, Any]:
    while True:
        msg = await asyncio.wait_for(got.get(), 30)
        if msg.kind == "welcome":
            return msg.body
