"""The dependency graph (broker/flow/depgraph.py): verdicts for every dependency type, singleton order, begin times,
cycles, and release costs proportional to the dependants."""
from __future__ import annotations

import pytest

from broker.flow.depgraph import DepGraph, DependencyError, TargetState, Verdict

PENDING = TargetState(started=False, ended=False)
RUNNING = TargetState(started=True, ended=False)
OK = TargetState(started=True, ended=True, ok=True, how="succeeded")
FAILED = TargetState(started=True, ended=True, ok=False, how="failed (status 1)")
CANCELLED_PENDING = TargetState(started=False, ended=True, ok=False, how="was cancelled")


def lookup_of(states: dict[int, TargetState]):
    return states.get


def add(graph: DepGraph, job: int, deps, states, **kw):
    graph.check(job, [t for _, t in deps], lookup_of(states))
    return graph.add(job, deps, lookup_of(states), **kw)


def release(graph: DepGraph, verdicts: list[Verdict]) -> list[int]:
    """Apply satisfied verdicts; the jobs nothing blocks any more."""
    return [v.job for v in verdicts if v.satisfied and graph.remove(v)]


@pytest.mark.parametrize("kind, end, satisfied", [
    ("afterany", OK, True), ("afterany", FAILED, True), ("afterany", CANCELLED_PENDING, True),
    ("afterok", OK, True), ("afterok", FAILED, False), ("afterok", CANCELLED_PENDING, False),
    ("afternotok", OK, False), ("afternotok", FAILED, True), ("afternotok", CANCELLED_PENDING, False),
    ("afterstart", CANCELLED_PENDING, False),
])
def test_each_type_is_decided_when_the_target_ends(kind: str, end: TargetState, satisfied: bool) -> None:
    graph = DepGraph()
    added, decided = add(graph, 2, [(kind, 1)], {1: PENDING})
    assert added == [f"{kind}:1"] and decided == []
    assert graph.blocked(2) and graph.waiting(2) == [f"{kind}:1"]
    (verdict,) = graph.ended(1, end)
    assert verdict.job == 2 and verdict.description == f"{kind}:1" and verdict.satisfied is satisfied
    if satisfied:
        assert release(graph, [verdict]) == [2] and not graph.blocked(2)
    else:
        assert verdict.reason.startswith(f"{kind}:1 can never be satisfied: job 1 ")
        assert end.how in verdict.reason


def test_afterstart_is_satisfied_at_start_and_others_wait_for_the_end() -> None:
    graph = DepGraph()
    add(graph, 2, [("afterstart", 1)], {1: PENDING})
    add(graph, 3, [("afterok", 1)], {1: PENDING})
    assert [v[:3] for v in graph.started(1)] == [(2, "afterstart:1", True)]
    assert graph.started(1) == []
    assert [v[:3] for v in graph.ended(1, OK)] == [(3, "afterok:1", True)]


def test_targets_that_already_started_or_ended_are_judged_at_once() -> None:
    graph = DepGraph()
    states = {1: RUNNING, 2: OK, 3: FAILED}
    added, decided = add(graph, 9, [("afterstart", 1), ("afterok", 2), ("afterok", 3), ("afterany", 1)], states)
    assert added == ["afterstart:1", "afterok:2", "afterok:3", "afterany:1"]
    assert [(v.description, v.satisfied) for v in decided] == [
        ("afterstart:1", True), ("afterok:2", True), ("afterok:3", False)]
    assert release(graph, decided) == []
    assert graph.waiting(9) == ["afterok:3", "afterany:1"]


def test_a_job_is_released_only_when_every_dependency_is_removed() -> None:
    graph = DepGraph()
    add(graph, 5, [("afterok", 1), ("afterok", 2), ("afterany", 3)], {1: PENDING, 2: PENDING, 3: PENDING})
    assert release(graph, graph.ended(2, OK)) == []
    assert release(graph, graph.ended(1, OK)) == []
    assert release(graph, graph.ended(3, FAILED)) == [5]
    assert len(graph) == 0


def test_unknown_targets_self_and_cycles_are_refused() -> None:
    graph = DepGraph()
    states = {1: PENDING, 2: PENDING}
    with pytest.raises(DependencyError, match="job 7 does not exist"):
        graph.check(3, [1, 7], lookup_of(states))
    with pytest.raises(DependencyError, match="cannot depend on itself"):
        graph.check(3, [3], lookup_of({3: PENDING}))
    # 2 waits for 1, 1 waits for 3 (as a dependency update would make it): 3 -> 2 closes 3 -> 2 -> 1 -> 3.
    add(graph, 2, [("afterok", 1)], states)
    add(graph, 1, [("afterok", 3)], {3: PENDING})
    assert graph.cycle_through(3, [2]) == [3, 2, 1, 3]
    with pytest.raises(DependencyError, match=r"dependency cycle: 3 -> 2 -> 1 -> 3"):
        graph.check(3, [2], lookup_of({2: PENDING}))
    assert graph.cycle_through(4, [2]) == []


def test_aftercorr_gates_indexes_not_the_job() -> None:
    graph = DepGraph()
    add(graph, 2, [("aftercorr", 1), ("afterok", 3)], {1: PENDING, 3: PENDING})
    assert graph.corr_dependants(1) == [2]
    assert release(graph, graph.ended(3, OK)) == [2]           # queued: aftercorr only gates its indexes
    assert graph.waiting(2) == ["aftercorr:1"]
    (verdict,) = graph.ended(1, FAILED)                         # removed whatever the result (per index rules)
    assert verdict.satisfied and graph.remove(verdict) is True and graph.waiting(2) == []


def test_singleton_waits_for_older_active_jobs_of_the_same_user_and_name() -> None:
    graph = DepGraph()
    key = (1000, "sim")
    add(graph, 1, [], {}, key=key)                              # a plain job named sim, running
    _, decided = add(graph, 2, [], {}, key=key, singleton=True)
    assert decided == [] and graph.waiting(2) == ["singleton"]
    _, decided = add(graph, 3, [], {}, key=key, singleton=True)
    assert decided == []
    _, decided = add(graph, 4, [], {}, key=(1001, "sim"), singleton=True)   # another user: not blocked
    assert [v.description for v in decided] == ["singleton"]
    assert graph.gone(3) == []                                  # a waiting younger one leaves: nothing changes
    assert [v[:3] for v in graph.gone(1)] == [(2, "singleton", True)]
    assert release(graph, [Verdict(2, "singleton", True)]) == [2]
    _, decided = add(graph, 5, [], {}, key=key, singleton=True)
    assert decided == []
    assert [v.job for v in graph.gone(2)] == [5]


def test_rename_moves_a_job_between_singleton_keys_in_submission_order() -> None:
    graph = DepGraph()
    add(graph, 1, [], {}, key=(0, "a"))
    add(graph, 2, [], {}, key=(0, "b"), singleton=True)         # alone under b: free at once
    add(graph, 3, [], {}, key=(0, "a"), singleton=True)         # waits for 1
    assert graph.rename(1, (0, "c")) == [Verdict(3, "singleton", True)]
    graph.remove(Verdict(3, "singleton", True))
    add(graph, 4, [], {}, key=(0, "b"), singleton=True)         # waits for 2
    assert graph.rename(4, (0, "a")) == []                      # 3 (older) is active under a
    assert graph.rename(3, (0, "z")) == [Verdict(4, "singleton", True)]


def test_begin_time_is_due_in_time_order() -> None:
    graph = DepGraph()
    now = 1000.0
    _, decided = graph.add(1, [], lookup_of({}), begin_time=now - 1, now=now)
    assert [v.satisfied for v in decided] == [True]
    graph.add(2, [], lookup_of({}), begin_time=now + 20, now=now)
    graph.add(3, [], lookup_of({}), begin_time=now + 10, now=now)
    assert graph.next_due() == now + 10
    assert graph.due(now + 5) == []
    assert [v.job for v in graph.due(now + 15)] == [3]
    assert graph.waiting(2) == [f"begin-time={now + 20!r}"]
    assert [v.job for v in graph.due(now + 25)] == [2] and graph.next_due() is None


def test_a_dependant_that_went_away_is_skipped() -> None:
    graph = DepGraph()
    add(graph, 2, [("afterok", 1)], {1: PENDING})
    add(graph, 3, [("afterok", 1)], {1: PENDING})
    graph.gone(2)                                               # cancelled while waiting
    assert [v.job for v in graph.ended(1, OK)] == [3]


@pytest.mark.slow  # several seconds: the slow tier
def test_release_cost_grows_with_the_dependants_not_the_queue() -> None:
    """Counted, not timed: the work is one visit per dependant edge of the target."""
    graph = DepGraph()
    for job in range(2, 10_002):
        graph.add(job, [("afterok", 1)], {1: PENDING}.get)
    for job in range(10_002, 110_002):                          # 100,000 jobs waiting on something else
        graph.add(job, [("afterok", 0)], {0: PENDING}.get)
    assert len(graph._after[1]) == 10_000 and len(graph._after[0]) == 100_000
    verdicts = graph.ended(1, OK)
    assert len(verdicts) == 10_000 and 1 not in graph._after and len(graph._after[0]) == 100_000
    assert len(release(graph, verdicts)) == 10_000 and len(graph) == 100_000
