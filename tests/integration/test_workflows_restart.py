"""Workflows interrupted by a broker kill -9 (architecture.md#restart, protocol.md §3.9): dependencies, holds,
begin times, retries and success policies carry on after the restart, every index's attempts are recorded exactly
once, and event logs stay gapless."""
from __future__ import annotations

import itertools
import time
from collections import Counter

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for

# Indexes divisible by 5 fail their first attempt; every index takes a moment, so the kill finds some running.
FLAKY = "sleep 0.4; if [ $(( {cc} % 5 )) = 0 ] && [ $MC_TASK_ATTEMPT = 0 ]; then exit 1; fi"


def attempts_by_index(c: Client, job_id: int) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = {}
    for row in c.attempts(job_id, limit=100_000):
        out.setdefault(row[1], []).append((row[2], row[10]))
    return out


def assert_gapless(c: Client, job_id: int) -> list[str]:
    log = list(c.eventlog(job_id))
    assert [e[0] for e in log] == list(range(len(log))), f"job {job_id}: seq has gaps"
    assert [e[1] for e in log] == sorted(e[1] for e in log), f"job {job_id}: times out of order"
    return [e[2] for e in log]


@pytest.mark.long
def test_workflows_survive_a_broker_kill9(tmp_path) -> None:
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=3", reattach_timeout=5.0) as cluster:
        with cluster.client() as c:
            c.drain([0], "keep tasks off the broker's node, so they outlive its kill")
            pre = c.submit(job(["sleep", "0.5"], name="pre"))
            sims = c.submit(job(["sh", "-c", FLAKY], array="0-39", max_retries_per_index=2, max_failed_indexes=3,
                                dependencies=[{"type": "afterok", "jobs": [pre]}]))
            post = c.submit(job(["true"], array="0-39",
                                dependencies=[{"type": "aftercorr", "jobs": [sims]}]))
            reduce = c.submit(job(["true"], name="reduce", dependencies=[{"type": "afterok", "jobs": [post]}]))
            held = c.submit(job(["true"], hold=True, dependencies=[{"type": "afterany", "jobs": [pre]}]))
            later = c.submit(job(["true"], begin_time=time.time() + 4))
            plain = c.submit(job(["sh", "-c", "sleep 0.3; [ $MC_TASK_ATTEMPT -ge 2 ]"], retries=3))
            driver = c.submit(job(["sh", "-c", "[ {cc} = 0 ] && sleep 3 && exit 0; sleep 60"], array="0-3",
                                  success_indexes="0"))
            solo = [c.submit(job(["sleep", "0.5"], name="solo", dependencies=[{"type": "singleton", "jobs": []}]))
                    for _ in range(3)]
            # Kill once some retries of the array are recorded and elements are running.
            deadline = time.time() + 60
            while time.time() < deadline:
                summary = c.job(sims)
                if summary["retries"] >= 2 and summary["counts"]["running"] > 0:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"the array never got going: {c.job(sims)}")
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            assert c.job(held)["held"] and c.job(held)["state"] == "DEPEND"
            assert c.job(later)["state"] in ("DEPEND", "INACTIVE")
            c.release([held])
            for job_id in (pre, sims, post, reduce, held, later, plain, driver, *solo):
                assert wait_for(c, job_id, timeout=90)["status"] == 0, c.job(job_id)
            assert c.job(later)["t_run"] >= c.job(later)["t_submit"] + 4

            history = attempts_by_index(c, sims)
            assert sorted(history) == list(range(40))
            for index, attempts in history.items():
                expected = [(0, "retry"), (1, "final")] if index % 5 == 0 else [(0, "final")]
                assert attempts == expected, f"index {index}: {attempts}"
            assert c.job(sims)["retries"] == 8 and c.job(sims)["counts"]["succeeded"] == 40
            assert len(c.task_results(sims)) == 40
            # aftercorr: each index of post ran after its counterpart's final attempt ended.
            ended = {r[1]: r[9] for r in c.attempts(sims, limit=1000) if r[10] == "final"}
            started = {r[1]: r[8] for r in c.attempts(post, limit=1000)}
            assert sorted(started) == list(range(40))
            assert all(started[i] >= ended[i] for i in range(40))
            assert [r[2] for r in c.attempts(plain)] == [0, 1, 2]
            assert c.job(driver)["counts"]["succeeded"] == 1
            runs = sorted((c.job(j)["t_run"], c.job(j)["t_inactive"]) for j in solo)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs)), "singletons overlapped"
            for job_id in (pre, sims, post, reduce, held, later, plain, driver, *solo):
                names = assert_gapless(c, job_id)
                removed = [e[3]["description"] for e in c.eventlog(job_id) if e[2] == "dependency-remove"]
                assert len(removed) == len(set(removed)), f"job {job_id}: {removed}"
                assert Counter(names)["clean"] == 1
            assert c.status()["epoch"] == 2
