"""Spawning under a container runtime's default seccomp profile (issue 25, item 2).

RuntimeDefault refuses unshare(2) without CAP_SYS_ADMIN, so a worker's loop thread cannot have a cwd of its own,
and a task's cwd entered there would be every thread's while it spawns.  The instance here runs under a real
seccomp filter that answers unshare with EPERM, as that profile does: a launcher built in the test with cc
installs it (no_new_privs, then the BPF program) and execs `mc start`, whose ranks inherit it.  Tasks with a cwd
must then run in it, spawned by a single-threaded spawn helper, with no warning; a task too large for a helper is
refused with the reason instead of being spawned where other threads would see its cwd.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster import config
from minicluster.client import Client, ClientError
from tests.host import need
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.test_access import GUEST, NOGROUP
from tests.integration.test_guest_privileges import guest_submit
from worker.helpers import LARGEST_ORDER

pytestmark = pytest.mark.slow

LAUNCHER = Path(__file__).with_name("nounshare.c")  # also built by benchmarks/cwd_spawn.py
PROBE = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True);"
         " print(libc.unshare(0x200), os.strerror(ctypes.get_errno()))")


@pytest.fixture(scope="module")
def nounshare(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The launcher; checked to refuse unshare(CLONE_FS) to what it runs, as RuntimeDefault does."""
    need("cc")  # builds the seccomp launcher
    cc = shutil.which("cc")
    assert cc is not None
    build = tmp_path_factory.mktemp("seccomp")
    subprocess.run([cc, "-O", "-o", str(build / "nounshare"), str(LAUNCHER)], check=True, timeout=60)
    probe = subprocess.run([str(build / "nounshare"), "python3", "-c", PROBE], capture_output=True, text=True,
                           timeout=30)
    assert probe.stdout.split(None, 1) == ["-1", "Operation not permitted\n"], probe
    return str(build / "nounshare")


def test_tasks_run_in_their_cwd_without_unshare(nounshare: str, tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    # One line per task: its cwd, and who spawned it (its parent until it ends).
    task = tmp_path / "task.sh"
    task.write_text("echo \"$(pwd) $(tr '\\0' ' ' < /proc/$PPID/cmdline)\"\n")
    script = " && ".join(f"mc run -N 2 -n 4 --cwd {d} sh {task}" for d in dirs)
    done = subprocess.run([nounshare, "mc", "start", "--size", "2", "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "unshare" not in done.stderr  # before: every rank warned, and entered the cwd in the shared loop thread
    cwds, parents = zip(*(line.split(" ", 1) for line in done.stdout.splitlines()), strict=True)
    assert sorted(cwds) == [str(dirs[0])] * 4 + [str(dirs[1])] * 4
    assert all("worker.spawnhelper" in parent for parent in parents), parents


def test_a_tasks_umask_is_worn_by_a_helper_without_unshare(nounshare: str, tmp_path: Path) -> None:
    # umask, like cwd, is the loop thread's own only after unshare(CLONE_FS): here a helper spawns the task.
    out = tmp_path / "out"
    done = subprocess.run([nounshare, "mc", "start", "--size", "1", "--", "mc", "run", "--umask", "077", "--output",
                           str(out), "sh", "-c", "umask"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (stat.S_IMODE(out.stat().st_mode), out.read_text()) == (0o600, "0077\n")


def test_a_task_too_large_for_a_helper_is_refused_with_the_reason(nounshare: str, tmp_path: Path) -> None:
    # Over the largest order a helper is sent, in variables execve takes (each under MAX_ARG_STRLEN, 128 KiB).
    big = {f"MC_SECCOMP_BIG{i}": "x" * 60_000 for i in range(LARGEST_ORDER // 60_000 + 1)}
    done = subprocess.run([nounshare, "mc", "start", "--size", "1", "--", "mc", "run", "--cwd", str(tmp_path), "pwd"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **big})
    assert done.returncode == 126, done.stderr
    assert done.stdout == ""
    assert "not entered" in done.stderr and "unshare(CLONE_FS): Operation not permitted" in done.stderr


@pytest.fixture
def instance(nounshare: str) -> Iterator[tuple[Client, str]]:
    """An interactive root instance under the filter that guests (group nogroup) may use."""
    proc = subprocess.Popen([nounshare, "mc", "start", "--size", "1", "--set", "access_group=nogroup"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # type: ignore[union-attr]
        assert "state in " in first, first
        uri = f"unix://{config.load(Path(first.rstrip().rsplit('state in ', 1)[1]) / 'config.toml').socket_path}"
        deadline = time.time() + 30
        while True:
            try:
                with Client(uri) as client:
                    if [r["state"] for r in client.status()["ranks"]] == ["up"]:
                        break
            except (ClientError, OSError):
                pass
            assert time.time() < deadline and proc.poll() is None, "the instance did not come up"
            time.sleep(0.05)
        with Client(uri) as client:
            yield client, uri
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    assert "unshare" not in rest


@pytest.mark.needs(root=True)  # switching uids
def test_a_guests_task_enters_its_cwd_as_the_guest(instance: tuple[Client, str]) -> None:
    owner, uri = instance
    with tempfile.TemporaryDirectory(prefix="mc-seccomp-guest-") as d:
        os.chown(d, GUEST, NOGROUP)
        closed = Path(d) / "closed"
        closed.mkdir(mode=0o700)  # root's: the guest may not enter it
        ids = [guest_submit(uri, job(["pwd"], cwd=cwd)) for cwd in (d, str(closed))]
        assert wait_for(owner, ids[0])["status"] == 0
        assert output_of(owner, ids[0]) == {0: f"{d}\n".encode()}
        assert wait_for(owner, ids[1])["status"] == 126
        assert "Permission denied" in owner.task_results(ids[1])[0][6]

