"""The session-end check of tests/conftest.py (`nothing_left_running`), run on a session of its own: a test that
leaves a process or a mount behind fails the run, which names what was left."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import host

REPO = Path(__file__).resolve().parents[2]

LEAVES_BEHIND = '''
import subprocess


def test_leaves_a_process() -> None:
    subprocess.Popen(["sleep", "300"], start_new_session=True)  # a daemon nobody ends


def test_leaves_a_mount(tmp_path) -> None:
    (tmp_path / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "leftover", str(tmp_path / "mnt")], check=True)
'''


@pytest.mark.needs("mount", "umount", root=True)
@pytest.mark.long
def test_a_session_that_leaves_a_process_and_a_mount_fails_and_names_them(tmp_path: Path) -> None:
    (tmp_path / "test_leaves.py").write_text(textwrap.dedent(LEAVES_BEHIND))
    base = tmp_path / "base"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-c", "/dev/null", "-p", "no:cacheprovider",
             "--rootdir", str(tmp_path), "--basetemp", str(base), str(tmp_path / "test_leaves.py")],
            cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["umount", "-R", "-l", str(base / "test_leaves_a_mount0" / "mnt")], capture_output=True)
    report = done.stdout + done.stderr
    assert done.returncode != 0, report
    assert "the test session left behind" in report
    assert "process " in report and "sleep 300" in report
    assert f"mount {base}/test_leaves_a_mount0/mnt" in report
    # The check killed the process: it was orphaned and carries the inner session's mark, so this one would miss it.
    assert not [pid for pid in host.pids() if host.alive(pid) and host.cmdline(pid) == "sleep 300"]
