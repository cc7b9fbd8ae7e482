"""Workflows end to end on a real local MiniCluster (protocol.md §3.9): a DAG with every dependency type,
refusals at submit, arrays with retries, failure and success policies, plain jobs retried and judged by rules,
holds, updates and requeues."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import event_names, job, output_of, started, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("flow"), size=3, fanout=2, resources="cores=2") as c:
        yield c


def events(c: Client, job_id: int, name: str) -> list[dict]:
    return [e[3] for e in c.eventlog(job_id) if e[2] == name]


def test_dag_with_every_dependency_type(client: Client) -> None:
    gate = client.submit(job(["sleep", "3"], hold=True))      # released once the waiting is looked at
    ok = client.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [gate]}]))
    bad = client.submit(job(["false"], dependencies=[{"type": "afterok", "jobs": [gate]}]))
    after_start = client.submit(job(["true"], dependencies=[{"type": "afterstart", "jobs": [gate]}]))
    any_ = client.submit(job(["true"], dependencies=[{"type": "afterany", "jobs": [bad, ok]}]))
    notok = client.submit(job(["true"], dependencies=[{"type": "afternotok", "jobs": [bad]}]))
    never = client.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [bad]}]))
    never_notok = client.submit(job(["true"], dependencies=[{"type": "afternotok", "jobs": [ok]}]))
    fan_in = client.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [ok, after_start, any_, notok]}]))
    assert client.job(ok)["state"] == "DEPEND" and client.job(ok)["waiting"] == [f"afterok:{gate}"]
    assert client.job(fan_in)["waiting"] == [f"afterok:{j}" for j in (ok, after_start, any_, notok)]
    client.release([gate])
    started(client, gate)
    assert wait_for(client, after_start)["status"] == 0
    assert client.job(gate)["state"] == "RUN"               # afterstart did not wait for the end
    for job_id in (ok, any_, notok, fan_in):
        assert wait_for(client, job_id) == {"job": job_id, "status": 0, "state": "INACTIVE", "exception": None}
    for job_id, why in ((never, f"afterok:{bad} can never be satisfied: job {bad} failed (status 1)"),
                        (never_notok, f"afternotok:{ok} can never be satisfied: job {ok} succeeded")):
        result = wait_for(client, job_id)
        assert result["exception"] == "dependency" and result["status"] != 0
        assert events(client, job_id, "exception")[0]["note"] == why
        assert "alloc" not in event_names(client, job_id)
    names = event_names(client, fan_in)
    assert names[:6] == ["submit"] + ["dependency-add"] * 4 + ["dependency-remove"]
    assert names.count("dependency-remove") == 4 and names.index("depend") == 9
    # Dependencies on ended jobs are judged at once.
    late = client.submit(job(["true"], dependencies=[{"type": "afterok", "jobs": [ok]}]))
    assert wait_for(client, late)["status"] == 0


def test_refused_at_submit(client: Client) -> None:
    known = client.submit(job(["true"]))
    for deps, message in [
        ([{"type": "afterok", "jobs": [999_999]}], "job 999999 does not exist"),
        ([{"type": "afterok", "jobs": [known + 1]}], "cannot depend on itself"),
        ([{"type": "aftercorr", "jobs": [known]}], "aftercorr:.* is not an array"),
    ]:
        spec = job(["true"], dependencies=deps, **({"array": "0-1"} if "aftercorr" in message else {}))
        with pytest.raises(ClientError, match=message) as err:
            client.submit(spec)
        assert err.value.code == "invalid-jobspec"
    array = client.submit(job(["true"], array="0-3"))
    with pytest.raises(ClientError, match=r"indexes 4-5 have no counterpart"):
        client.submit(job(["true"], array="0-5", dependencies=[{"type": "aftercorr", "jobs": [array]}]))


def test_aftercorr_runs_each_index_after_its_counterpart(client: Client) -> None:
    first = client.submit(job(["sh", "-c", "sleep 0.{cc}; [ {cc} -ne 2 ]"], array="0-4"))
    second = client.submit(job(["sh", "-c", "echo second {cc}"], array="0-4",
                               dependencies=[{"type": "aftercorr", "jobs": [first]}]))
    result = wait_for(client, second)
    assert result["status"] == 1 and result["exception"] is None
    counts = client.job(second)["counts"]
    assert counts["succeeded"] == 4 and counts["cancelled"] == 1
    assert sorted(client.task_results(second), key=lambda r: r[1])[0][1] == 0
    assert {r[1] for r in client.task_results(second)} == {0, 1, 3, 4}
    note = [e["note"] for e in events(client, second, "exception")]
    assert note == [f"indexes 2 can never run: their counterparts in job {first} did not succeed"]
    assert events(client, second, "dependency-remove") == [{"description": f"aftercorr:{first}"}]


def test_singleton_and_begin_time(client: Client) -> None:
    one = client.submit(job(["sleep", "0.6"], name="only-one", hold=True,
                            dependencies=[{"type": "singleton", "jobs": []}]))
    two = client.submit(job(["true"], name="only-one", dependencies=[{"type": "singleton", "jobs": []}]))
    assert client.job(two)["waiting"] == ["singleton"]       # `one`, held, is active
    client.release([one])
    wait_for(client, two)
    assert client.job(two)["t_run"] >= client.job(one)["t_inactive"]
    t0 = time.time()
    later = client.submit(job(["true"], begin_time=t0 + 2.0))
    assert client.job(later)["waiting"][0].startswith("begin-time ")
    wait_for(client, later)
    assert client.job(later)["t_run"] >= t0 + 2.0


def test_array_retries_fail_fast_and_failed_indexes(client: Client) -> None:
    # Index 3 is flaky (fails its first attempt), index 5 has bad input (exit 2: no retry), 7 always fails.
    flaky = ("if [ {cc} = 3 ] && [ $MC_TASK_ATTEMPT = 0 ]; then exit 1; fi; "
             "[ {cc} != 5 ] || exit 2; [ {cc} != 7 ] || exit 1; echo ok {cc} $MC_TASK_ATTEMPT")
    array = client.submit(job(["sh", "-c", flaky], array="0-9", max_retries_per_index=2,
                              on_exit=[["2", "fail"]], retry_delay=0.1))
    result = wait_for(client, array)
    assert result["status"] == 2 and result["exception"] is None
    summary = client.job(array)
    assert summary["failed"] == "5,7" and summary["retries"] == 3
    assert summary["counts"] == {"pending": 0, "running": 0, "succeeded": 8, "failed": 2, "cancelled": 0}
    attempts = client.attempts(array)
    by_index: dict[int, list[str]] = {}
    for row in attempts:
        by_index.setdefault(row[1], []).append(row[10])
    assert by_index[3] == ["retry", "final"] and by_index[5] == ["final"]
    assert by_index[7] == ["retry", "retry", "final"] and by_index[0] == ["final"]
    assert [(r[1], r[7]) for r in client.task_results(array) if r[1] in (3, 7)] == [(3, 1), (7, 2)]
    assert [(r[1], r[2]) for r in client.attempts(array, index=3)] == [(3, 0), (3, 1)]
    out = b"".join(d for _, s, d in client.output(array, index=3, attempt=1) if s == 1)
    assert out == b"ok 3 1\n"
    assert list(client.output(array, index=3, attempt=0)) == []
    retry_events = events(client, array, "retry")
    assert sum(len(e["indexes"].split(",")) for e in retry_events) >= 2


def test_max_failed_indexes_cancels_the_rest(client: Client) -> None:
    array = client.submit(job(["sh", "-c", "[ {cc} -ge 2 ] || exit 3; sleep 20"], array="0-19",
                              max_failed_indexes=1, max_retries_per_index=0))
    result = wait_for(client, array)
    assert result["exception"] == "max-failed-indexes" and result["status"] != 0
    counts = client.job(array)["counts"]
    assert counts["failed"] == 2 and counts["succeeded"] == 0 and counts["cancelled"] == 18
    assert "2 indexes failed for good, more than 1" in events(client, array, "exception")[0]["note"]


def test_fail_job_rule_ends_the_array_at_once(client: Client) -> None:
    array = client.submit(job(["sh", "-c", "[ {cc} != 1 ] || exit 42; sleep 20"], array="0-5",
                              max_retries_per_index=3, on_exit=[["42", "fail-job"]]))
    result = wait_for(client, array)
    assert result["exception"] == "failure-policy"
    assert events(client, array, "exception")[0]["note"] == "index 1: exit 42 matches a fail-job rule"
    assert client.job(array)["retries"] == 0


def test_success_policies(client: Client) -> None:
    # The driver index 0 succeeds: the array succeeds, whatever the others did, and the rest is cancelled.
    driver = client.submit(job(["sh", "-c", "[ {cc} = 0 ] && exit 0; [ {cc} = 1 ] && exit 1; sleep 20"],
                               array="0-5", success_indexes="0"))
    result = wait_for(client, driver)
    assert result == {"job": driver, "status": 0, "state": "INACTIVE", "exception": None}
    counts = client.job(driver)["counts"]
    assert counts["succeeded"] >= 1 and counts["cancelled"] >= 4 and counts["running"] == 0
    assert events(client, driver, "success") == [{"note": "success_indexes 0 met"}]
    enough = client.submit(job(["sh", "-c", "[ {cc} -lt 3 ] || sleep 20"], array="0-7", success_count=3))
    assert wait_for(client, enough)["status"] == 0
    assert client.job(enough)["counts"]["succeeded"] == 3
    # Multi-task: task 0 decides; the others are stopped.
    gang = client.submit(job(["sh", "-c", "[ $MC_TASK_RANK = 0 ] && exit 0; [ $MC_TASK_RANK = 1 ] && exit 5; "
                                          "sleep 20"], ntasks=3, mpi="none", success_task=0))
    assert wait_for(client, gang)["status"] == 0
    failing_driver = client.submit(job(["sh", "-c", "[ $MC_TASK_RANK = 0 ] && exit 4; sleep 20"], ntasks=2,
                                       mpi="none", success_task=0))
    assert wait_for(client, failing_driver)["status"] == 4


def test_plain_job_retries_with_backoff_and_rules(client: Client) -> None:
    job_id = client.submit(job(["sh", "-c", "echo attempt $MC_TASK_ATTEMPT; [ $MC_TASK_ATTEMPT = 2 ]"],
                               retries=5, retry_delay=0.2))
    assert wait_for(client, job_id)["status"] == 0
    retries = events(client, job_id, "retry")
    assert [(r["attempt"], r["status"], r["delay"]) for r in retries] == [(1, 1, 0.2), (2, 1, 0.4)]
    times = {e[2] + str(i): e[1] for i, e in enumerate(client.eventlog(job_id))}
    assert [r[2] for r in client.attempts(job_id)] == [0, 1, 2]
    assert client.task_results(job_id)[0][7] == 2
    assert b"".join(d for _, _, d in client.output(job_id, attempt=1)) == b"attempt 1\n"
    assert output_of(client, job_id)[0] == b"attempt 0\nattempt 1\nattempt 2\n"
    starts = [t for name, t in times.items() if name.startswith("start")]
    assert starts[2] - starts[1] >= 0.4
    bad_input = client.submit(job(["sh", "-c", "exit 2"], retries=5, on_exit=[["2", "fail"]]))
    assert wait_for(client, bad_input)["status"] == 2 and events(client, bad_input, "retry") == []
    ignored = client.submit(job(["sh", "-c", "exit 9"], on_exit=[["9", "ignore"]]))
    assert wait_for(client, ignored)["status"] == 0
    exhausted = client.submit(job(["false"], retries=1))
    assert wait_for(client, exhausted)["status"] == 1 and len(events(client, exhausted, "retry")) == 1
    by_signal = client.submit(job(["sh", "-c", "[ $MC_TASK_ATTEMPT = 1 ] || kill -9 $$"], retries=2,
                                  on_signal=[["9", "retry"]]))
    assert wait_for(client, by_signal)["status"] == 0


def test_hold_release_update(client: Client) -> None:
    held = client.submit(job(["true"], hold=True))
    assert client.job(held)["held"] and event_names(client, held) == ["submit", "hold"]
    # A job submitted after it runs to its end: the held one had every chance to move on, and did not.
    assert wait_for(client, client.submit(job(["true"])))["status"] == 0
    assert client.job(held)["state"] == "DEPEND"
    assert client.update(held, urgency=30, name="renamed", time_limit=60) == {
        "urgency": 30, "name": "renamed", "time_limit": 60}
    summary = client.job(held)
    assert (summary["urgency"], summary["name"]) == (30, "renamed")
    assert client.release([held]) == ([held], {})
    assert wait_for(client, held)["status"] == 0
    _, errors = client.release([held])
    assert "not held" in errors[held] or "ended" in errors[held]
    with pytest.raises(ClientError, match="has already ended") as err:
        client.update(held, urgency=1)
    assert err.value.code == "bad-state"
    running = client.submit(job(["sleep", "30"]))
    started(client, running)
    with pytest.raises(ClientError, match="urgency orders only work not yet started"):
        client.update(running, urgency=3)
    with pytest.raises(ClientError, match="cannot be updated"):
        client.update(running, argv=["x"])
    with pytest.raises(ClientError, match=r"urgency: must be 0\.\.31|urgency"):
        client.update(running, urgency=99)
    _, errors = client.hold([running])
    assert "nothing left to start" in errors[running]
    client.update(running, time_limit=1)                     # applies to the running task
    assert wait_for(client, running)["exception"] == "timeout"
    # An array holds its unstarted indexes; the running ones go on.
    array = client.submit(job(["sleep", "0.5"], array="0-11"))
    started(client, array)
    assert client.hold([array]) == ([array], {})
    deadline = time.time() + 30
    while client.job(array)["counts"]["running"] and time.time() < deadline:
        time.sleep(0.1)                                        # the running indexes go on and end
    # A job submitted after them runs to its end: the freed cores went to it, not to a held index.
    assert wait_for(client, client.submit(job(["true"])))["status"] == 0
    counts = client.job(array)["counts"]
    assert counts["running"] == 0 and counts["pending"] > 0   # and none of the held ones started
    client.release([array])
    assert wait_for(client, array)["status"] == 0 and client.job(array)["counts"]["succeeded"] == 12


def test_requeue_a_running_job(client: Client) -> None:
    job_id = client.submit(job(["sh", "-c", "echo run $MC_TASK_ATTEMPT; [ $MC_TASK_ATTEMPT = 1 ] || sleep 30"]))
    started(client, job_id)
    assert client.requeue([job_id]) == ([job_id], {})        # returns once the job is queued again
    assert "requeue" in event_names(client, job_id)            # durable before the answer
    assert wait_for(client, job_id)["status"] == 0
    (requeue,) = events(client, job_id, "requeue")
    assert requeue["attempt"] == 1 and requeue["reason"].startswith("requested by uid")
    assert [r[10] for r in client.attempts(job_id)] == ["requeue", "final"]
    assert client.job(job_id)["retries"] == 0
    _, errors = client.requeue([job_id])
    assert "is not running" in errors[job_id]


def test_a_broken_chain_ends_in_one_go(client: Client) -> None:
    """The head of a 500-job afterok chain fails: every link ends with `dependency`, none runs, and the cascade
    is applied iteratively (no recursion 500 calls deep)."""
    head = client.submit(job(["sh", "-c", "sleep 0.5; exit 3"]))
    chain = [head]
    specs = [job(["true"], dependencies=[{"type": "afterok", "jobs": [head + k]}]) for k in range(500)]
    chain += [i for i in client.submit_many(specs) if isinstance(i, int)]
    assert chain[1:] == list(range(head + 1, head + 501))
    results = {r["job"]: r for r in client.wait(chain)}
    assert results[head]["status"] == 3
    assert all(results[j]["exception"] == "dependency" for j in chain[1:])
    last = [e[3]["note"] for e in client.eventlog(chain[-1]) if e[2] == "exception"]
    assert last == [f"afterok:{chain[-2]} can never be satisfied: job {chain[-2]} ended with the exception "
                    "dependency"]
    assert all(client.job(j)["t_run"] is None for j in chain[1:])
