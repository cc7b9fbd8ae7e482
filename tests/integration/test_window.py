"""The dispatch window through real processes (protocol.md §2.10): the worker agent's chains, and a MiniCluster
whose broker or worker is killed with SIGKILL, whose array is cancelled or whose rank is drained with elements
sent ahead; and the same for small single jobs sent ahead. Every element and job runs once: each task appends its
index (or its job id) to a file, read at the end."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from minicluster.client import Client
from minicluster.config import from_mapping
from minicluster.proto.envelope import Message
from minicluster.testing import LocalCluster, RecordingSender
from minicluster.testing.builders import resources
from tests.integration.conftest import job, wait_all, wait_for
from worker.agent import WorkerAgent

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def info(argv: list[str]) -> dict[str, Any]:
    return {"argv": argv, "env": ENV, "cwd": "/tmp", "ntasks": 3, "output": None, "mpi": None,
            "layout": [[1, 1]], "uid": os.getuid(), "gid": os.getgid(), "array": True}


def agent_on(tmp_path: Path, cores: int, welcomed: bool = True) -> tuple[WorkerAgent, RecordingSender]:
    """A worker agent of rank 1 (real executor) whose messages to rank 0 are recorded."""
    config = from_mapping({"state_dir": str(tmp_path), "resources": f"cores={cores}"})
    sender = RecordingSender(rank=1)
    agent = WorkerAgent(config, 1, sender.send, resources(f"cores={cores}"), "unix:///nonexistent")
    if welcomed:
        agent.handle(Message("welcome", 0, 1, {"epoch": 1, "size": 2}))
    return agent, sender


async def results(sender: RecordingSender, count: int, timeout: float = 20.0) -> dict[int, list[Any]]:
    seen: dict[int, list[Any]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(seen) < count:
        assert loop.time() < deadline, f"results of tasks {sorted(seen)} only"
        for msg in sender.take("done"):
            seen.update((row[1], row) for row in msg.body["results"])
        await asyncio.sleep(0.02)
    return seen


async def test_the_agent_starts_each_entry_when_the_one_before_ends_and_returns_recalled_ones(
        tmp_path: Path) -> None:
    agent, sender = agent_on(tmp_path, 1)
    jobs = {7: info(["sleep", "0.3"])}
    agent.handle(Message("run", 0, 1, {"jobs": jobs, "tasks": [[7, 0, 0, [0], []]]}))
    chain = [[7, 1, 1, [0], [], 0, 0], [7, 2, 2, [0], [], 0, 1], [7, 3, 3, [0], [], 0, 2]]
    agent.handle(Message("ahead", 0, 1, {"jobs": jobs, "tasks": chain}))
    try:
        assert sorted(agent.running) == [(7, 0)], "one task per core: the rest wait"
        agent.handle(Message("recall", 0, 1, {"keys": [[7, 2], [7, 0]]}))
        (returned,) = sender.take("returned")
        assert returned.body["keys"] == [[7, 2]], "a running task is not returned"
        ended = await results(sender, 3)
    finally:
        await agent.shutdown()
    assert sorted(ended) == [0, 1, 3] and all(row[2] == 0 for row in ended.values())
    assert ended[0][7] <= ended[1][6] and ended[1][7] <= ended[3][6], "3 followed 1 after 2 was dropped"


async def test_an_entry_sent_again_waits_where_it_was_sent_last_and_runs_once(tmp_path: Path) -> None:
    """Found by the chaos test: an entry sent again behind another task was linked twice, ran when the first of the
    two ended, and the second's end raised KeyError in the agent."""
    agent, sender = agent_on(tmp_path, 2)
    jobs = {7: info(["sleep", "0.2"])}
    agent.handle(Message("run", 0, 1, {"jobs": jobs, "tasks": [[7, 0, 0, [0], []], [7, 1, 1, [1], []]]}))
    agent.handle(Message("ahead", 0, 1, {"jobs": jobs, "tasks": [[7, 2, 2, [0], [], 0, 0]]}))
    agent.handle(Message("ahead", 0, 1, {"jobs": jobs, "tasks": [[7, 2, 2, [1], [], 0, 1]]}))
    try:
        ended = await results(sender, 3)
        # Nothing runs and nothing waits to start: no second run of 2 can come (a sleep could only hope so).
        assert not agent.running and not agent._next, (agent.running, agent._next)
    finally:
        await agent.shutdown()
    assert sorted(ended) == [0, 1, 2] and all(row[2] == 0 for row in ended.values())
    assert ended[1][7] <= ended[2][6], "2 followed 1, where it was sent last"
    assert sender.take("done") == [], "2 ran once"


async def test_a_join_drops_what_waits_and_nothing_is_taken_before_the_welcome(tmp_path: Path) -> None:
    agent, sender = agent_on(tmp_path, 1, welcomed=False)
    jobs = {7: info(["sleep", "0.2"])}
    agent.handle(Message("ahead", 0, 1, {"jobs": jobs, "tasks": [[7, 5, 5, [0], [], 0, 4]]}))
    assert not agent.running, "an `ahead` before the welcome is from a broker that does not know us"
    agent.handle(Message("welcome", 0, 1, {"epoch": 1, "size": 2}))
    agent.handle(Message("run", 0, 1, {"jobs": jobs, "tasks": [[7, 0, 0, [0], []]]}))
    agent.handle(Message("ahead", 0, 1, {"jobs": jobs, "tasks": [[7, 1, 1, [0], [], 0, 0]]}))
    agent.join()
    try:
        ended = await results(sender, 1)
        # Nothing runs and nothing waits to start: task 1 cannot start without another message.
        assert not agent.running and not agent._next and sender.take("returned") == []
    finally:
        await agent.shutdown()
    assert list(ended) == [0] and sender.take("done") == [], "task 1 never started"


async def test_the_agent_starts_a_whole_job_when_another_jobs_task_ends_and_returns_it_when_recalled(
        tmp_path: Path) -> None:
    agent, sender = agent_on(tmp_path, 1)
    single = {**info(["sleep", "0.2"]), "ntasks": 1, "array": False}
    agent.handle(Message("run", 0, 1, {"jobs": {7: single}, "tasks": [[7, 0, 0, [0], []]]}))
    chain = [[8, 0, 0, [0], [], 0, 0, 7], [9, 0, 0, [0], [], 0, 0, 8], [10, 0, 0, [0], [], 0, 0, 9]]
    agent.handle(Message("ahead", 0, 1, {"jobs": {8: single, 9: single, 10: single}, "tasks": chain}))
    try:
        assert sorted(agent.running) == [(7, 0)], "the jobs sent ahead wait for the core"
        agent.handle(Message("recall", 0, 1, {"keys": [[9, 0]]}))
        (returned,) = sender.take("returned")
        assert returned.body["keys"] == [[9, 0]]
        ended: dict[int, list[Any]] = {}
        deadline = time.time() + 20
        while len(ended) < 3:
            assert time.time() < deadline, f"results of jobs {sorted(ended)} only"
            for msg in sender.take("done"):
                ended.update((row[0], row) for row in msg.body["results"])
            await asyncio.sleep(0.02)
    finally:
        await agent.shutdown()
    assert sorted(ended) == [7, 8, 10] and all(row[2] == 0 for row in ended.values())
    assert ended[7][7] <= ended[8][6] and ended[8][7] <= ended[10][6], "10 followed 8 after 9 was returned"


# --- a MiniCluster ---------------------------------------------------------------------------------------------

def appending(record: Path, seconds: float) -> list[str]:
    """A task that appends its index and rank to `record` (one short write: whole lines), then sleeps."""
    return ["sh", "-c", f'echo "{{cc}} $MC_NODE_RANK $(date +%s.%N)" >> {record}; sleep {seconds}']


# Chains as long as `dispatch_window` however long the tasks run (by default they hold about 0.05 s of work).
LONG_CHAINS = {"dispatch_window_seconds": 3600.0}


def two_workers(tmp_path: Path, window: int = 4) -> LocalCluster:
    """Ranks 1 and 2 of 2 cores each run the tasks; rank 0, whose own tasks would die with a killed broker (and
    run again, which is not the window's doing), runs none."""
    return LocalCluster(tmp_path / "mc", size=3, resources="cores=2", broker_runs_tasks=False, dispatch_window=window,
                        **LONG_CHAINS)


def lines(record: Path) -> list[tuple[int, int, float]]:
    out = []
    for line in record.read_text().splitlines():
        index, rank, when = line.split()
        out.append((int(index), int(rank), float(when)))
    return out


def each_once(client: Client, array: int, count: int) -> list[list[Any]]:
    rows = client.task_results(array)
    assert sorted(row[1] for row in rows) == list(range(count)), "every index recorded exactly once"
    return rows


def progressed(client: Client, array: int, succeeded: int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while client.job(array)["counts"]["succeeded"] < succeeded:
        assert time.time() < deadline, "the array does not progress"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.long
def test_kill9_of_the_broker_with_full_windows_runs_every_element_once(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    # Chains of 8 elements of 0.4 s outlast the restart: the workers still hold entries when they join.
    with two_workers(tmp_path, window=8) as cluster:
        with cluster.client() as c:
            array = c.submit(job(appending(record, 0.4), array="0-79"))
            progressed(c, array, 4)
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            result = wait_for(c, array, timeout=120)
            assert result["status"] == 0 and c.job(array)["counts"]["succeeded"] == 80
            each_once(c, array, 80)
    ran = Counter(index for index, _, _ in lines(record))
    assert sorted(ran) == list(range(80)) and set(ran.values()) == {1}, "no element ran twice, none was lost"


@pytest.mark.slow
@pytest.mark.long
def test_kill9_of_a_worker_returns_its_window_and_each_element_is_recorded_once(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with two_workers(tmp_path) as cluster, cluster.client() as c:
        array = c.submit(job(appending(record, 0.05), array="0-199"))
        progressed(c, array, 30)
        cluster.kill(2)
        result = wait_for(c, array, timeout=120)
        rows = each_once(c, array, 200)
    lost = {row[1] for row in rows if row[6] == "node-lost"}
    assert result["status"] != 0 and 1 <= len(lost) <= 2, "what rank 2 ran when it died, nothing it held ahead"
    assert {row[1] for row in rows if row[3] != 0} == lost
    ran = Counter(index for index, _, _ in lines(record))
    assert set(range(200)) - lost <= set(ran) and set(ran.values()) == {1}, "no element ran twice"


@pytest.mark.slow
@pytest.mark.long
def test_a_worker_cut_off_with_a_full_window_comes_back_and_each_element_is_recorded_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 2's agent stops (SIGSTOP) past `lost_after` while its tasks run on: rank 0 ends them `node-lost` and
    queues its window again. Resumed, the agent starts the entries behind the tasks that ended meanwhile, and
    rejoins running them: they are adopted there, and recorded once (protocol.md §2.10)."""
    record = tmp_path / "ran"
    with two_workers(tmp_path) as cluster, cluster.client() as c:
        array = c.submit(job(appending(record, 0.3), array="0-59"))
        progressed(c, array, 8)
        cluster.procs[2].send_signal(signal.SIGSTOP)
        try:
            deadline = time.time() + 10
            while next(r for r in c.status()["ranks"] if r["rank"] == 2)["state"] != "lost":
                assert time.time() < deadline, "rank 2 is not lost"
                time.sleep(0.1)
        finally:
            cluster.procs[2].send_signal(signal.SIGCONT)
        result = wait_for(c, array, timeout=120)
        rows = each_once(c, array, 60)
        held = [r for r in c.resources() if r["state"] == "up" and r["cores_free"] != r["cores_total"]]
        assert held == [], "no core stays held"
    lost = {row[1] for row in rows if row[6] == "node-lost"}
    assert {row[1] for row in rows if row[3] != 0} == lost and len(lost) <= 2, "what ran on rank 2 as it was lost"
    assert (result["status"] != 0) == bool(lost)
    ran = Counter(index for index, _, _ in lines(record))
    # The entries rank 2 started once resumed went on there: killed and run again, they would show twice.
    assert set(ran) == set(range(60)) and set(ran.values()) == {1}, "every element ran, none twice"
    logged = capfd.readouterr().err
    for bad in ("Traceback", " ERROR"):
        assert bad not in logged, logged[logged.find(bad) - 300:][:3000]


def test_cancelling_an_array_with_full_windows_ends_every_element(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with (LocalCluster(tmp_path / "mc", size=2, resources="cores=2", dispatch_window=4, kill_grace=0.5,
                       **LONG_CHAINS) as cluster, cluster.client() as c):
        array = c.submit(job(appending(record, 0.5), array="0-99"))
        while c.job(array)["counts"]["running"] < 4:
            time.sleep(0.05)
        # Kept: a margin for the windows behind the 4 cores to leave rank 0; what a worker holds ahead shows
        # nowhere a client reads.
        time.sleep(0.1)
        c.cancel([array])
        result = wait_for(c, array, timeout=30)
        counts = c.job(array)["counts"]
        assert result["exception"] == "cancel" and counts["running"] == 0
        assert counts["succeeded"] + counts["failed"] + counts["cancelled"] == 100
        ended = {row[1] for row in c.task_results(array)}
        assert len(ended) <= 12, "only what ran when the cancel came (and the next of a chain that ended)"
        # Kept: a negative (a late start, seen as a record line) has no later event to wait for instead.
        time.sleep(1.0)
        assert c.job(array)["counts"]["running"] == 0
    started = [index for index, _, _ in lines(record)]
    assert set(started) <= ended and len(started) == len(set(started)), "nothing started after the job ended"


@pytest.mark.slow
@pytest.mark.long
def test_draining_a_rank_returns_its_window(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with two_workers(tmp_path) as cluster, cluster.client() as c:
        array = c.submit(job(appending(record, 0.4), array="0-59"))
        progressed(c, array, 4)
        drained_at = time.time()
        c.drain([2], "maintenance")
        result = wait_for(c, array, timeout=120)
        assert result["status"] == 0
        each_once(c, array, 60)
    late = [(index, when - drained_at) for index, rank, when in lines(record) if rank == 2 and when > drained_at + 0.3]
    assert late == [], "rank 2 started nothing after the drain but what its running tasks' ends had started"


# --- single jobs sent ahead --------------------------------------------------------------------------------------

def appending_job(record: Path, seconds: float) -> dict[str, Any]:
    """A single job that appends its id, rank and start time to `record`, then sleeps; small by its time limit
    (LONG_CHAINS: anything up to an hour is)."""
    argv = ["sh", "-c", f'echo "$MC_JOB_ID $MC_NODE_RANK $(date +%s.%N)" >> {record}; sleep {seconds}']
    return job(argv, time_limit=600.0)


def started_while_broker_stopped(cluster: LocalCluster, record: Path, seconds: float) -> int:
    """Stop rank 0 (SIGSTOP) for `seconds`, then let it go on: how many jobs began meanwhile (after a margin for a
    `run` already on its way). Without a window nothing can: every start needs a message from rank 0."""
    stopped = time.time()
    cluster.procs[0].send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        cluster.procs[0].send_signal(signal.SIGCONT)
    return sum(1 for _, _, when in lines(record) if stopped + 0.5 < when < stopped + seconds)


def each_job_once(client: Client, ids: list[int]) -> dict[int, list[list[Any]]]:
    rows = {job_id: client.task_results(job_id) for job_id in ids}
    assert all(len(r) <= 1 for r in rows.values()), "no job recorded twice"
    return rows


@pytest.mark.slow
@pytest.mark.long
def test_kill9_of_the_broker_with_full_windows_of_single_jobs_runs_and_records_each_once(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with two_workers(tmp_path, window=8) as cluster:
        with cluster.client() as c:
            ids = [i for i in c.submit_many([appending_job(record, 0.4)] * 60) if isinstance(i, int)]
            while record.exists() is False or len(lines(record)) < 8:
                time.sleep(0.05)
        assert started_while_broker_stopped(cluster, record, 2.0) > 0, "the workers went on with the window"
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            results = wait_all(c, ids)
            assert len(ids) == 60 and all(r["status"] == 0 for r in results)
            rows = each_job_once(c, ids)
            assert all(len(r) == 1 for r in rows.values())
    ran = Counter(job_id for job_id, _, _ in lines(record))
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}, "no job ran twice, none was lost"


@pytest.mark.slow
@pytest.mark.long
def test_kill9_of_a_worker_with_full_windows_of_single_jobs_runs_elsewhere_what_it_held(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with two_workers(tmp_path, window=8) as cluster, cluster.client() as c:
        ids = [i for i in c.submit_many([appending_job(record, 0.3)] * 80) if isinstance(i, int)]
        while not record.exists() or len(lines(record)) < 8:
            time.sleep(0.05)
        assert started_while_broker_stopped(cluster, record, 1.5) > 0, "the workers went on with the window"
        cluster.kill(2)
        results = {r["job"]: r for r in wait_all(c, ids)}
        rows = each_job_once(c, ids)
    lost = {job_id for job_id, r in results.items() if r["exception"] == "node-lost"}
    assert 1 <= len(lost) <= 2, "what rank 2 ran when it died, nothing it held ahead"
    assert all(len(rows[job_id]) == 1 and results[job_id]["status"] == 0 for job_id in set(ids) - lost)
    ranks: dict[int, list[int]] = {}
    for job_id, rank, _ in lines(record):
        ranks.setdefault(job_id, []).append(rank)
    assert set(ids) - lost <= set(ranks)
    # A job rank 2 started in the moment before it died, before the result of the one before it left, is run
    # again elsewhere, unrecorded there (protocol.md §2.10, node loss); nothing else runs twice.
    assert all(sorted(r) in ([1], [2], [1, 2]) for r in ranks.values()), "no job ran twice on one rank"


def test_cancelling_all_single_jobs_with_full_windows_ends_every_one(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    with (LocalCluster(tmp_path / "mc", size=2, resources="cores=2", dispatch_window=4, kill_grace=0.5,
                       **LONG_CHAINS) as cluster, cluster.client() as c):
        ids = [i for i in c.submit_many([appending_job(record, 0.4)] * 40) if isinstance(i, int)]
        while not record.exists() or len(lines(record)) < 4:
            time.sleep(0.05)
        assert started_while_broker_stopped(cluster, record, 1.2) > 0, "the workers went on with the window"
        cancelled, _ = c.cancel(ids)
        results = {r["job"]: r for r in wait_all(c, ids, timeout=30)}
        assert set(results) == set(ids) and set(cancelled) <= set(ids)
        rows = each_job_once(c, ids)
        assert all(c.job(job_id)["counts"]["running"] == 0 for job_id in ids)
        assert all(results[job_id]["exception"] == "cancel" for job_id in cancelled)
        # Kept: a negative (a late start, seen as a record line) has no later event to wait for instead.
        time.sleep(1.0)
        before = len(lines(record))
        time.sleep(0.5)
        assert len(lines(record)) == before, "nothing starts after every job ended"
    ran = Counter(job_id for job_id, _, _ in lines(record))
    assert set(ran.values()) == {1} and set(ran) <= {job_id for job_id, r in rows.items() if r}, \
        "each job that began was recorded, none began twice"


def test_mc_jobs_shows_a_job_sent_ahead_as_dispatched_to_its_rank(tmp_path: Path) -> None:
    with (LocalCluster(tmp_path / "mc", size=2, resources="cores=1", dispatch_window=4, kill_grace=0.5,
                       **LONG_CHAINS) as cluster, cluster.client() as c):
        ids = [i for i in c.submit_many([job(["sleep", "60"], time_limit=600.0)] * 4) if isinstance(i, int)]
        deadline = time.time() + 30
        while {c.job(job_id)["state"] for job_id in ids[:2]} != {"RUN"}:
            assert time.time() < deadline, "the first two jobs do not start"
            time.sleep(0.05)
        running_on = {c.job(job_id)["ranks"] for job_id in ids[:2]}
        summaries = {s["id"]: s for s in c.jobs(ids=ids[2:])}
        assert {summaries[job_id]["state"] for job_id in ids[2:]} == {"SCHED"}
        reasons = {summaries[job_id]["pending_reason"] for job_id in ids[2:]}
        assert reasons <= {f"Dispatched: ahead on rank {rank}" for rank in running_on}, reasons
        table = subprocess.run(["mc", "jobs"], env={**os.environ, "MC_URI": cluster.uri}, capture_output=True,
                               text=True, timeout=60)
        assert table.returncode == 0, table.stderr
        rows = [line for line in table.stdout.splitlines() if line.split()[:1] in ([str(i)] for i in ids[2:])]
        assert len(rows) == 2 and all("Dispatched: ahead on rank" in row for row in rows), table.stdout
        c.cancel(ids)
        wait_all(c, ids, timeout=30)
