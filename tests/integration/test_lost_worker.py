"""A lost worker (issue 24 items 4 and 5): kill -9 of a worker ends its tasks, and what escaped them, within
seconds; an index queued again never runs beside an earlier run of itself; a cancel leaves nothing; a job that
only a down rank could hold says so; and under `mc start` the rank comes back, as its pod would.

Every process is found by scanning /proc (its environment names the instance, the job and the index), not by
pgrep, so an orphan under any parent is seen."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for
from tests.integration.test_containment import alive

# An array element that counts the live processes of earlier runs of its own index (its twins) and records its
# index, rank, pid and that count; it forks a child that leaves its session (an escapee), prints, and sleeps.
ELEMENT = textwrap.dedent("""
    import os, sys, time
    me, env = os.getpid(), os.environ
    marks = {f"MC_URI={env['MC_URI']}".encode(), f"MC_JOB_ID={env['MC_JOB_ID']}".encode(),
             f"MC_TASK_INDEX={env['MC_TASK_INDEX']}".encode()}
    twins = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    twins += marks <= set(f.read().split(b"\\0"))
            except OSError:
                pass
    if os.fork() == 0:
        os.setsid()
        time.sleep(300)
        os._exit(0)
    with open(sys.argv[1], "a") as f:
        f.write(f"{env['MC_TASK_INDEX']} {env['MC_NODE_RANK']} {me} {twins}\\n")
    print("running", flush=True)
    time.sleep(300)
""")


def element(record: Path) -> list[str]:
    return [sys.executable, "-c", ELEMENT, str(record)]


def runs(record: Path) -> list[tuple[int, int, int, int]]:
    """(index, rank, pid, twins) of every run so far."""
    if not record.exists():
        return []
    return [tuple(int(x) for x in line.split()) for line in record.read_text().splitlines()]  # type: ignore[misc]


def processes(uri: str, **marks: str) -> set[int]:
    """The live processes whose environment holds MC_URI=uri and each MC_<KEY>=value of `marks`."""
    wanted = {f"MC_URI={uri}".encode(), *(f"MC_{k.upper()}={v}".encode() for k, v in marks.items())}
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if wanted <= set(f.read().split(b"\0")):
                        found.add(int(name))
            except OSError:
                pass
    return found


def until(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def gone_within(pids: set[int], seconds: float) -> set[int]:
    """Those of `pids` still alive (not zombies) after `seconds` at most."""
    deadline = time.monotonic() + seconds
    while True:
        living = {pid for pid in pids if alive(pid)}
        if not living or time.monotonic() > deadline:
            return living
        time.sleep(0.05)


@pytest.mark.slow
def test_kill9_of_a_worker_ends_its_tasks_they_never_run_twice_and_a_cancel_leaves_nothing(tmp_path: Path) -> None:
    """Ranks 1-3 of one core each; index 0 runs on rank 1, index 1 on rank 2, rank 3 is free. kill -9 of rank 2:
    its task and the task's escapee end within seconds; once rank 2 is lost, index 1 runs again on rank 3 and
    finds no earlier run of itself alive; a cancel then leaves no process of the job."""
    record = tmp_path / "runs"
    with LocalCluster(tmp_path / "mc", size=4, fanout=4, resources="cores=1", broker_runs_tasks=False) as cluster, \
            cluster.client() as c:
        array = c.submit(job(element(record), array="0-1", max_retries_per_index=1))
        until("both elements run", lambda: len(runs(record)) == 2)
        assert {(index, rank) for index, rank, _, _ in runs(record)} == {(0, 1), (1, 2)}
        until("the escapee started", lambda: len(processes(cluster.uri, node_rank="2")) >= 2)
        on_rank_2 = processes(cluster.uri, node_rank="2")
        cluster.kill(2)
        assert gone_within(on_rank_2, 5.0) == set(), "a task of the killed worker, or its escapee, outlived it"
        until("index 1 runs again on rank 3", lambda: len(runs(record)) == 3, timeout=60)
        index, rank, _, twins = runs(record)[2]
        assert (index, rank) == (1, 3)
        assert twins == 0, "index 1 started again beside an earlier run of itself"
        c.cancel([array])
        assert wait_for(c, array)["exception"] == "cancel"
        until("no process of the array is left", lambda: not processes(cluster.uri, job_id=str(array)), timeout=10)


@pytest.mark.slow
def test_a_job_that_only_a_down_rank_could_hold_says_so_and_runs_once_it_is_back(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "mc", size=3, resources="cores=1") as cluster, cluster.client() as c:
        cluster.kill(2)
        cluster.wait_states({2: "lost"})
        needs_3 = c.submit(job(["true"], nnodes=3, ntasks=3))
        waits = c.submit(job(["true"], ntasks=1, nnodes=1, cores_per_task=1))
        until("the three-node job is judged", lambda: c.job(needs_3).get("pending_reason") is not None)
        assert c.job(needs_3)["pending_reason"] == "NodesDown: 2"
        assert wait_for(c, waits)["status"] == 0, "a job the ranks that are up can hold runs"
        shown = subprocess.run(["mc", "jobs"], capture_output=True, text=True, timeout=30,
                               env={**os.environ, "MC_URI": cluster.uri}).stdout
        assert "(NodesDown: 2)" in shown, shown
        cluster.restart(2)
        assert wait_for(c, needs_3)["status"] == 0


def ranks(client: Client) -> dict[int, dict[str, object]]:
    return {row["rank"]: row for row in client.status()["ranks"]}


@pytest.mark.slow
@pytest.mark.long
def test_mc_start_restarts_a_killed_worker_and_its_job_finishes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(["mc", "start", "--size", "3", "--state-dir", str(state), "--resources", "cores=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    uri = f"unix://{state}/run/broker.sock"
    try:
        def up() -> bool:
            try:
                with Client(uri) as c:
                    return all(row["state"] == "up" for row in ranks(c).values()) and len(ranks(c)) == 3
            except (OSError, ClientError):
                return False

        until("the instance is up", up)
        with Client(uri) as c:
            # A failure policy (retries): the attempt the lost rank took down is queued again, whatever the budget.
            running = c.submit(job(["sh", "-c", "echo $MC_NODE_RANK; sleep 8"], nnodes=3, ntasks=3, retries=1))
            until("its task runs on rank 2", lambda: processes(uri, job_id=str(running), node_rank="2"))
            killed = ranks(c)[2]["pid"]
            tasks = processes(uri, node_rank="2")
            os.kill(int(killed), signal.SIGKILL)  # type: ignore[arg-type]
            assert gone_within(tasks, 5.0) == set(), "the killed worker's task outlived it"
            until("rank 2 is back", lambda: ranks(c)[2]["pid"] != killed and ranks(c)[2]["state"] == "up",
                  timeout=60)
            until("the job finishes", lambda: c.job(running)["state"] == "INACTIVE", timeout=90)
            assert c.job(running)["status"] == 0
            c.shutdown()
        _, err = proc.communicate(timeout=30)
        assert "rank 2 was killed by SIGKILL; restarting it in 1 s" in err, err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
