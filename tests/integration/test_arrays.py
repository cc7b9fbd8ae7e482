"""Arrays and many jobs: one record expanded lazily, {cc} substitution, per-index results and output, a
failing subset, pipelined submission, and bounded memory when a worker stalls."""
from __future__ import annotations

import os
import signal
import time

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, until, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("arrays"), size=3, fanout=2, resources="cores=2").start()
    yield c
    c.stop()


def test_array_substitutes_index_and_keeps_per_index_results(client: Client) -> None:
    array = client.submit(job(["sh", "-c", 'echo "i={cc} env=$MC_TASK_INDEX"; exit $(( {cc} % 7 == 0 ))'],
                              array="1-30:3,100"))
    result = wait_for(client, array)
    assert result["status"] == 1
    summary = client.job(array)
    indices = [1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 100]
    assert summary["ntasks"] == len(indices) and summary["array"] == "1-28:3,100"
    assert summary["counts"]["succeeded"] == 9 and summary["counts"]["failed"] == 2
    assert summary["failed"] == "7,28"
    rows = client.task_results(array)
    assert sorted(r[1] for r in rows) == indices
    assert {r[1]: r[3] for r in rows}[28] == 1
    out = b"".join(d for _, _, d in client.output(array, index=13))
    assert out == b"i=13 env=13\n"


def test_array_is_one_job_with_counts(client: Client) -> None:
    array = client.submit(job(["true"], array="0-199"))
    listed = [j for j in client.jobs(all=True) if j["id"] == array]
    assert len(listed) == 1
    wait_for(client, array)
    counts = client.job(array)["counts"]
    assert counts == {"pending": 0, "running": 0, "succeeded": 200, "failed": 0, "cancelled": 0}


def test_cancel_array_mid_way(client: Client) -> None:
    array = client.submit(job(["sleep", "0.3"], array="1-200"))
    until(lambda: client.job(array)["counts"]["succeeded"], "some elements ended")
    client.cancel([array])
    result = wait_for(client, array)
    counts = client.job(array)["counts"]
    assert result["exception"] == "cancel"
    assert counts["cancelled"] > 0 and counts["succeeded"] + counts["failed"] + counts["cancelled"] == 200


def test_pipelined_submissions_all_complete(client: Client) -> None:
    rids = [client.submit_async(job(["true"])) for _ in range(300)]
    assert len(rids) == 300
    ids = [i for i in client.collect() if isinstance(i, int)]
    assert len(ids) == 300 and ids == sorted(ids)
    statuses = [r["status"] for r in client.wait(ids)]
    assert statuses == [0] * 300


def test_submit_many_reports_each_bad_spec(client: Client) -> None:
    specs = [job(["true"]), {"argv": []}, job(["true"], nnodes=99, ntasks=99)]
    answers = client.call("submit-many", jobspecs=specs)["jobs"]
    assert isinstance(answers[0], int)
    assert answers[1]["code"] == "invalid-jobspec" and answers[2]["code"] == "infeasible"


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stalled_worker_does_not_grow_broker_memory(tmp_path) -> None:
    """SIGSTOP a worker holding tasks while a big array streams output: the broker stays bounded and the
    rest of the cluster carries on; the stalled rank is declared lost and its elements fail, not vanish."""
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=4", output_cap=1 << 20) as cluster, \
            cluster.client() as c:
        noisy = ["head", "-c", "20000", "/dev/zero"]
        array = c.submit(job(noisy, array="1-2000"))
        until(lambda: c.job(array)["counts"]["succeeded"] >= 50, "the array streams output")
        broker = cluster.procs[0].pid
        before = _rss_kb(broker)
        os.kill(cluster.procs[2].pid, signal.SIGSTOP)
        try:
            result = wait_for(c, array, timeout=240)
            after = _rss_kb(broker)
        finally:
            os.kill(cluster.procs[2].pid, signal.SIGCONT)
        counts = c.job(array)["counts"]
        assert counts["succeeded"] + counts["failed"] == 2000
        assert counts["succeeded"] > 1000
        assert result["status"] == 137  # elements on the stalled rank ended as node-lost
        assert after - before < 64 * 1024, f"broker RSS grew by {after - before} KiB"
        assert "output-truncated" in [e[2] for e in c.eventlog(array)]
        cluster.wait_states({2: "up"}, timeout=15)


def _peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines())
    return int(status["VmHWM"].split()[0]) / 1024


@pytest.mark.slow
def test_a_restart_requeues_a_huge_running_array_without_expanding_it(tmp_path) -> None:
    with LocalCluster(tmp_path, size=1, test_exec=True, resources="cores=4") as cluster:
        with cluster.client() as c:
            huge = c.submit(job(["true"], array="0-9999999", env={"MC_TEST_RUN_DURATION": "3600"}))
            next(e for e in c.eventlog(huge, follow=True) if e[2] == "start")
            c.job(huge)
        before = _peak_mb(cluster.procs[0].pid)
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            deadline = time.monotonic() + 60
            while c.job(huge)["counts"]["running"] < 4:  # requeued after the reattach window, and running again
                assert time.monotonic() < deadline, c.job(huge)
                time.sleep(0.1)
            c.cancel([huge])
            assert wait_for(c, huge)["exception"] == "cancel"
        # 10^7 pending elements one by one are 40 MB (and seconds of a stalled loop); as runs, next to nothing.
        assert _peak_mb(cluster.procs[0].pid) < before + 20


def test_held_huge_arrays_cost_the_broker_next_to_nothing(tmp_path) -> None:
    with LocalCluster(tmp_path, size=1, test_exec=True) as cluster, cluster.client() as c:
        before = _peak_mb(cluster.procs[0].pid)
        held = [c.submit(job(["true"], array="0-99999999", hold=True)) for _ in range(5)]
        assert all(c.job(h)["state"] != "INACTIVE" for h in held)
        # One bit per element as soon as it is queued would be 5 x 12.5 MB; nothing has ended yet.
        assert _peak_mb(cluster.procs[0].pid) < before + 25
        c.cancel(held)


def test_an_array_wider_than_a_scheduling_pass_starts_each_element_once(tmp_path) -> None:
    """More free cores than one pass starts tasks (broker/service.py PASS_STARTS): the array goes out over several
    passes, each after a turn of rank 0's event loop, and every element runs once."""
    from broker.service import PASS_STARTS
    cores = 6000
    assert 2 * cores > 2 * PASS_STARTS, "the first pass alone could start every element"
    with LocalCluster(tmp_path, size=2, test_exec=True, resources=f"cores={cores}") as cluster, \
            cluster.client() as c:
        array = c.submit(job(["true"], array=f"0-{2 * cores + 999}"))
        assert wait_for(c, array)["status"] == 0
        counts = c.job(array)["counts"]
        assert counts == {"pending": 0, "running": 0, "succeeded": 2 * cores + 1000, "failed": 0, "cancelled": 0}
