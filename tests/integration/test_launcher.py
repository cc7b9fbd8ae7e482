"""`mc start`: runs a command inside a fresh local instance, exits with its status, resumes a state dir and
leaves no process behind."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


def mc_start(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mc", "start", *argv], capture_output=True, text=True, timeout=timeout)


def leftovers(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_main_command_runs_across_ranks_and_leaves_nothing(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    done = mc_start("--size", "4", "--state-dir", state, "--", "mc", "run", "-N", "4", "-n", "8", "hostname")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 8
    time.sleep(0.2)
    assert leftovers(state) == []


def test_exit_status_is_the_commands(tmp_path: Path) -> None:
    assert mc_start("--size", "2", "--", "sh", "-c", "exit 3").returncode == 3
    failing = mc_start("--size", "2", "--", "mc", "run", "sh", "-c", "exit 5")
    assert failing.returncode == 5


def test_running_tasks_are_killed_when_the_instance_stops(tmp_path: Path) -> None:
    marker = tmp_path / "still-here"
    started = mc_start("--size", "2", "--", "mc-submit", "-N", "2", "-n", "2", "--mpi", "none",
                       "sh", "-c", f"sleep 0.3; sleep 60; touch {marker}")
    assert started.returncode == 0, started.stderr
    time.sleep(0.5)
    assert leftovers(f"touch {marker}") == []


def test_state_dir_is_resumed(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    first = mc_start("--size", "2", "--state-dir", state, "--", "mc-submit", "--wait", "echo", "kept")
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout.split()[0])
    second = mc_start("--size", "2", "--state-dir", state, "--", "mc", "jobs", "-a", "--json")
    assert second.returncode == 0, second.stderr
    jobs = json.loads(second.stdout)["jobs"]
    assert [j["id"] for j in jobs] == [job_id] and jobs[0]["status"] == 0
    third = mc_start("--size", "2", "--state-dir", state, "--", "mc-submit", "true")
    assert int(third.stdout.split()[0]) > job_id


def test_bad_arguments_are_reported(tmp_path: Path) -> None:
    bad = mc_start("--size", "0", "--", "true")
    assert bad.returncode != 0 and "size" in bad.stderr
    bad = mc_start("--set", "nonsense=1", "--", "true")
    assert bad.returncode != 0 and "unknown key" in bad.stderr
