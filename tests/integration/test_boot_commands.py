"""`mc boot --pre/--post` (the operator's spec.commands.pre and post): real brokers and workers as processes.

pre runs on every rank before it starts (so before the batch command, which waits for every rank to join), post
on every rank after it ended, with its status; a failing pre keeps the rank from starting."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster


def _step(log: Path, what: str, status: int = 0) -> list[str]:
    """An argv that appends "WHAT rank=MC_RANK status=MC_EXIT_STATUS" to `log` and exits `status`."""
    line = f'echo "{what} rank=${{MC_RANK:-none}} status=${{MC_EXIT_STATUS:-none}}" >> {log}; exit {status}'
    return ["sh", "-c", line]


def _boot(cluster: LocalCluster, rank: int, pre: list[str] | None, post: list[str] | None,
          command: list[str] = ()) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "minicluster", "boot", "--config", cluster.config_path, "--rank", str(rank)]
    for flag, step in (("--pre", pre), ("--post", post)):
        if step:
            argv += [flag, json.dumps(step)]
    if command:
        argv += ["--", *command]
    return subprocess.Popen(argv, env={**os.environ, "MC_URI": cluster.uri}, stdin=subprocess.DEVNULL)


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    try:
        return [proc.wait(60) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_pre_and_post_run_on_every_rank_around_the_batch_command(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=2)
    log = tmp_path / "log"
    procs = [_boot(cluster, rank, _step(log, "pre"), _step(log, "post"),
                   _step(log, "command") if rank == 0 else []) for rank in (0, 1)]
    assert _wait_all(procs) == [0, 0]
    lines = log.read_text().splitlines()
    command = lines.index("command rank=none status=none")  # MC_RANK is pre's and post's alone, not the tasks'
    assert sorted(lines[:command]) == ["pre rank=0 status=none", "pre rank=1 status=none"]
    assert sorted(lines[command + 1:]) == ["post rank=0 status=0", "post rank=1 status=0"]


PRE, COMMAND = "pre rank=0 status=none", "command rank=none status=none"


@pytest.mark.parametrize("pre, command, post, status, ran", [
    # A failing pre: the rank never starts (no broker, no batch command, no post) and exits with pre's status.
    (5, 0, 0, 5, [PRE]),
    # post runs after a failed batch command and sees its status; the rank keeps the command's status.
    (0, 3, 4, 3, [PRE, COMMAND, "post rank=0 status=3"]),
    # A failing post fails a rank that had succeeded.
    (0, 0, 4, 4, [PRE, COMMAND, "post rank=0 status=0"]),
])
def test_a_failing_step_decides_the_ranks_status(tmp_path: Path, pre: int, command: int, post: int,
                                                 status: int, ran: list[str]) -> None:
    cluster = LocalCluster(tmp_path / "state", size=1)
    log = tmp_path / "log"
    proc = _boot(cluster, 0, _step(log, "pre", pre), _step(log, "post", post), _step(log, "command", command))
    assert _wait_all([proc]) == [status]
    assert log.read_text().splitlines() == ran


def test_a_bad_step_is_refused_in_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=1)
    argv = [sys.executable, "-m", "minicluster", "boot", "--config", cluster.config_path, "--rank", "0",
            "--pre", "echo hi"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "argument --pre: not JSON" in done.stderr
