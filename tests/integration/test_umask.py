"""A task and its --output file take the submitter's umask, as Slurm carries srun's and sbatch's (issue 24 review):
the worker's own (022) made a guest's output world-readable even under the guest's `umask 077`. The tools and the
client library send the submitter's umask (protocol.md §3.4 `umask`); a submission without the field keeps the
worker's. Real clusters, mc-submit run as a process, the owner on the loop and in a helper, a real guest uid on
every spawn route."""
from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.client import Client, own_umask
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for
from tests.integration.test_access import GUEST, NOGROUP, as_user, shared  # noqa: F401 (fixture)
from tests.integration.test_guest_privileges import ROUTES, guestdir, with_helpers  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

TASK = ["sh", "-c", "umask"]
# (the submitter's umask, the output file's mode, what `umask` prints in the task)
MASKS = [(0o077, 0o600, "0077"), (0o002, 0o664, "0002")]


@pytest.fixture(scope="module", params=["loop", "helper"])
def owners(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The owner's own instance; its tasks spawned on the worker's loop, or by a spawn helper."""
    helpers = 1 if request.param == "helper" else 0
    with tempfile.TemporaryDirectory(prefix="mc-umask-") as state, \
            LocalCluster(Path(state) / "state", size=1, spawn_helpers=helpers) as cluster:
        yield cluster


def ended(cluster: LocalCluster, job_id: int, out: Path) -> tuple[int, str]:
    """The output file's mode and text once the job ended well."""
    with cluster.client() as client:
        assert wait_for(client, job_id)["status"] == 0, client.task_results(job_id)
    return stat.S_IMODE(out.stat().st_mode), out.read_text().strip()


def mc_submit(cluster: LocalCluster, umask: int, *argv: str) -> int:
    done = subprocess.run(["mc-submit", *argv], env={**os.environ, "MC_URI": cluster.uri}, umask=umask,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.parametrize(("umask", "mode", "printed"), MASKS)
def test_the_owners_task_and_output_take_mc_submits_umask(owners: LocalCluster, tmp_path: Path, umask: int,
                                                          mode: int, printed: str) -> None:
    job_id = mc_submit(owners, umask, "--output", str(tmp_path / "{id}.out"), *TASK)
    assert ended(owners, job_id, tmp_path / f"{job_id}.out") == (mode, printed)


def test_umask_option_and_a_submission_without_the_field(owners: LocalCluster, tmp_path: Path) -> None:
    given = mc_submit(owners, 0o077, "--umask", "027", "--output", str(tmp_path / "{id}.out"), *TASK)
    assert ended(owners, given, tmp_path / f"{given}.out") == (0o640, "0027")
    # An old client sends no umask: the task and its file keep the worker's (this test's, which started it).
    with owners.client() as client:
        raw = client.call("submit", jobspec=job(TASK, output=str(tmp_path / "{id}.out")))["job"]
    worker = own_umask()
    assert ended(owners, raw, tmp_path / f"{raw}.out") == (0o666 & ~worker, f"{worker:04o}")


def guest_submits(uri: str, umask: int, spec: dict, raw: bool = False) -> int:
    """The guest, under `umask`, submits through the client library (which sends it), or `raw` without it."""
    def submit() -> int:
        os.umask(umask)
        with Client(uri) as client:
            return client.call("submit", jobspec=spec)["job"] if raw else client.submit(spec)
    answer = as_user(GUEST, NOGROUP, submit)
    assert "ok" in answer, answer
    return answer["ok"]


@pytest.mark.skipif(os.getuid() != 0, reason="switching uids needs root (CI runs as root)")
@pytest.mark.parametrize("route", ROUTES)
def test_a_guests_task_and_output_take_the_guests_umask(request: pytest.FixtureRequest, route: str,
                                                       guestdir: Path) -> None:  # noqa: F811
    fixture, extra = ROUTES[route]
    cluster: LocalCluster = request.getfixturevalue(fixture)
    spec = job(TASK, env={"PATH": os.environ["PATH"], **extra}, output=str(guestdir / "{id}.out"))
    for umask, mode, printed in MASKS:
        job_id = guest_submits(cluster.uri, umask, spec)
        assert ended(cluster, job_id, guestdir / f"{job_id}.out") == (mode, printed)
        assert (guestdir / f"{job_id}.out").stat().st_uid == GUEST
    raw = guest_submits(cluster.uri, 0o077, spec, raw=True)
    worker = own_umask()
    assert ended(cluster, raw, guestdir / f"{raw}.out") == (0o666 & ~worker, f"{worker:04o}")


def test_a_umask_out_of_range_is_refused_in_one_line(owners: LocalCluster) -> None:
    with owners.client() as client:
        answer = subprocess.run(["mc-submit", "--umask", "1000", "true"], env={**os.environ, "MC_URI": owners.uri},
                                capture_output=True, text=True, timeout=30)
        assert answer.returncode == 2 and answer.stderr.count("\n") == 1, answer.stderr
        assert "octal umask from 000 to 777" in answer.stderr
        with pytest.raises(Exception, match="umask: must be <= 511, got 512"):
            client.submit({**job(["true"]), "umask": 0o1000})
