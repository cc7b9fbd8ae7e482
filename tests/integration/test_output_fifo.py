"""A task's --output/--error path is opened without blocking the process that spawns (issue 24 review, defect A):
a FIFO no process reads used to hold the rank's loop, or the spawn helper every guest task of the rank shares,
until something opened it for reading, and every later task of the rank waited behind it. Now such a task ends
126 with the reason and the rank runs on; a FIFO some process reads gets the output, through a blocking fd as
any pipe; /dev/null is allowed, a socket refused. Real clusters, real FIFOs, the owner and a real guest uid."""
from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.test_access import GUEST, NOGROUP, shared  # noqa: F401 (fixture)
from tests.integration.test_guest_privileges import ROUTES, guest_submit, with_helpers  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

# On the old code the spawn blocked until a reader came: after this long the test gives it one, so the job ends
# (with status 0, and the test fails on it) instead of hanging the run.
UNBLOCK_AFTER = 20.0
TASK = ["sh", "-c", "echo hi; grep ^flags: /proc/self/fdinfo/1"]


@pytest.fixture(scope="module")
def owners() -> Iterator[LocalCluster]:
    with tempfile.TemporaryDirectory(prefix="mc-fifo-") as state, LocalCluster(Path(state) / "state", size=1) as c:
        yield c


@pytest.fixture
def fifodir() -> Iterator[Path]:
    """A directory holding a FIFO, both the guest's when the test runs as root (the owner, root, may use them too)."""
    with tempfile.TemporaryDirectory(prefix="mc-fifo-dir-") as d:
        os.chmod(d, 0o755)
        os.mkfifo(Path(d) / "fifo", 0o600)
        if os.getuid() == 0:
            for path in (d, Path(d) / "fifo"):
                os.chown(path, GUEST, NOGROUP)
        yield Path(d)


@contextlib.contextmanager
def reader_later(fifo: Path) -> Iterator[None]:
    """A reader for `fifo` UNBLOCK_AFTER seconds from now, unless the block ends first."""
    fds: list[int] = []
    timer = threading.Timer(UNBLOCK_AFTER, lambda: fds.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        for fd in fds:
            os.close(fd)


def submitter(who: str, request: pytest.FixtureRequest) -> tuple[LocalCluster, object]:
    """The cluster and a submit(spec) -> job id for the owner of its own instance or a guest taking `who`'s route."""
    if who == "owner":
        cluster: LocalCluster = request.getfixturevalue("owners")
        return cluster, lambda spec: _owner_submit(cluster, spec)
    fixture, extra = ROUTES[who]
    cluster = request.getfixturevalue(fixture)
    return cluster, lambda spec: guest_submit(cluster.uri, {**spec, "env": {**spec["env"], **extra}})


def _owner_submit(cluster: LocalCluster, spec: dict) -> int:
    with cluster.client() as client:
        return client.submit(spec)


WHO = ["owner", *(route for route in ROUTES if os.getuid() == 0)]


@pytest.mark.parametrize("who", WHO)
def test_an_output_fifo_nobody_reads_fails_the_task_and_the_rank_runs_on(request: pytest.FixtureRequest, who: str,
                                                                          fifodir: Path) -> None:
    cluster, submit = submitter(who, request)
    fifo = fifodir / "fifo"
    with reader_later(fifo), cluster.client() as owner:
        stuck = submit(job(TASK, output=str(fifo)))  # type: ignore[operator]
        after = submit(job(["echo", "after"]))  # type: ignore[operator]
        result = wait_for(owner, stuck)
        (task,) = owner.task_results(stuck)
        assert (result["status"], task[6]) == (126, f"stdout {fifo}: a FIFO no process reads"), task
        assert wait_for(owner, after)["status"] == 0
        assert output_of(owner, after)[0] == b"after\n"


@pytest.mark.parametrize("who", WHO)
def test_an_output_fifo_with_a_reader_gets_the_output_through_a_blocking_fd(request: pytest.FixtureRequest,
                                                                            who: str, fifodir: Path) -> None:
    cluster, submit = submitter(who, request)
    fifo = fifodir / "fifo"
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        job_id = submit(job(TASK, output=str(fifo)))  # type: ignore[operator]
        with cluster.client() as owner:
            assert wait_for(owner, job_id)["status"] == 0, [row[6] for row in owner.task_results(job_id)]
        lines = os.read(reader, 65536).decode().splitlines()
    finally:
        os.close(reader)
    assert lines[0] == "hi"
    assert int(lines[1].split()[1], 8) & os.O_NONBLOCK == 0, lines[1]


def test_dev_null_is_an_output_and_a_socket_is_not(owners: LocalCluster, tmp_path: Path) -> None:
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "sock"))
    try:
        with owners.client() as owner:
            quiet = owner.submit(job(["echo", "hi"], output="/dev/null"))
            refused = owner.submit(job(["echo", "hi"], output=str(tmp_path / "sock")))
            assert wait_for(owner, quiet)["status"] == 0
            assert wait_for(owner, refused)["status"] == 126
            assert owner.task_results(refused)[0][6] == (f"stdout {tmp_path / 'sock'}: not a regular file, a FIFO"
                                                         " or a character device")
    finally:
        listening.close()
