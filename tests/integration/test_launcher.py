"""`mc start`: runs a command inside a fresh local instance, exits with its status, resumes a state dir and
leaves no process behind."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minicluster import Client, ClientError, config
from tests.host import children, descendants, with_cmdline as leftovers
from tests.integration.conftest import until

_instances: list[subprocess.Popen[str]] = []


def launch(*argv: str, **streams: Any) -> subprocess.Popen[str]:
    """`mc start` in a process group of its own, which the test's teardown ends."""
    proc = subprocess.Popen(["mc", "start", *argv], start_new_session=True, text=True, **streams)
    _instances.append(proc)
    return proc


@pytest.fixture(autouse=True)
def end_instances() -> Iterator[None]:
    """Each `mc start` of a test is gone after it, whether it passed or failed (the session check would fail the
    run otherwise): its process tree and group are killed."""
    yield
    while _instances:
        proc = _instances.pop()
        for kill, pid in [(os.kill, pid) for pid in descendants(proc.pid)] + [(os.killpg, proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait(timeout=10)


def mc_start(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = launch(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_main_command_runs_across_ranks_and_leaves_nothing(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    done = mc_start("--size", "4", "--state-dir", state, "--", "mc", "run", "-N", "4", "-n", "8", "hostname")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 8
    until(lambda: not leftovers(state), "the instance's processes end with it", timeout=15)


def test_exit_status_is_the_commands(tmp_path: Path) -> None:
    assert mc_start("--size", "2", "--", "sh", "-c", "exit 3").returncode == 3
    failing = mc_start("--size", "2", "--", "mc", "run", "sh", "-c", "exit 5")
    assert failing.returncode == 5


def test_running_tasks_are_killed_when_the_instance_stops(tmp_path: Path) -> None:
    marker = tmp_path / "still-here"
    started = mc_start("--size", "2", "--", "mc-submit", "-N", "2", "-n", "2", "--mpi", "none",
                       "sh", "-c", f"sleep 0.3; sleep 60; touch {marker}")
    assert started.returncode == 0, started.stderr
    until(lambda: not leftovers(f"touch {marker}"), "the instance's tasks end with it", timeout=15)


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


@pytest.mark.parametrize("argv, message", [
    (["--size", "0"], "mc start: error: argument --size: must be an integer of at least 1, got 0 (see --help)"),
    (["--fanout", "0"], "mc start: error: argument --fanout: must be an integer of at least 1, got 0 (see --help)"),
    (["--set", "nonsense=1"], "mc start: error: --set: unknown key(s) nonsense"),
    (["--set", "lost_after"], "mc start: error: --set 'lost_after': expected KEY=VALUE"),
    (["--set", "fanout=0"], "mc start: error: fanout must be a number from 1 to 100000, got 0"),
    (["--set", "heartbeat_interval=0"], "mc start: error: heartbeat_interval must be a number from 0.01 to 3600,"
                                        " got 0.0"),
    (["--set", "lost_after=nan"], "mc start: error: lost_after must be a number from 0.01 to 1e+09, got nan"),
    (["--set", "access_group=nosuchgroup"], "mc start: error: access_group 'nosuchgroup' is not a group of this"
                                            " host"),
    (["--state-dir", "/etc/passwd"], "mc start: error: --state-dir /etc/passwd: not a directory"),
    (["--resources", "banana"], "mc start: error: --resources: resources override 'banana': unknown key 'banana'"),
])
def test_configuration_errors_are_one_line(argv: list[str], message: str) -> None:
    bad = mc_start(*argv, "--", "true")
    assert bad.returncode == 2 and bad.stderr.startswith(message) and bad.stderr.count("\n") == 1, bad.stderr


def start_interactive(*argv: str) -> tuple[subprocess.Popen[str], Path]:
    """An interactive `mc start` (no command) and its state dir, once every rank is up."""
    proc = launch("--size", "3", *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = proc.stderr.readline()  # type: ignore[union-attr]
    state = Path(first.rstrip().rsplit("state in ", 1)[1])
    deadline = time.time() + 30
    while True:
        try:
            with Client(f"unix://{config.load(state / 'config.toml').socket_path}") as client:
                if [r["state"] for r in client.status()["ranks"]] == ["up"] * 3:
                    return proc, state
        except (ClientError, OSError, config.ConfigError):
            pass
        assert time.time() < deadline and proc.poll() is None, "the instance did not come up"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signals_stop_it_cleanly_and_remove_temporary_state(sig: signal.Signals) -> None:
    proc, state = start_interactive()
    ranks = children(proc.pid)
    assert len(ranks) == 3
    proc.send_signal(sig)
    proc.communicate(timeout=15)
    assert proc.returncode == 128 + sig
    assert not state.exists()
    until(lambda: all(not Path(f"/proc/{pid}").exists() for pid in ranks), "the ranks end and are reaped", timeout=15)


def test_sigterm_stops_the_command_too(tmp_path: Path) -> None:
    started, marker = tmp_path / "started", tmp_path / "still-here"
    script = f"touch {started}; sleep 60; touch {marker}"
    proc = launch("--size", "2", "--", "sh", "-c", script, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while not started.exists():
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=15)
    assert proc.returncode == 143
    until(lambda: not leftovers(f"sleep 60; touch {marker}"), "the command's processes end", timeout=15)
    assert not marker.exists()


def test_broker_killed_stops_the_instance_and_says_so(tmp_path: Path) -> None:
    proc, _state = start_interactive("--state-dir", str(tmp_path / "state"))
    broker = children(proc.pid)[0]  # the oldest: rank 0 starts first
    started = time.time()
    os.kill(broker, signal.SIGKILL)
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 128 + signal.SIGKILL
    assert time.time() - started < 5  # the workers are stopped, not left to time out
    assert "the broker (rank 0) was killed by SIGKILL; a local instance does not restart its broker" in err
    assert children(proc.pid) == []
