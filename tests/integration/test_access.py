"""Who may do what: the client socket's mode, uids from the kernel, cancel rights, guests' tasks running under
their own uid, and owner-only operations.  Guests are forked children of the test that drop to another uid,
so no second Python installation readable by them is needed."""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, output_of, wait_for

GUEST, OTHER_GUEST, OUTSIDER = 65533, 65532, 65531
NOGROUP = 65534

pytestmark = pytest.mark.needs(root=True)  # switching uids


def as_user(uid: int, gid: int, fn: Callable[[], Any], groups: Sequence[int] = ()) -> Any:
    """Run fn in a child process with the given ids and supplementary `groups`; returns its JSON-able result or
    the error it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            result: Any = {"ok": fn()}
        except ClientError as exc:
            result = {"error": exc.code, "message": str(exc)}
        except OSError as exc:
            result = {"oserror": exc.errno}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture(scope="module")
def shared() -> LocalCluster:
    state = tempfile.mkdtemp(prefix="mc-access-")  # 0700, as every state directory is made: the broker opens it
    cluster = LocalCluster(state, size=1, access_group="nogroup").start()
    yield cluster
    cluster.stop()


def test_socket_is_owner_and_group_only(shared: LocalCluster) -> None:
    mode = os.stat(shared.config.socket_path).st_mode
    assert stat.S_IMODE(mode) & 0o007 == 0
    assert os.stat(shared.config.socket_path).st_gid == NOGROUP
    assert stat.S_IMODE(os.stat(shared.state_dir / "journal.sqlite").st_mode) == 0o600
    refused = as_user(OUTSIDER, OUTSIDER, lambda: Client(shared.uri).hello())
    assert refused["error"] == "connect"


def test_the_default_socket_is_reachable_by_the_group_alone_and_nothing_beside_it(shared: LocalCluster) -> None:
    """access_group with the socket in its default place, STATE/run/broker.sock: the state directory and run/ are
    searchable by the group (0710), not listable, and what lies in them stays the owner's."""
    state, run = shared.state_dir, shared.state_dir / "run"
    for directory in (state, run):
        info = os.stat(directory)
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o710, NOGROUP), directory
    assert as_user(GUEST, NOGROUP, lambda: Client(shared.uri).hello())["ok"]["uid"] == GUEST
    assert as_user(GUEST, NOGROUP, lambda: os.listdir(state)) == {"oserror": errno.EACCES}
    for private in ("journal.sqlite", "config.toml", "curve/curve.key_secret", "lock"):
        path = str(state / private)
        assert as_user(GUEST, NOGROUP, lambda path=path: Path(path).read_bytes()[:1]) == {"oserror": errno.EACCES}
    assert as_user(OUTSIDER, OUTSIDER, lambda: Client(shared.uri).hello())["error"] == "connect"
    assert as_user(OUTSIDER, OUTSIDER, lambda: os.stat(run)) == {"oserror": errno.EACCES}


def test_without_access_group_the_state_directory_is_the_owners_again(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "state", size=1, access_group="nogroup"):
        pass
    with LocalCluster(tmp_path / "state", size=1) as alone:
        for directory in (alone.state_dir, alone.state_dir / "run"):
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        assert as_user(GUEST, NOGROUP, lambda: Client(alone.uri).hello())["error"] == "connect"


def test_uid_comes_from_the_kernel(shared: LocalCluster) -> None:
    seen = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).hello())
    assert seen["ok"]["uid"] == GUEST and seen["ok"]["owner_uid"] == 0


def test_guest_job_runs_as_guest_and_only_owners_may_cancel(shared: LocalCluster) -> None:
    with shared.client() as owner:
        owners_job = owner.submit(job(["sleep", "30"]))
        guest_job = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).submit(job(["sleep", "30"])))["ok"]
        denied = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).cancel([owners_job]))["ok"]
        assert denied[0] == [] and "permission denied" in denied[1][str(owners_job)]
        denied = as_user(OTHER_GUEST, NOGROUP, lambda: Client(shared.uri).cancel([guest_job]))["ok"]
        assert denied[0] == []
        allowed = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).cancel([guest_job]))["ok"]
        assert allowed[0] == [guest_job]
        assert owner.cancel([owners_job])[0] == [owners_job]
        assert owner.job(guest_job)["uid"] == GUEST
        ident = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).submit(job(["id", "-u"])))["ok"]
        wait_for(owner, ident)
        assert output_of(owner, ident)[0].strip() == str(GUEST).encode()


def test_owner_only_operations(shared: LocalCluster) -> None:
    for op in ("shutdown", "drain"):
        def call(op: str = op) -> Any:
            return Client(shared.uri).call(op, ranks=[0], reason="x")
        assert as_user(GUEST, NOGROUP, call)["error"] == "permission"
    with shared.client() as owner:
        assert owner.hello()["uid"] == 0


def test_single_jobs_of_two_users_sent_ahead_on_the_same_cores_each_run_as_their_submitter(
        shared: LocalCluster) -> None:
    """The dispatch window chains small single jobs from the head of the queue whoever submitted them
    (protocol.md §2.10): each still runs under its own submitter's uid and gid."""
    ident = job(["sh", "-c", "id -u; id -g"])

    def submit_many(count: int) -> list[int]:
        with Client(shared.uri) as c:
            return [answer for answer in c.submit_many([ident] * count) if isinstance(answer, int)]

    with shared.client() as owner:
        for _ in range(2):  # each user's first runs of the command make it known as small
            for ids in (submit_many(2), as_user(GUEST, NOGROUP, lambda: submit_many(2))["ok"]):
                for job_id in ids:
                    wait_for(owner, job_id)
        pid = os.fork()
        if pid == 0:  # the guest submits while the owner does
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(GUEST)
            ids = submit_many(60)
            with open(os.path.join(tempfile.gettempdir(), f"mc-guest-ids-{os.getppid()}"), "w") as out:
                json.dump(ids, out)
            os._exit(0)
        mine = submit_many(60)
        os.waitpid(pid, 0)
        with open(os.path.join(tempfile.gettempdir(), f"mc-guest-ids-{os.getpid()}")) as f:
            theirs = json.load(f)
        os.unlink(f.name)
        assert len(mine) == len(theirs) == 60
        for ids, uid, gid in ((mine, 0, 0), (theirs, GUEST, NOGROUP)):
            for job_id in ids:
                assert wait_for(owner, job_id)["status"] == 0
                assert output_of(owner, job_id)[0].split() == [str(uid).encode(), str(gid).encode()], job_id
