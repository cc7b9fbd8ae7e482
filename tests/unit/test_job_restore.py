"""A job's state and counters change only through `Job` (issue 27 item 2): a restart's paths included. A job is
rebuilt from its journal row (`restore_row`, broker/history.py), set back to NEW (`reset_for_replay`) and its
event log applied again (broker/recovery.py); the workflow's counting goes through named methods too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from broker.job import Event, State, TransitionError
from minicluster.testing import job

BROKER = Path(__file__).resolve().parents[2] / "broker"
# The fields that say where a job is and what it counted.
STATE_AND_COUNTERS = {"state", "running", "succeeded", "failed", "cancelled", "tasks_left", "retries", "oseq",
                      "output_bytes"}
# What broker/ calls a Job it holds (`job: Job`, `target: Job`).
JOB_NAMES = {"job", "target"}

LOG = [Event("submit", {}, 0, 1.0), Event("depend", {}, 1, 1.0), Event("priority", {}, 2, 1.0),
       Event("alloc", {"ranks": "0"}, 3, 2.0), Event("start", {}, 4, 2.5)]


def test_an_active_row_is_replayed_from_new_to_the_state_its_log_reaches() -> None:
    record = job()
    # The row was written when the job was queued; its log went on to `start` before the crash.
    record.restore_row(State.SCHED, None, None, None, None, 3, None)
    with pytest.raises(TransitionError, match="submit not allowed in state SCHED"):
        record.apply(LOG[0])  # why the replay starts from NEW
    record.reset_for_replay()
    for event in LOG:
        record.apply(event)
    assert (record.state, record.seq, record.t_run) == (State.RUN, 5, 2.5)


def test_an_inactive_row_is_retired_with_its_counts_and_retries() -> None:
    record = job(ntasks=3)
    record.restore_row(State.INACTIVE, 2.5, 9.0, 1, None, 8, [2, 1, 0, "task 2 on rank 0 exited with status 1", "0-1"],
                       retries=2)
    assert record.closed and record.spec is None and (record.tasks_left, record.retries) == (0, 2)
    summary = record.summary()
    assert (summary["state"], summary["status"], summary["ranks"]) == ("INACTIVE", 1, "0-1")
    assert summary["counts"] == {"pending": 0, "running": 0, "succeeded": 2, "failed": 1, "cancelled": 0}


def test_tasks_that_can_never_run_are_counted_cancelled_once() -> None:
    record = job(array="0-3")
    record.cancel_never_run([1, 2])
    record.cancel_never_run([2, 3])  # 2 is counted already
    assert (record.cancelled, record.tasks_left, record.status) == (3, 1, 1)


def test_output_goes_on_after_what_was_kept() -> None:
    record = job()
    record.restore_output(7, 100, 4096)
    assert (record.oseq, record.output_bytes) == (7, 100)
    record.apply(Event("output-truncated"))
    record.restore_output(9, 100, 4096)
    assert record.output_bytes == 4096, "truncated output counts as full"


def test_output_chunks_are_numbered_and_counted_up_to_the_cap() -> None:
    record = job()
    assert [record.next_output(10), record.next_output(5)] == [0, 1] and record.output_bytes == 15
    record.truncate_output(100)
    assert (record.output_bytes, record.truncated, record.next_output(0)) == (100, True, 2)


def test_running_tasks_are_counted_with_their_ranks() -> None:
    record = job(ntasks=2)
    record.task_started(3)
    record.task_started(1)
    record.task_stopped()
    assert (record.running, sorted(record.ranks)) == (1, [1, 3])


def _writes(source: str, where: str) -> list[str]:
    """`job.state = ...`, `target.failed -= 1` and the like in one module: where they are and what they write."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                if (isinstance(item, ast.Attribute) and item.attr in STATE_AND_COUNTERS
                        and isinstance(item.value, ast.Name) and item.value.id in JOB_NAMES):
                    found.append(f"{where}:{node.lineno} {item.value.id}.{item.attr}")
    return found


def test_only_job_writes_a_jobs_state_and_counters() -> None:
    modules = [p for p in BROKER.rglob("*.py") if p.name != "job.py"]
    assert len(modules) > 30
    assert [w for path in modules for w in _writes(path.read_text(), path.name)] == []


def test_the_check_finds_each_kind_of_write() -> None:
    source = "job.state = x\ntarget.failed -= 1\njob.t_run, job.retries = 1, 2\nusage.running += 1\njob.name = n\n"
    assert _writes(source, "m.py") == ["m.py:1 job.state", "m.py:2 target.failed", "m.py:3 job.retries"]
