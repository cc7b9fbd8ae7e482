"""A guest of a root instance never acts with root's privileges (issue 10, item 1): the setpriv that drops to
the guest's ids is root's own, not the first on the guest's PATH, and the guest's output files and working
directory are opened as the guest. The guest is a real second uid (a forked child of the root test)."""
from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.client import Client
from worker.asuser import acting_as
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.test_access import GUEST, NOGROUP, as_user, shared  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="switching uids needs root (CI runs as root)")


@pytest.fixture
def rootdir() -> Iterator[Path]:
    """A directory only root may write in, with a file only root may write."""
    with tempfile.TemporaryDirectory(prefix="mc-rootonly-") as d:
        os.chmod(d, 0o755)
        (Path(d) / "root.log").write_text("root's\n")
        os.chmod(Path(d) / "root.log", 0o644)
        yield Path(d)


@pytest.fixture
def guestdir() -> Iterator[Path]:
    """A directory the guest owns."""
    with tempfile.TemporaryDirectory(prefix="mc-guest-") as d:
        os.chown(d, GUEST, NOGROUP)
        os.chmod(d, 0o755)
        yield Path(d)


def guest_submit(uri: str, spec: dict) -> int:
    answer = as_user(GUEST, NOGROUP, lambda: Client(uri).submit(spec))
    assert "ok" in answer, answer
    return answer["ok"]


@pytest.mark.smoke
def test_a_setpriv_planted_on_the_guests_path_is_not_run(shared, guestdir: Path) -> None:  # noqa: F811
    planted = guestdir / "setpriv"
    marker = guestdir / "ran-as"
    planted.write_text(f"#!/bin/sh\nid -u > {marker}\nshift 4\nexec \"$@\"\n")
    os.chmod(planted, 0o755)
    os.chown(planted, GUEST, NOGROUP)
    spec = job(["id", "-u"], env={"PATH": f"{guestdir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    job_id = guest_submit(shared.uri, spec)
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 0
        assert output_of(owner, job_id)[0].strip() == str(GUEST).encode()
    assert not marker.exists()


def test_guest_cannot_create_or_append_to_roots_files(shared, rootdir: Path) -> None:  # noqa: F811
    created = guest_submit(shared.uri, job(["echo", "planted"], output=str(rootdir / "new-{id}.log")))
    appended = guest_submit(shared.uri, job(["echo", "planted"], output=str(rootdir / "root.log")))
    with shared.client() as owner:
        for job_id in (created, appended):
            assert wait_for(owner, job_id)["status"] == 126
            (task,) = owner.task_results(job_id)
            assert "Permission denied" in task[6]
    assert not list(rootdir.glob("new-*"))
    assert (rootdir / "root.log").read_text() == "root's\n"


def test_guest_output_file_is_the_guests(shared, guestdir: Path) -> None:  # noqa: F811
    job_id = guest_submit(shared.uri, job(["id", "-u"], output=str(guestdir / "{id}.out")))
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 0
    out = guestdir / f"{job_id}.out"
    assert out.read_text().strip() == str(GUEST)
    assert (out.stat().st_uid, out.stat().st_gid) == (GUEST, NOGROUP)


def test_guest_cannot_work_in_a_directory_closed_to_it(shared, rootdir: Path) -> None:  # noqa: F811
    closed = rootdir / "closed"
    closed.mkdir(mode=0o700)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    (closed / "inside").mkdir()
    job_id = guest_submit(shared.uri, job(["pwd"], cwd=str(closed)))
    inside = guest_submit(shared.uri, job(["pwd"], cwd=str(closed / "inside")))
    absent = guest_submit(shared.uri, job(["pwd"], cwd=str(closed / "absent")))
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 126
        (task,) = owner.task_results(job_id)
        assert task[6].startswith("cwd") and "Permission denied" in task[6]
        # What is inside a directory the guest may not search, and what is not, look alike to the guest.
        errors = []
        for probe in (inside, absent):
            assert wait_for(owner, probe)["status"] == 126
            errors.append(owner.task_results(probe)[0][6].split(": ", 1)[1])
        assert errors[0] == errors[1]


def fs_ids() -> tuple[str, str]:
    """This thread's file-system uid and gid (the fourth of the Uid: and Gid: lines)."""
    lines = dict(line.split(":", 1) for line in Path("/proc/thread-self/status").read_text().splitlines())
    return lines["Uid"].split()[3], lines["Gid"].split()[3]


def test_acting_as_checks_opens_as_the_user_and_gives_the_ids_back(rootdir: Path) -> None:
    with acting_as(GUEST, NOGROUP):
        assert fs_ids() == (str(GUEST), str(NOGROUP))
        with pytest.raises(PermissionError):
            os.open(rootdir / "root.log", os.O_WRONLY | os.O_APPEND)
    assert fs_ids() == ("0", "0")
    os.close(os.open(rootdir / "root.log", os.O_WRONLY | os.O_APPEND))
