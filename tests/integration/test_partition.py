"""A cut link (issue 10): rank 2 runs in its own network namespace behind a veth pair, over CURVE TCP. Cutting
the link makes it `lost` and ends its job as `node-lost`; restoring it brings the same process back, which
rejoins, has the lost job's task killed, and runs new work; behind the cut, it runs on the dispatch window it was
sent, whose results count when it is back. Needs root and iproute2; everything it creates carries this run's id
and is removed at the end."""
from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.host import with_cmdline
from tests.integration.conftest import job, output_of, until, wait_for
from tests.integration.test_window import appending, each_once, lines, progressed

pytestmark = pytest.mark.needs("ip", root=True)  # iproute2: network namespaces, veth pairs


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Link:
    netns: str
    host_side: str
    subnet: ipaddress.IPv4Network

    def address(self, rank: int) -> str:
        """Rank r listens on .1r: one rank inside the namespace, the others on the host side."""
        return str(self.subnet.network_address + 10 + rank)

    def endpoint(self) -> str:
        """The config `endpoint` that puts every rank at its address."""
        return f"tcp://{self.subnet.network_address.exploded.rsplit('.', 1)[0]}.1{{rank}}:{{port}}"

    def cut(self) -> None:
        ip("link", "set", self.host_side, "down")

    def restore(self) -> None:
        ip("link", "set", self.host_side, "up")


@contextlib.contextmanager
def veth_link(inside: int, size: int) -> Iterator[Link]:
    """A namespace for rank `inside`, joined to the host by a veth pair; ranks 0..size-1 but it on the host side."""
    run = f"{os.getpid() % 10000}{random.randrange(100)}"
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True, timeout=10).stdout
    subnet = next(net for net in (ipaddress.ip_network(f"10.{random.randrange(64, 128)}.{random.randrange(256)}.0/24")
                                  for _ in range(20)) if str(net) not in routes)
    made = Link(f"mcpart{run}", f"mcph{run}", subnet)
    inside_side = f"mcpn{run}"
    try:
        ip("netns", "add", made.netns)
        ip("link", "add", made.host_side, "type", "veth", "peer", "name", inside_side)
        ip("link", "set", inside_side, "netns", made.netns)
        for rank in range(size):
            if rank != inside:
                ip("addr", "add", f"{made.address(rank)}/24", "dev", made.host_side)
        ip("link", "set", made.host_side, "up")
        ip("-n", made.netns, "addr", "add", f"{made.address(inside)}/24", "dev", inside_side)
        ip("-n", made.netns, "link", "set", inside_side, "up")
        ip("-n", made.netns, "link", "set", "lo", "up")
        yield made
    finally:
        subprocess.run(["ip", "link", "del", made.host_side], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", made.netns], capture_output=True, timeout=10)


@pytest.fixture
def link() -> Iterator[Link]:
    with veth_link(inside=2, size=3) as made:
        yield made


def test_a_cut_link_loses_the_rank_and_a_restored_one_brings_it_back(tmp_path: Path, link: Link) -> None:
    cluster = LocalCluster(tmp_path, size=3, fanout=2, transport="tcp", endpoint=link.endpoint(),
                           resources="cores=1",
                           lost_after=2.0)
    assert cluster.config.endpoint_of(2).startswith(f"tcp://{link.address(2)}:")
    try:
        cluster.start_rank(0)
        cluster.start_rank(1)
        worker = cluster.start_rank(2, env={"MC_PROPERTIES": "outside"},
                                    wrapper=("ip", "netns", "exec", link.netns))
        cluster.wait_up()
        with cluster.client() as c:
            victim = c.submit(job(["sh", "-c", "echo $$; exec sleep 120"], requires=["outside"]))
            pid = _first_line(c, victim)
            assert _alive(pid)

            link.cut()
            result = wait_for(c, victim, timeout=30)
            assert result["exception"] == "node-lost" and result["status"] == 137
            assert cluster.rank_states() == {0: "up", 1: "up", 2: "lost"}
            assert worker.poll() is None, "the worker itself lives on behind the cut"
            assert wait_for(c, c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none")))["status"] == 0

            link.restore()
            cluster.wait_states({2: "up"}, timeout=30)
            # The task of the job rank 0 ended is not adopted: the rejoining worker is told to kill it.
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(pid)
            back = c.submit(job(["true"], requires=["outside"]))
            assert wait_for(c, back, timeout=30)["status"] == 0 and c.job(back)["ranks"] == "2"
    finally:
        cluster.stop()


def _first_line(client: Client, job_id: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = output_of(client, job_id).get(0, b"")
        if b"\n" in out:
            return int(out.split(b"\n", 1)[0])
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} printed no line in {timeout}s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.long
def test_a_worker_cut_off_runs_its_window_on_and_its_results_are_the_ones_recorded(
        tmp_path: Path, link: Link) -> None:
    """Only rank 2 may run the array. Behind the cut it works through the chain it was sent ahead, while rank 0,
    which lost it, queues that chain again. When the link is back its join brings the results: they come first,
    so they count, the array ends, and the copies still queued are dropped, never run (protocol.md §2.10). Rank
    0 used to start such a copy after the array had ended and crash its scheduling pass."""
    cluster = LocalCluster(tmp_path / "mc", size=3, fanout=2, transport="tcp", endpoint=link.endpoint(),
                           resources="cores=1", lost_after=2.0, dispatch_window=8, dispatch_window_seconds=3600.0)
    record = tmp_path / "ran"
    try:
        cluster.start_rank(0)
        cluster.start_rank(1)
        cluster.start_rank(2, env={"MC_PROPERTIES": "outside"}, wrapper=("ip", "netns", "exec", link.netns))
        cluster.wait_up()
        with cluster.client() as c:
            array = c.submit(job(appending(record, 0.4), array="0-10", requires=["outside"]))
            progressed(c, array, 2)  # results say how long an element takes: the rest goes ahead behind the third
            # Kept: a margin for that `ahead` to leave rank 0. What a worker holds ahead shows nowhere a test can
            # read; the chain running on behind the cut (below) is what proves it arrived.
            time.sleep(0.1)
            link.cut()
            deadline = time.monotonic() + 30
            cluster.wait_states({2: "lost"}, timeout=30)
            while len(lines(record)) < 11:  # the whole chain runs on behind the cut
                assert time.monotonic() < deadline, lines(record)
                time.sleep(0.05)
            until(lambda: not with_cmdline(str(record)), "the last element ends")
            link.restore()
            result = wait_for(c, array, timeout=60)
            rows = each_once(c, array, 11)
            cluster.wait_states({2: "up"}, timeout=30)
            # A copy queued again would be ahead of this job in the queue, for the one core that can run either
            # (or would crash the scheduling pass): this job's end is the witness that none started.
            assert wait_for(c, c.submit(job(["true"], requires=["outside"])), timeout=30)["status"] == 0
            assert len(lines(record)) == 11, "no copy ran"
            assert c.resources()[2]["cores_free"] == 1, "no core stays held"
    finally:
        cluster.stop()
    lost = [row[1] for row in rows if row[6] == "node-lost"]
    assert len(lost) == 1 and all(row[3] == 0 for row in rows if row[1] not in lost), rows
    assert result["status"] == 137
    ran = Counter(index for index, _, _ in lines(record))
    assert sorted(ran) == list(range(11)) and set(ran.values()) == {1}, "each element ran once: no copy ran"
