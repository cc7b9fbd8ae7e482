"""Every RFC 21 transition of broker/job.py, table-driven: each event from each state is taken or refused, and
what each taken event records on the job and returns as effects (`Job.apply`, docs/architecture.md#job-states).

The tables below restate protocol.md §3.6 and RFC 21 independently of TRANSITIONS, so a change to the
machine's table must be made here too, on purpose.
"""
from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker.job import PLAIN_TRANSITIONS, TRANSITIONS, Effect, Event, EventName, State, TransitionError
from minicluster.testing import job

S = State
# (event, from) -> to, for every job.
EXPECTED = {
    ("submit", S.NEW): S.DEPEND,
    ("depend", S.DEPEND): S.PRIORITY,
    ("priority", S.PRIORITY): S.SCHED,
    ("alloc", S.SCHED): S.RUN,
    ("finish", S.DEPEND): S.CLEANUP,
    ("finish", S.PRIORITY): S.CLEANUP,
    ("finish", S.SCHED): S.CLEANUP,
    ("finish", S.RUN): S.CLEANUP,
    ("clean", S.SCHED): S.INACTIVE,
    ("clean", S.CLEANUP): S.INACTIVE,
}
# (event, from) -> to, for plain jobs only: an array stays in RUN while indexes run again (protocol.md §3.9.2).
EXPECTED_PLAIN = {
    ("retry", S.RUN): S.SCHED,
    ("requeue", S.RUN): S.SCHED,
}
STATE_EVENTS = sorted({event for event, _ in EXPECTED} | {event for event, _ in EXPECTED_PLAIN})
# Events of the eventlog that are not state transitions: they never move a job and are never refused.
OTHER_EVENTS = ["start", "release", "exception", "dependency-add", "dependency-remove", "hold", "success",
                "output-truncated", "update"]


def record_in(state: State, *, array: bool = False):
    record = job(3, array="0-3") if array else job(3)
    record.state = state
    return record


def test_the_tables_here_cover_exactly_the_machines_events() -> None:
    assert set(TRANSITIONS) == {event for event, _ in EXPECTED}
    assert set(PLAIN_TRANSITIONS) == {event for event, _ in EXPECTED_PLAIN}
    assert set(EventName) == set(STATE_EVENTS) | set(OTHER_EVENTS)  # protocol.md §3.7, no more and no fewer


@pytest.mark.parametrize("name", ["no-such-event", "", "Start", "alloc "])
def test_a_name_that_is_no_event_is_refused_and_the_job_left_alone(name: str) -> None:
    record = record_in(State.SCHED)
    with pytest.raises(TransitionError, match="no such event"):
        record.apply(Event(name, seq=5))
    assert (record.state, record.seq) == (State.SCHED, 0)


@pytest.mark.parametrize(("event", "state"), list(itertools.product(STATE_EVENTS, State)),
                         ids=lambda v: v.value if isinstance(v, State) else v)
def test_plain_job_takes_each_allowed_event_and_refuses_the_rest(event: str, state: State) -> None:
    record = record_in(state)
    target = EXPECTED.get((event, state)) or EXPECTED_PLAIN.get((event, state))
    if target is None:
        with pytest.raises(TransitionError, match=f"event {event} not allowed in state {state.value}"):
            record.apply(Event(event))
        assert record.state is state, "a refused event leaves the state alone"
    else:
        record.apply(Event(event))
        assert record.state is target


@pytest.mark.parametrize(("event", "state"), list(itertools.product(STATE_EVENTS, State)),
                         ids=lambda v: v.value if isinstance(v, State) else v)
def test_array_job_ignores_retry_and_requeue_and_follows_the_common_table(event: str, state: State) -> None:
    record = record_in(state, array=True)
    if (event, state) in EXPECTED:
        record.apply(Event(event))
        assert record.state is EXPECTED[(event, state)]
    elif event in PLAIN_TRANSITIONS:
        record.apply(Event(event))
        assert record.state is state, f"{event} must not move an array job"
    else:
        with pytest.raises(TransitionError):
            record.apply(Event(event))
        assert record.state is state


@pytest.mark.parametrize("event", OTHER_EVENTS)
@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_events_that_are_not_transitions_never_move_a_job(event: str, state: State) -> None:
    record = record_in(state)
    record.apply(Event(event))
    assert record.state is state


def test_the_whole_life_of_a_plain_job_in_order() -> None:
    record = job(1)
    seen = [record.state]
    for event in ("submit", "depend", "priority", "alloc", "start", "retry", "alloc", "finish", "release",
                  "clean"):
        record.apply(Event(event))
        seen.append(record.state)
    assert seen == [S.NEW, S.DEPEND, S.PRIORITY, S.SCHED, S.RUN, S.RUN, S.SCHED, S.RUN, S.CLEANUP, S.CLEANUP,
                    S.INACTIVE]
    with pytest.raises(TransitionError):
        record.apply(Event("submit"))


# --- effects ---------------------------------------------------------------------------------------------------

ENDING = {"type": "cancel", "severity": 0, "note": "cancelled by uid 7", "status": 143}
# (event, context, running tasks) -> the effects, in order. Every other event, in any state, has none.
E = Effect
EFFECTS: list[tuple[str, dict[str, Any], int, tuple[Effect, ...]]] = [
    ("start", {}, 2, (E.STARTED,)),
    ("exception", ENDING, 0, (E.UNQUEUE, E.POST_FINISH)),
    ("exception", ENDING, 2, (E.UNQUEUE, E.KILL_TASKS)),
    ("exception", {"type": "preempt", "severity": 1, "note": "index 3 preempted"}, 2, ()),
    ("success", {"note": "success_count 2 met"}, 0, (E.UNQUEUE, E.POST_FINISH)),
    ("success", {"note": "success_count 2 met"}, 1, (E.UNQUEUE, E.KILL_TASKS)),
    ("finish", {"status": 0, "counts": {"succeeded": 3, "failed": 0, "cancelled": 0}}, 0,
     (E.UNQUEUE, E.POST_RELEASE, E.TASKS_OVER, E.POST_CLEAN)),
    ("clean", {}, 0, (E.ENDED, E.CLOSE, E.WAKE_SCHEDULER)),
]
# The state each of those events is posted in, in its table row above.
POSTED_IN = {"start": S.RUN, "exception": S.RUN, "success": S.RUN, "finish": S.RUN, "clean": S.CLEANUP}
WITH_EFFECTS = {event for event, *_ in EFFECTS}


@pytest.mark.parametrize(("event", "context", "running", "effects"), EFFECTS,
                         ids=[f"{e}-{c.get('severity', '')}-running{r}" for e, c, r, _ in EFFECTS])
def test_each_event_returns_its_effects_in_order(event: str, context: dict[str, Any], running: int,
                                                 effects: tuple[Effect, ...]) -> None:
    record = record_in(POSTED_IN[event])
    record.running = running
    assert record.apply(Event(event, context, seq=7, ts=2000.0)) == effects
    assert record.seq == 8, "the next event is numbered after this one"


@pytest.mark.parametrize("event", sorted(set(STATE_EVENTS + OTHER_EVENTS) - WITH_EFFECTS))
@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_every_other_event_has_no_effects(event: str, state: State) -> None:
    record = record_in(state)
    record.running = 1
    try:
        effects = record.apply(Event(event, {"severity": 0, "status": 1}))
    except TransitionError:
        return  # refused: covered above
    assert effects == ()
    assert not record.ending


def test_an_ending_exception_records_its_cause() -> None:
    record = record_in(S.RUN)
    record.apply(Event("exception", ENDING))
    assert record.ending and record.state is S.RUN, "it ends when its tasks do, through finish"
    assert (record.exception, record.cause_status, record.reason) == ("cancel", 143, "cancelled by uid 7")
    assert record.outcome() == {"status": 143, "counts": {"succeeded": 0, "failed": 0, "cancelled": 1}}


def test_a_warning_exception_records_nothing() -> None:
    record = record_in(S.RUN)
    record.apply(Event("exception", {"type": "preempt", "severity": 1, "note": "preempted"}))
    assert not record.ending and record.exception is None and record.reason is None


def test_success_ends_the_job_with_status_zero() -> None:
    record = record_in(S.RUN, array=True)
    record.record_result(1, was_running=False)
    record.apply(Event("success", {"note": "met"}))
    assert record.ending and record.status == 0
    assert record.outcome() == {"status": 0, "counts": {"succeeded": 0, "failed": 1, "cancelled": 3}}


def test_start_sets_the_run_time_to_the_current_attempts() -> None:
    record = record_in(S.RUN)
    record.apply(Event("start", ts=10.0))
    record.apply(Event("start", ts=20.0))
    assert record.t_run == 20.0, "a retried job runs since its latest start, live and replayed alike"


def test_finish_records_the_status_and_counts_it_carries_and_keeps_the_reason() -> None:
    record = record_in(S.RUN)
    record.reason = "task 1 on rank 0: no such file"
    record.apply(Event("finish", {"status": 2, "counts": {"succeeded": 1, "failed": 1, "cancelled": 1}}))
    assert (record.status, record.succeeded, record.failed, record.cancelled) == (2, 1, 1, 1)
    assert record.tasks_left == 0 and record.state is S.CLEANUP and record.reason == "task 1 on rank 0: no such file"


def test_clean_retires_the_record_and_no_result_counts_after() -> None:
    record = record_in(S.CLEANUP)
    record.ranks = {0, 1}
    record.apply(Event("clean"))
    assert record.state is S.INACTIVE and record.spec is None and record.ranks_text == "0-1"
    assert not record.mark_done(0) and not record.is_done(0)


def test_output_truncated_is_recorded() -> None:
    record = record_in(S.RUN)
    assert record.apply(Event("output-truncated", {"cap": 10})) == ()
    assert record.truncated
