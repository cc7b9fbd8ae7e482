"""A task the worker cannot start ends with status 126 or 127 and the reason, and never keeps the other tasks
of the same `run` message from starting (protocol.md §3.7). The `run` here bypasses the broker's checks at
submit, as a jobspec from an older broker's journal would; the agent runs real processes, spawned on its loop and in
a spawn helper."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from minicluster.config import from_mapping
from minicluster.proto.envelope import Message
from minicluster.testing import LocalCluster, RecordingSender
from minicluster.testing.builders import resources
from tests.integration.conftest import job, wait_for
from worker.agent import WorkerAgent

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def info(argv: list[str], env: dict[str, str] = ENV, **fields: Any) -> dict[str, Any]:
    return {"argv": argv, "env": env, "cwd": "/tmp", "ntasks": 1, "output": None, "mpi": None,
            "layout": [[0, 1]], "uid": os.getuid(), "gid": os.getgid(), **fields}


async def results_of(sender: RecordingSender, jobs: int, timeout: float = 20.0) -> dict[int, list[Any]]:
    """The first result of each job (task 0) from the agent's `done` messages."""
    seen: dict[int, list[Any]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(seen) < jobs:
        assert loop.time() < deadline, f"results for jobs {sorted(seen)} only"
        for msg in sender.take("done"):
            for row in msg.body["results"]:
                seen.setdefault(row[0], row)
        await asyncio.sleep(0.02)
    return seen


@pytest.mark.parametrize("helpers", [0, 1])
async def test_bad_tasks_end_with_their_reason_and_the_batch_runs(tmp_path: Path, helpers: int) -> None:
    config = from_mapping({"state_dir": str(tmp_path), "resources": "cores=2", "spawn_helpers": helpers})
    sender = RecordingSender(rank=1)
    agent = WorkerAgent(config, 1, sender.send, resources("cores=2"), "unix:///nonexistent")
    jobs = {
        1: info(["true"], output="out{"),
        2: info(["sh", "-c", "echo ran"]),
        3: info(["echo", "a\0b"]),
        4: info(["true"], env={**ENV, "A=B": "1"}),
        5: info(["true"], output=str(tmp_path / "no-such-dir" / "{id}.out")),
        6: info(["no-such-command-here"]),
        7: info(["true"], output="/x/{id:70000000}"),
        8: info(["true"], cwd="/tmp/\0"),
    }
    tasks = [[job, 0, 0, [0], []] for job in jobs]
    agent.handle(Message("run", 0, 1, {"jobs": jobs, "tasks": tasks}))
    try:
        results = await results_of(sender, len(jobs))
    finally:
        await agent.shutdown()
    status = {job: row[2] for job, row in results.items()}
    error = {job: row[5] or "" for job, row in results.items()}
    assert status == {1: 126, 2: 0, 3: 126, 4: 126, 5: 126, 6: 127, 7: 126, 8: 126}
    assert "not a placeholder" in error[1] and "not a placeholder" in error[7] and len(error[7]) < 300
    assert "null" in error[3] and "environment" in error[4]
    assert "No such file or directory" in error[5] and "command not found" in error[6]
    assert error[8].startswith("cwd")
    assert not agent.running and not agent.jobs  # nothing pins cores or job info


@pytest.mark.parametrize("output", ["out{", "/x/{id:70000000}"])
async def test_bad_template_in_a_two_task_job_fails_both_tasks(tmp_path: Path, output: str) -> None:
    config = from_mapping({"state_dir": str(tmp_path), "resources": "cores=2"})
    sender = RecordingSender(rank=1)
    agent = WorkerAgent(config, 1, sender.send, resources("cores=2"), "unix:///nonexistent")
    job = info(["true"], output=output, ntasks=2, layout=[[1, 2]])
    agent.handle(Message("run", 0, 1, {"jobs": {9: job}, "tasks": [[9, 0, 0, [0], []], [9, 1, 1, [1], []]]}))
    seen: list[list[Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    try:
        while len(seen) < 2:
            assert loop.time() < deadline
            seen += [row for msg in sender.take("done") for row in msg.body["results"]]
            await asyncio.sleep(0.02)
    finally:
        await agent.shutdown()
    assert sorted((row[1], row[2]) for row in seen) == [(0, 126), (1, 126)]


def test_a_fifo_named_as_the_program_of_an_mpi_auto_job_does_not_stall_the_broker(tmp_path: Path) -> None:
    """`--mpi auto` reads the program's ELF header on the worker: a FIFO there blocked rank 0's loop for good."""
    fifo = tmp_path / "prog"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o755)
    with LocalCluster(tmp_path / "state", size=1) as cluster, cluster.client() as c:
        # Found on the job's PATH: shutil.which takes any executable that is not a directory.
        job_id = c.call("submit", jobspec=job(["prog"], env={"PATH": str(tmp_path)}, ntasks=2, mpi="auto"))["job"]
        rid = c.request("wait", jobs=[job_id])
        answer = c.next_response([rid], timeout=30)
        assert answer is not None, "no answer in 30 s: the broker's loop is stuck"
        assert answer[1]["status"] == 126  # execve refuses what is not a regular file
        assert wait_for(c, c.submit(job(["true"])))["status"] == 0


@pytest.mark.parametrize("helpers", [0, 1])
async def test_a_relative_output_path_is_relative_to_the_tasks_cwd(tmp_path: Path, helpers: int) -> None:
    (tmp_path / "state").mkdir()
    config = from_mapping({"state_dir": str(tmp_path / "state"), "resources": "cores=2", "spawn_helpers": helpers})
    sender = RecordingSender(rank=1)
    agent = WorkerAgent(config, 1, sender.send, resources("cores=2"), "unix:///nonexistent")
    agent.handle(Message("run", 0, 1, {"jobs": {3: info(["echo", "here"], cwd=str(tmp_path), output="out-{id}.txt")},
                                       "tasks": [[3, 0, 0, [0], []]]}))
    try:
        assert (await results_of(sender, 1))[3][2] == 0
    finally:
        await agent.shutdown()
    assert (tmp_path / "out-3.txt").read_text() == "here\n"
