"""Every RFC 21 transition of broker/job.py, table-driven: each event from each state is taken or refused.

The tables below restate protocol.md §3.6 and RFC 21 independently of TRANSITIONS, so a change to the
machine's table must be made here too, on purpose.
"""
from __future__ import annotations

import itertools

import pytest

from broker.job import PLAIN_TRANSITIONS, TRANSITIONS, Event, State, TransitionError
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
                "output-truncated", "update", "no-such-event"]


def record_in(state: State, *, array: bool = False):
    record = job(3, array="0-3") if array else job(3)
    record.state = state
    return record


def test_the_tables_here_cover_exactly_the_machines_events() -> None:
    assert set(TRANSITIONS) == {event for event, _ in EXPECTED}
    assert set(PLAIN_TRANSITIONS) == {event for event, _ in EXPECTED_PLAIN}


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
