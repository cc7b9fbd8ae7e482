"""A guest's bad submit gets one line from mc-submit and from the broker, and leaves no traceback in the
broker's log (issue 24's review: a deep resource tree, -n not a multiple of --tasks-per-node, argv that is
not UTF-8)."""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.client import ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for

pytestmark = pytest.mark.slow

DEEP = "node[1]>" * 500 + "slot[1]>core[1]"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    state = tmp_path_factory.mktemp("guestbad")
    c = LocalCluster(state, size=1)
    log = state / "broker.log"
    with open(log, "wb") as sink:
        c.start_rank(0, stderr=sink)
    try:
        c.wait_up(30)
        yield c, log
    finally:
        c.stop()


def mc_submit(c: LocalCluster, *argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
    tool = shutil.which("mc-submit")
    assert tool is not None
    return subprocess.run([tool, *argv], capture_output=True, timeout=30, env={**os.environ, "MC_URI": c.uri})


def one_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def no_traceback(log: Path) -> None:
    assert "Traceback" not in log.read_text(errors="replace")


@pytest.mark.parametrize("argv, says", [
    (("--resources", DEEP, "true"), "deeper than 16 levels"),
    (("--tasks-per-node", "3", "true"), "not a multiple of tasks_per_node=3"),
    (("--", "true", b"\xff"), "argv[1] '\\xff' is not valid UTF-8"),
    (("--env", b"A\xff=1", "true"), "not valid UTF-8"),
    (("--name", b"x\xff", "true"), "name 'x\\xff' is not valid UTF-8"),
])
def test_mc_submit_says_one_line(cluster: tuple[LocalCluster, Path], argv: tuple[str | bytes, ...], says: str) -> None:
    c, log = cluster
    assert says in one_line(mc_submit(c, *argv))
    no_traceback(log)


@pytest.mark.parametrize("fields, says", [
    ({"resources": DEEP}, "deeper than 16 levels"),
    ({"ntasks": 1, "tasks_per_node": 3}, "not a multiple of tasks_per_node=3"),
])
def test_the_broker_refuses_without_a_traceback(cluster: tuple[LocalCluster, Path], fields: dict, says: str) -> None:
    c, log = cluster
    with c.client() as client:
        with pytest.raises(ClientError) as caught:
            client.submit(job(["true"], **fields), check=False)
        assert caught.value.code == "invalid-jobspec" and says in str(caught.value)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
        assert wait_for(client, client.submit(job(["true"])))["status"] == 0
    no_traceback(log)
