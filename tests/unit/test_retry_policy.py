"""Failure and success policy decisions (broker/flow/retry.py) and their command-line forms."""
from __future__ import annotations

import pytest

from broker.flow.retry import (FAILED, FAILED_JOB, RETRIED, SUCCEEDED, Decision, Policy, SuccessTracker, decide,
                          strongest)
from minicluster.model.idset import IdSet
from minicluster.model.jobspec import InvalidJobspec, from_wire
from minicluster.model.workflow import (WorkflowError, parse_begin_time, parse_dependencies, parse_exit_rules,
                                        parse_signal_rules)


def policy(**fields) -> Policy:
    spec = {"argv": ["x"], **fields}
    return Policy.of(from_wire(spec))


def test_rules_first_match_wins_and_defaults() -> None:
    p = policy(on_exit=[["42", "fail-job"], ["3-5", "retry"], ["0", "ignore"], ["4", "fail"]],
               on_signal=[["9", "retry"], ["15", "ignore"]], retries=2)
    assert p.action(42, 42, None) == "fail-job"
    assert p.action(4, 4, None) == "retry"               # 3-5 comes before 4=fail
    assert p.action(0, 0, None) == "ignore"
    assert p.action(7, 7, None) == "retry"               # no rule: non-zero is retry
    assert p.action(137, None, 9) == "retry"
    assert p.action(143, None, 15) == "ignore"
    assert p.action(139, None, 11) == "retry"            # a signal no rule names
    assert p.action(137, 137, None) == "retry"           # exit 137 is an exit, not SIGKILL
    assert p.action(127, None, None) == "retry"          # could not start: judged by its status
    assert policy().action(0, 0, None) == "success"


def test_retry_budget_per_index_and_per_job() -> None:
    per_index = policy(array="0-9", max_retries_per_index=2)
    assert per_index.can_retry(0, 1000) and per_index.can_retry(1, 1000) and not per_index.can_retry(2, 0)
    total = policy(array="0-9", retries=3)
    assert total.can_retry(50, 2) and not total.can_retry(0, 3)
    both = policy(array="0-9", retries=3, max_retries_per_index=1)
    assert both.can_retry(0, 2) and not both.can_retry(1, 0) and not both.can_retry(0, 3)
    assert not policy(on_exit=[["1", "fail"]]).can_retry(0, 0)


def test_decide_maps_actions_to_outcomes() -> None:
    p = policy(retries=2, retry_delay=10)
    assert decide(p, "success", 0, 0) == Decision(SUCCEEDED)
    assert decide(p, "ignore", 0, 0) == Decision(SUCCEEDED)
    assert decide(p, "retry", 0, 0) == Decision(RETRIED, 10.0)
    assert decide(p, "retry", 1, 1) == Decision(RETRIED, 20.0)
    assert decide(p, "retry", 2, 2) == Decision(FAILED)
    assert decide(p, "fail", 0, 0) == Decision(FAILED)
    assert decide(p, "fail-job", 0, 0) == Decision(FAILED_JOB)


def test_backoff_doubles_and_is_capped() -> None:
    assert [policy(retries=99, retry_delay=1).delay(k) for k in (1, 2, 3, 11, 13, 500)] == [
        1, 2, 4, 1024, 3600, 3600]
    assert policy(retries=1, retry_delay=7200).delay(3) == 7200      # a delay beyond the cap is its own cap
    assert policy(retries=5).delay(4) == 0.0


def test_strongest_action_decides_a_plain_job() -> None:
    assert strongest([]) == "success"
    assert strongest(["success", "ignore"]) == "ignore"
    assert strongest(["ignore", "retry", "success"]) == "retry"
    assert strongest(["retry", "fail"]) == "fail"
    assert strongest(["fail", "fail-job", "retry"]) == "fail-job"


@pytest.mark.parametrize("indexes, count, events, met_at", [
    ("0", None, [3, 1, 0, 2], 2),            # the driver index
    ("0-2", None, [2, 9, 0, 1], 3),          # all of them
    (None, 3, [7, 8, 1, 4], 2),              # any three
    ("0-9", 2, [11, 3, 12, 5], 3),           # two of 0-9
])
def test_success_tracker(indexes, count, events, met_at) -> None:
    tracker = SuccessTracker(IdSet.parse(indexes) if indexes else None, count)
    met = [tracker.succeeded(i) for i in events]
    assert met.index(True) == met_at and met.count(True) == 1


def test_jobspec_refuses_inconsistent_policies() -> None:
    ok = {"argv": ["x"]}
    for extra, message in [
        ({"max_retries_per_index": 1}, "only for arrays"),
        ({"on_exit": [["3", "retry"]]}, "retry rule needs retries"),
        ({"on_exit": [["300", "fail"]], "retries": 1}, "goes beyond 255"),
        ({"on_exit": [["3", "explode"]], "retries": 1}, "unknown action"),
        ({"on_signal": [["65", "retry"]], "retries": 1}, "goes beyond 64"),
        ({"array": "0-9", "success_indexes": "5-12"}, "10-12 not in the array"),
        ({"array": "0-9", "success_count": 11}, "more than the 10"),
        ({"success_task": 0}, "several tasks"),
        ({"ntasks": 2, "success_task": 2}, "not a task of 0..1"),
        ({"dependencies": [{"type": "aftercorr", "jobs": [1]}]}, "only for arrays"),
        ({"dependencies": [{"type": "afterok", "jobs": []}]}, "at least one job"),
        ({"dependencies": [{"type": "singleton", "jobs": [3]}]}, "no job ids"),
        ({"dependencies": [{"type": "before", "jobs": [3]}]}, "unknown type"),
        ({"dependencies": [{"type": "afterok", "jobs": [0]}]}, "positive job ids"),
        ({"retries": -1}, "retries: must be an integer from 0"),
        ({"retry_delay": 1e9, "retries": 1}, "retry_delay"),
        ({"retry_delay": 5}, "retry_delay: needs retries"),
        ({"hold": "yes"}, "hold: must be true or false"),
        ({"begin_time": "noon"}, "begin_time"),
    ]:
        with pytest.raises(InvalidJobspec, match=message):
            from_wire({**ok, **extra})


def test_workflow_fields_round_trip_and_are_omitted_when_unset() -> None:
    plain = from_wire({"argv": ["x"]}).to_wire()
    assert "retries" not in plain and "dependencies" not in plain and "hold" not in plain
    spec = from_wire({"argv": ["x"], "array": "0-99", "retries": 5, "max_retries_per_index": 1,
                      "max_failed_indexes": 3, "on_exit": [["2", "fail"]], "success_count": 10, "hold": True,
                      "dependencies": [{"type": "afterok", "jobs": [4, 5]}, {"type": "singleton", "jobs": []}]})
    assert from_wire(spec.to_wire()) == spec and spec.failure_policy and spec.workflow
    assert not from_wire({"argv": ["x"], "hold": True}).failure_policy


def test_command_line_forms() -> None:
    assert parse_dependencies(["afterok:1:2,afterany:3", "afterok:4", "singleton", "after:5"]) == [
        {"type": "afterok", "jobs": [1, 2, 4]}, {"type": "afterany", "jobs": [3]}, {"type": "singleton", "jobs": []},
        {"type": "afterstart", "jobs": [5]}]
    for bad in ("afterok", "afterok:x", "later:3", "singleton:3", "afterok:0"):
        with pytest.raises(WorkflowError):
            parse_dependencies([bad])
    assert parse_exit_rules("42=fail-job,3-5=retry,0=ignore") == [
        ["42", "fail-job"], ["3-5", "retry"], ["0", "ignore"]]
    assert parse_signal_rules("KILL=retry,SIGSEGV+ABRT=fail,15=ignore") == [
        ["9", "retry"], ["6,11", "fail"], ["15", "ignore"]]
    for bad in ("3-5", "3=explode", "256=fail"):
        with pytest.raises(WorkflowError):
            parse_exit_rules(bad)
    with pytest.raises(WorkflowError, match="unknown signal"):
        parse_signal_rules("BOGUS=retry")
    now = 1_700_000_000.0
    assert parse_begin_time("+10m", now) == now + 600
    assert parse_begin_time("@1700000500", now) == 1_700_000_500
    assert now < parse_begin_time("12:30", now) <= now + 86400
    with pytest.raises(WorkflowError):
        parse_begin_time("soonish", now)
