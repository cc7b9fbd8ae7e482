"""A tree that heals (issue 29 item 3, protocol.md §2.4.1): when interior rank 1 dies, stops or is cut off, its
children 3 and 4 link to rank 0 around it; their tasks run on, are reported once, and are neither taken back nor
run twice; when rank 1 is back, rank 0 sends them home and they link to it again.

Seven ranks, fanout 2: 0 → {1, 2}, 1 → {3, 4}, 2 → {5, 6}. The tasks under test run on ranks 3 and 4 (property
`below1`) and wait for a file the test writes only after rank 1 has been declared lost, so on a tree that does not
heal their ranks would be lost with it."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import event_names, job, until, wait_for
from tests.integration.test_partition import veth_link

pytestmark = [pytest.mark.slow, pytest.mark.long]

# One task: records where it runs and which attempt it is, then waits (bounded) for the test's go-ahead.
TASK = textwrap.dedent("""
    import os, sys, time
    env = os.environ
    with open(sys.argv[1], "a") as f:
        f.write(f"{env['MC_JOB_ID']} {env['MC_TASK_RANK']} {env['MC_NODE_RANK']} {env['MC_TASK_ATTEMPT']}\\n")
    print("started", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(0 if os.path.exists(sys.argv[2]) else 3)
""")
# Heal bound here (protocol.md §2.4.1): the link's 3 s heartbeat timeout + a patience of 2 × 0.2 s for a stopped or
# cut-off parent; lost_after leaves room for a loaded machine.
LOST_AFTER = 7.0


class Tree:
    """The seven-rank cluster, the files its tasks use, and each rank's log."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.dir = tmp_path
        self.record, self.go = tmp_path / "runs", tmp_path / "go"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.status_port = s.getsockname()[1]
        self.cluster = LocalCluster(tmp_path / "mc", size=7, fanout=2, resources="cores=1", lost_after=LOST_AFTER,
                                    status_port=self.status_port, **settings)
        self.logs: dict[int, IO[bytes]] = {}

    def start_rank(self, rank: int, **kwargs: object) -> subprocess.Popen[bytes]:
        log = self.logs.get(rank) or open(self.dir / f"rank{rank}.log", "ab")  # noqa: SIM115 (closed in stop)
        self.logs[rank] = log
        env = {"MC_PROPERTIES": "below1"} if rank in (3, 4) else {}
        return self.cluster.start_rank(rank, env=env, stderr=log, **kwargs)  # type: ignore[arg-type]

    def log(self, rank: int) -> str:
        return (self.dir / f"rank{rank}.log").read_text(errors="replace")

    def submit_below(self, c: Client) -> int:
        """Two tasks on ranks 3 and 4, started when this returns."""
        job_id = c.submit(job([sys.executable, "-c", TASK, str(self.record), str(self.go)], ntasks=2, nnodes=2,
                              requires=["below1"], mpi="none"))
        until(lambda: len(self.runs(job_id)) == 2, "both tasks started")
        return job_id

    def runs(self, job_id: int) -> list[tuple[int, int, int]]:
        """(task, rank, attempt) of every run of the job so far."""
        if not self.record.exists():
            return []
        rows = [tuple(int(x) for x in line.split()) for line in self.record.read_text().splitlines()]
        return sorted((task, rank, attempt) for job, task, rank, attempt in rows if job == job_id)

    def stop(self) -> None:
        self.cluster.stop()
        for log in self.logs.values():
            log.close()


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Tree]:
    made = Tree(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def start(tree: Tree, wrapper_of: dict[int, tuple[str, ...]] | None = None) -> None:
    for rank in range(7):
        tree.start_rank(rank, wrapper=(wrapper_of or {}).get(rank, ()))
    tree.cluster.wait_up()


def check_healed_and_finish(tree: Tree, c: Client, job_id: int) -> None:
    """Rank 1 is lost; its children are not, and their tasks end once, as started."""
    tree.cluster.wait_states({1: "lost"}, timeout=30)
    # Up, or up again after a moment's silence on a loaded machine (unresponsive_after is 0.8 s here); a rank cut
    # off with rank 1 would be lost by now and stay so. Had either been lost, its task would have ended node-lost.
    tree.cluster.wait_states({3: "up", 4: "up"}, timeout=10)
    for rank in (3, 4):
        assert "no link to rank 1" in tree.log(rank) and "linking to rank 0" in tree.log(rank)
    tree.go.touch()
    result = wait_for(c, job_id, timeout=60)
    assert result["status"] == 0 and result["exception"] is None, result
    assert tree.runs(job_id) == [(0, 3, 0), (1, 4, 0)], "each task ran once, where it started"
    assert "requeue" not in event_names(c, job_id)


def check_home_again(tree: Tree, c: Client) -> None:
    """Rank 1 is back: its children link to it again, and work reaches them through it."""
    tree.cluster.wait_states({1: "up", 3: "up", 4: "up"}, timeout=30)
    until(lambda: all("rank 1 is back; linking to it again" in tree.log(r) for r in (3, 4)), "3 and 4 went home")
    counters = tree.cluster.http_status()["counters"]
    assert counters["overlay_adoptions"] >= 2 and counters["overlay_homes_sent"] >= 2, counters
    tree.go.unlink()
    again = tree.submit_below(c)
    tree.go.touch()
    assert wait_for(c, again, timeout=60)["status"] == 0


def test_children_of_a_killed_interior_rank_link_around_it_and_go_home_when_it_returns(tree: Tree) -> None:
    start(tree)
    with tree.cluster.client() as c:
        job_id = tree.submit_below(c)
        tree.cluster.kill(1)
        check_healed_and_finish(tree, c, job_id)
        tree.start_rank(1)
        check_home_again(tree, c)


@pytest.mark.needs("ip", root=True)
def test_children_of_a_cut_off_interior_rank_link_around_it_and_go_home_when_the_link_is_back(tmp_path: Path) -> None:
    """Rank 1 alone in a network namespace, every link over CURVE TCP; the cut gives no RST, only silence."""
    with veth_link(inside=1, size=7) as link:
        tree = Tree(tmp_path, transport="tcp", endpoint=link.endpoint())
        try:
            start(tree, wrapper_of={1: ("ip", "netns", "exec", link.netns)})
            with tree.cluster.client() as c:
                job_id = tree.submit_below(c)
                link.cut()
                try:
                    check_healed_and_finish(tree, c, job_id)
                finally:
                    link.restore()
                check_home_again(tree, c)
        finally:
            tree.stop()


def test_children_of_a_stopped_interior_rank_link_around_it_and_go_home_when_it_resumes(tree: Tree) -> None:
    start(tree)
    with tree.cluster.client() as c:
        job_id = tree.submit_below(c)
        stopped = tree.cluster.procs[1]
        stopped.send_signal(signal.SIGSTOP)
        try:
            check_healed_and_finish(tree, c, job_id)
        finally:
            stopped.send_signal(signal.SIGCONT)
        check_home_again(tree, c)
