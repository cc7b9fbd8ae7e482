"""Job lifecycle on a real 4-rank cluster: states, event order, output, exit codes, cancel, time limits,
affinity and environment."""
from __future__ import annotations

import itertools
import json
import sqlite3
import sys
import threading
import time

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import event_names, job, output_of, wait_for
from worker.memlimit import MemoryLimits


def test_event_log_is_ordered_and_complete(client4: Client) -> None:
    job_id = client4.submit(job(["true"]))
    result = wait_for(client4, job_id)
    assert result["status"] == 0 and result["state"] == "INACTIVE"
    events = list(client4.eventlog(job_id))
    assert [e[0] for e in events] == list(range(len(events)))
    assert [e[2] for e in events] == ["submit", "depend", "priority", "alloc", "start", "finish", "release", "clean"]
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(events))


def test_eventlog_follow_from_middle_sees_no_gap(client4: Client) -> None:
    job_id = client4.submit(job(["sleep", "0.5"]))
    seen = [e[0] for e in client4.eventlog(job_id, from_=2, follow=True)]
    assert seen == list(range(2, len(seen) + 2))
    assert event_names(client4, job_id)[-1] == "clean"


@pytest.mark.smoke
def test_tasks_span_nodes_and_get_their_environment(client4: Client) -> None:
    names = "('MC_JOB_ID','MC_TASK_RANK','MC_TASK_COUNT','MC_NODE_RANK')"
    code = f"import os,json;print(json.dumps({{k:os.environ[k] for k in {names}}}))"
    job_id = client4.submit(job([sys.executable, "-c", code], nnodes=4, ntasks=8, mpi="none"))
    assert wait_for(client4, job_id)["status"] == 0
    envs = [json.loads(v) for _, v in sorted(output_of(client4, job_id).items())]
    assert [e["MC_TASK_RANK"] for e in envs] == [str(i) for i in range(8)]
    assert {e["MC_TASK_COUNT"] for e in envs} == {"8"} and {e["MC_JOB_ID"] for e in envs} == {str(job_id)}
    assert sorted(int(e["MC_NODE_RANK"]) for e in envs) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert client4.job(job_id)["ranks"] == "0-3"


def test_stdout_and_stderr_are_kept_apart(client4: Client) -> None:
    job_id = client4.submit(job(["sh", "-c", "echo out; echo err >&2"]))
    wait_for(client4, job_id)
    chunks = list(client4.output(job_id))
    assert b"".join(d for _, s, d in chunks if s == 1) == b"out\n"
    assert b"".join(d for _, s, d in chunks if s == 2) == b"err\n"


def test_job_status_is_the_largest_task_status(client4: Client) -> None:
    job_id = client4.submit(job(["sh", "-c", 'exit $((MC_TASK_RANK + 3))'], ntasks=3, mpi="none"))
    assert wait_for(client4, job_id)["status"] == 5
    statuses = sorted(row[3] for row in client4.task_results(job_id))
    assert statuses == [3, 4, 5]


def test_killed_by_signal_is_128_plus_signal(client4: Client) -> None:
    job_id = client4.submit(job(["sh", "-c", "kill -USR1 $$"]))
    assert wait_for(client4, job_id)["status"] == 128 + 10
    (row,) = client4.task_results(job_id)
    assert row[5] == 10 and row[4] is None


def test_command_not_found_is_reported(client4: Client) -> None:
    job_id = client4.submit(job(["no-such-command-xyz"]))
    assert wait_for(client4, job_id)["status"] == 127
    (row,) = client4.task_results(job_id)
    assert "no-such-command-xyz" in row[6]


@pytest.mark.smoke
def test_cancel_running_job(client4: Client) -> None:
    job_id = client4.submit(job(["sleep", "60"]))
    names = client4.eventlog(job_id, follow=True)
    for e in names:
        if e[2] == "start":
            break
    assert client4.cancel([job_id]) == ([job_id], {})
    result = wait_for(client4, job_id)
    assert result["exception"] == "cancel" and result["status"] == 143
    assert client4.cancel([job_id])[1][job_id].endswith("already ended")


def test_the_tests_wait_for_enforces_its_timeout(client4: Client) -> None:
    """wait_for(timeout=) once waited for ever: a stuck job hung its test until pytest-timeout's thread dump."""
    job_id = client4.submit(job(["sleep", "60"]))
    try:
        with pytest.raises(AssertionError, match=rf"job {job_id} not inactive within 0.5s: .*'state': '"):
            wait_for(client4, job_id, timeout=0.5)
        assert client4.job(job_id)["state"] in ("SCHED", "RUN"), "the client goes on after the timeout"
    finally:
        client4.cancel([job_id])
    assert wait_for(client4, job_id)["exception"] == "cancel"


def test_cancel_pending_job_and_unknown_job(client4: Client) -> None:
    blocker = client4.submit(job(["sleep", "30"], nnodes=4, ntasks=8, mpi="none"))
    queued = client4.submit(job(["true"], nnodes=4, ntasks=8, mpi="none"))
    cancelled, errors = client4.cancel([queued, 999_999])
    assert cancelled == [queued] and "does not exist" in errors[999_999]
    assert wait_for(client4, queued)["exception"] == "cancel"
    assert "start" not in event_names(client4, queued)
    client4.cancel([blocker])
    wait_for(client4, blocker)


def test_time_limit_ends_the_job(client4: Client) -> None:
    job_id = client4.submit(job(["sleep", "60"], time_limit=0.5, ntasks=2, mpi="none"))
    result = wait_for(client4, job_id)
    assert result["exception"] == "timeout" and result["status"] == 143
    context = next(e[3] for e in client4.eventlog(job_id) if e[2] == "exception")
    assert context["type"] == "timeout" and "0.5" in context["note"]


def test_tasks_are_bound_to_distinct_allocated_cores(client4: Client) -> None:
    code = "import os,time;print(sorted(os.sched_getaffinity(0)));time.sleep(0.5)"
    job_id = client4.submit(job([sys.executable, "-c", code], nnodes=1, ntasks=2, mpi="none"))
    assert wait_for(client4, job_id)["status"] == 0
    cores = [json.loads(v) for v in output_of(client4, job_id).values()]
    assert sorted(c for group in cores for c in group) == [0, 1]


def test_plain_multi_task_job_runs_on_after_a_failure_and_takes_the_largest_status(client4: Client) -> None:
    # No --mpi and no PMI used: independent tasks, as under srun.
    script = 'echo "$MC_TASK_RANK starts"; [ "$MC_TASK_RANK" = 1 ] && exit 7; sleep 0.5; exit $MC_TASK_RANK'
    job_id = client4.submit(job(["sh", "-c", script], ntasks=4, nnodes=2))
    result = wait_for(client4, job_id)
    assert result["exception"] is None and result["status"] == 7
    assert sorted(row[3] for row in client4.task_results(job_id)) == [0, 2, 3, 7]
    summary = client4.job(job_id)
    assert summary["counts"]["failed"] == 3 and summary["counts"]["succeeded"] == 1


def test_gang_ends_with_the_status_of_the_task_that_failed(client4: Client) -> None:
    script = '[ "$MC_TASK_RANK" = 1 ] && { sleep 0.3; exit 7; }; sleep 30'
    job_id = client4.submit(job(["sh", "-c", script], ntasks=4, nnodes=2, mpi="pmi1"))
    result = wait_for(client4, job_id)
    # Not 143, the status of the siblings the failure killed.
    assert result["exception"] == "abort" and result["status"] == 7
    note = next(e[3] for e in client4.eventlog(job_id) if e[2] == "exception")
    assert note["note"] == "task 1 on rank 0 exited with status 7" and note["status"] == 7
    assert sorted(row[3] for row in client4.task_results(job_id)) == [7, 143, 143, 143]
    assert client4.job(job_id)["reason"] == "task 1 on rank 0 exited with status 7"


@pytest.mark.smoke
def test_invalid_and_infeasible_jobspecs_are_refused(client4: Client) -> None:
    with pytest.raises(ClientError) as info:
        client4.call("submit", jobspec=job(["true"], nnodes=9, ntasks=9))
    assert info.value.code == "infeasible" and "needs 9 nodes, the MiniCluster has 4" in str(info.value)
    with pytest.raises(ClientError) as info:
        client4.call("submit", jobspec=job(["true"], cores_per_task=3))
    assert info.value.code == "infeasible"
    with pytest.raises(ClientError) as info:
        client4.call("submit", jobspec={"argv": "true"})
    assert info.value.code == "invalid-jobspec" and "argv" in str(info.value)


def test_output_file_option(client4: Client, tmp_path) -> None:
    target = tmp_path / "out-{id}-{task}.txt"
    job_id = client4.submit(job(["echo", "hello"], output=str(target)))
    wait_for(client4, job_id)
    assert (tmp_path / f"out-{job_id}-0.txt").read_text() == "hello\n"
    assert list(client4.output(job_id)) == []


def test_output_cap_truncates_and_records_it(tmp_path) -> None:
    from minicluster.testing import LocalCluster

    with LocalCluster(tmp_path, size=1, output_cap=1000) as cluster, cluster.client() as c:
        job_id = c.submit(job(["sh", "-c", "head -c 5000 /dev/zero"]))
        wait_for(c, job_id)
        assert sum(len(d) for _, _, d in c.output(job_id)) == 1000
        assert "output-truncated" in event_names(c, job_id)


def test_wait_from_many_threads(cluster4) -> None:
    results: list[object] = []

    def one() -> None:
        try:
            with cluster4.client() as c:
                results.append(wait_for(c, c.submit(job(["true"])))["status"])
        except Exception as exc:  # collected so the assert shows it
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0] * 8


def test_inactive_jobs_are_purged_by_count(tmp_path) -> None:
    from minicluster.testing import LocalCluster

    with LocalCluster(tmp_path, size=1, purge_max_count=3) as cluster, cluster.client() as c:
        ids = [c.submit(job(["true"])) for _ in range(6)]
        for result in c.wait(ids):
            assert result["status"] == 0
        deadline = time.time() + 10
        while len(c.jobs(all=True)) > 3 and time.time() < deadline:
            time.sleep(0.1)
        assert [j["id"] for j in c.jobs(all=True)] == ids[:2:-1]
        with pytest.raises(ClientError) as info:
            c.job(ids[0])
        assert info.value.code == "not-found"
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM events WHERE job=?", (ids[0],)).fetchone() == (0,)


def test_stdin_written_before_the_start_waits_and_a_vanished_writer_means_eof(client4: Client,
                                                                              cluster4: LocalCluster) -> None:
    blocker = client4.submit(job(["sleep", "1"], nnodes=4, ntasks=8, mpi="none"))
    reader = client4.submit(job(["sh", "-c", "cat; echo end"], stdin="0"))
    assert client4.job(reader)["state"] == "SCHED"
    with cluster4.client() as writer:
        assert writer.stdin(reader, b"early\n") is True  # answered once the task started and got it
        assert client4.job(blocker)["state"] == "INACTIVE"
    # The writer's connection closed without eof: the task reads end-of-file instead of waiting forever.
    assert wait_for(client4, reader)["status"] == 0
    assert output_of(client4, reader) == {0: b"early\nend\n"}
    assert client4.stdin(reader, b"late") is False


def test_stdin_is_the_owners_and_only_for_jobs_that_asked(client4: Client) -> None:
    plain = client4.submit(job(["sleep", "5"]))
    with pytest.raises(ClientError) as info:
        client4.stdin(plain, b"x")
    assert info.value.code == "bad-request" and "not submitted with stdin" in info.value.message
    with pytest.raises(ClientError) as info:
        client4.call("stdin", job=plain, data=b"x" * (1 << 20 | 1))
    assert info.value.code == "bad-request"
    with pytest.raises(ClientError) as info:
        client4.submit(job(["cat"], stdin="3"))
    assert info.value.code == "invalid-jobspec" and "stdin: task 3 does not exist" in info.value.message
    client4.cancel([plain])


@pytest.mark.skipif(MemoryLimits.detect() is None, reason="no writable cgroup v1 memory controller here")
def test_mem_is_a_limit_where_cgroups_allow(client4: Client) -> None:
    grab = "import sys; x = bytearray(int(sys.argv[1]) << 20); x[::4096] = b'1' * len(x[::4096]); print('ok')"
    over = client4.submit(job([sys.executable, "-c", grab, "300"], mem_per_task=64))
    result = wait_for(client4, over)
    assert result["status"] == 137
    assert client4.job(over)["reason"].endswith("out of memory: exceeded --mem 64 MiB")
    within = client4.submit(job([sys.executable, "-c", grab, "16"], mem_per_task=256))
    assert wait_for(client4, within)["status"] == 0 and output_of(client4, within) == {0: b"ok\n"}
    limits = MemoryLimits.detect()
    assert limits is not None
    deadline = time.time() + 10
    while list(limits.parent.glob(f"mc-*-{over}-0")) and time.time() < deadline:
        time.sleep(0.1)
    assert not list(limits.parent.glob(f"mc-*-{over}-0")), "the task's memory cgroup was left behind"
