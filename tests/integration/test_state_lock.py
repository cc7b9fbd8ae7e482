"""One instance per state dir (issue 10 item 5): a second broker or `mc start` on a live state dir is refused
with a message naming the dir and the holder, and the first instance keeps its workers and keeps working."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.durable.journal import Journal
from broker.durable.statelock import StateDirInUse
from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster, temp_journal
from tests.integration.conftest import job, output_of, wait_for


def check_still_serves(c: Client) -> None:
    job_id = c.submit(job(["echo", "still here"], nnodes=2, ntasks=2, mpi="none"))
    assert wait_for(c, job_id)["status"] == 0
    assert output_of(c, job_id) == {0: b"still here\n", 1: b"still here\n"}
    assert {r["rank"]: r["state"] for r in c.status()["ranks"]} == {0: "up", 1: "up"}


@pytest.mark.timeout(60)
def test_second_broker_on_a_live_state_dir_is_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=2, resources="cores=1") as cluster:
        second = subprocess.run([sys.executable, "-m", "minicluster", "broker", "--config", cluster.config_path],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert f"state dir {tmp_path} is in use by pid {cluster.procs[0].pid}" in second.stderr, second.stderr
        with cluster.client() as c:
            check_still_serves(c)
            assert c.status()["epoch"] == 1  # the refused broker did not even count a start
        # The lock goes with its holder, even one killed by -9: a restart takes it again.
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            check_still_serves(c)


@pytest.mark.timeout(90)
def test_second_mc_start_on_a_live_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(["mc", "start", "--size", "2", "--state-dir", str(state)], stdin=subprocess.DEVNULL,
                             stderr=log)
    try:
        uri = f"unix://{state}/run/broker.sock"
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(uri) as c:
                    if all(r["state"] == "up" for r in c.status()["ranks"]):
                        break
            except (OSError, ClientError):
                pass
            assert time.monotonic() < deadline, "the first instance did not come up"
            time.sleep(0.1)
        second = subprocess.run(["mc", "start", "--size", "2", "--state-dir", str(state), "--", "true"],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert f"state dir {state} is in use by pid {first.pid}" in second.stderr, second.stderr
        with Client(uri) as c:
            check_still_serves(c)
            c.shutdown()
        assert first.wait(30) == 0
    finally:
        if first.poll() is None:
            first.terminate()
            first.wait(30)
        log.close()
    assert os.path.exists(state / "journal.sqlite")


async def test_a_second_journal_on_one_file_is_refused(tmp_path: Path) -> None:
    async with temp_journal(tmp_path) as journal:
        journal.append([("INSERT INTO drains (rank, reason) VALUES (?, ?)", (1, "kept"))])
        with pytest.raises(StateDirInUse, match=re.escape(f"journal {tmp_path}/journal.sqlite is in use")):
            Journal(str(tmp_path))
        await journal.write([])
    async with temp_journal(tmp_path) as journal:  # close() released it
        assert journal.query("SELECT reason FROM drains") == [("kept",)]
