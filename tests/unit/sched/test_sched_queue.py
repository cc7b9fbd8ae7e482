"""Scheduler: priority order, arrays, cancel, EASY backfill and estimated start."""
import pytest

from broker.sched import Request, SchedJob, Scheduler

from conftest import make_graph


def job(job_id, nslots=1, t=None, limit=100.0, urgency=16, **kw):
    return SchedJob(job_id, urgency=urgency, submit_time=float(job_id if t is None else t),
                    request=Request(nslots=nslots, **{k: v for k, v in kw.items()
                                                      if k != "count"}),
                    time_limit=limit, count=kw.get("count", 1))


def started(starts):
    return [(s.job_id, s.element) for s in starts]


@pytest.fixture
def sched():
    """4 nodes x 4 cores = 16 cores."""
    return Scheduler(make_graph(4), default_time_limit=1000.0)


def test_schedjob_validation():
    with pytest.raises(ValueError, match="urgency must be 0-31"):
        SchedJob(1, urgency=32)
    with pytest.raises(ValueError, match="count must be >= 1"):
        SchedJob(1, count=0)
    with pytest.raises(ValueError, match="time_limit"):
        SchedJob(1, time_limit=0)


def test_order_is_urgency_then_submit_time_then_id(sched):
    sched.enqueue(job(3, nslots=4, t=5.0))
    sched.enqueue(job(1, nslots=4, t=9.0, urgency=20))
    sched.enqueue(job(2, nslots=4, t=5.0))
    sched.enqueue(job(4, nslots=4, t=1.0, urgency=0))
    sched.enqueue(job(5, nslots=4, t=1.0))
    assert started(sched.schedule(0.0)) == [(1, 0), (5, 0), (2, 0), (3, 0)]
    assert sched.pending_count() == 1
    with pytest.raises(ValueError, match="already queued"):
        sched.enqueue(job(4))


def test_limit_caps_starts_and_next_cycle_continues(sched):
    sched.enqueue(job(1, count=10))
    assert started(sched.schedule(0.0, limit=3)) == [(1, 0), (1, 1), (1, 2)]
    assert started(sched.schedule(0.0, limit=3)) == [(1, 3), (1, 4), (1, 5)]
    assert sched.pending_count() == 4


def test_array_elements_are_lazy_and_numbered(sched):
    sched.enqueue(job(7, count=100_000))
    assert sched.pending_count() == 100_000
    starts = sched.schedule(0.0)
    assert started(starts) == [(7, e) for e in range(16)]
    cores = {(r, c) for s in starts for r in s.allocation for c in s.allocation[r].cores}
    assert len(cores) == 16
    sched.release(7, 3, 10.0)
    assert started(sched.schedule(10.0)) == [(7, 16)]
    assert sched.cancel(7) == 100_000 - 17
    assert sched.pending_count() == 0
    assert sched.schedule(11.0) == [] and sched.running_count() == 16


def test_cancel_pending_only(sched):
    sched.enqueue(job(1, nslots=16))
    sched.enqueue(job(2, nslots=4))
    sched.schedule(0.0)
    assert sched.cancel(1) == 0   # running: released separately by the broker
    assert sched.cancel(2) == 1
    assert sched.cancel(99) == 0
    sched.release(1, 0, 5.0)
    assert sched.schedule(5.0) == []


def test_blocked_head_gets_reservation_from_time_limits(sched):
    sched.enqueue(job(1, nslots=8, limit=100.0))
    sched.enqueue(job(2, nslots=4, limit=300.0))
    sched.enqueue(job(3, nslots=12, limit=50.0))  # needs job 1's cores: head
    assert started(sched.schedule(0.0)) == [(1, 0), (2, 0)]
    assert sched.estimated_start(3) == 100.0
    assert sched.estimated_start(1) is None and sched.estimated_start(2) is None
    sched.release(1, 0, 60.0)
    assert started(sched.schedule(60.0)) == [(3, 0)]
    assert sched.estimated_start(3) is None
    sched.enqueue(job(4, nslots=16))
    sched.schedule(61.0)
    assert sched.estimated_start(4) == 300.0
    sched.cancel(4)
    assert sched.estimated_start(4) is None


def test_small_job_backfills_only_if_it_ends_before_reservation(sched):
    sched.enqueue(job(1, nslots=14, limit=100.0))
    sched.enqueue(job(2, nslots=16, limit=10.0))   # head: needs everything, at t=100
    sched.enqueue(job(3, nslots=2, limit=500.0))   # would delay the head: must wait
    sched.enqueue(job(4, nslots=2, limit=100.0))   # ends exactly at the reservation: ok
    assert started(sched.schedule(0.0)) == [(1, 0), (4, 0)]
    assert sched.estimated_start(2) == 100.0
    sched.release(4, 0, 20.0)
    sched.release(1, 0, 100.0)
    assert started(sched.schedule(100.0)) == [(2, 0)]


def test_backfill_job_may_run_long_on_resources_outside_the_reservation():
    sched = Scheduler(make_graph(4))
    sched.enqueue(job(1, nslots=8, nnodes=2, limit=100.0))    # nodes 0,1
    sched.enqueue(job(2, nslots=4, nnodes=1, limit=1000.0))   # node 2
    sched.enqueue(job(3, nslots=8, nnodes=2, limit=10.0))     # head: needs two whole nodes
    sched.enqueue(job(4, nslots=4, limit=10_000.0))           # node 3 is not reserved
    assert started(sched.schedule(0.0)) == [(1, 0), (2, 0), (4, 0)]
    assert sched.estimated_start(3) == 100.0
    res = sched._reservation
    assert sorted(res.allocation) == [0, 1]


def test_reserved_head_start_time_never_slips_due_to_backfill(sched):
    sched.enqueue(job(1, nslots=12, limit=100.0))
    sched.enqueue(job(2, nslots=8, limit=10.0))
    for j in range(3, 40):
        sched.enqueue(job(j, nslots=1, limit=float(10 * j)))
    starts = sched.schedule(0.0)
    ends = {s.job_id: 10 * s.job_id for s in starts if s.job_id >= 3}
    assert sched.estimated_start(2) == 100.0
    # the head needs 8 cores at t=100: all 12 of job 1's are free then, plus at
    # most 4 cores held by backfilled jobs still running
    late = [j for j, end in ends.items() if end > 100.0]
    assert len(ends) == 4 and len(late) <= 4
    sched.release(1, 0, 100.0)
    for j, end in ends.items():
        if end <= 100:
            sched.release(j, 0, end)
    assert (2, 0) in started(sched.schedule(100.0))


def test_head_that_can_never_run_now_does_not_block_the_queue(sched):
    sched.graph.drain(0, "maint")
    sched.graph.drain(1, "maint")
    sched.enqueue(job(1, nslots=12))  # feasible on paper, impossible with 2 drained nodes
    sched.enqueue(job(2, nslots=4))
    assert started(sched.schedule(0.0)) == [(2, 0)]
    assert sched.estimated_start(1) is None
    sched.graph.undrain(0)
    sched.graph.undrain(1)
    assert started(sched.schedule(1.0)) == [(1, 0)]


def test_overdue_allocations_count_as_ending_now(sched):
    sched.enqueue(job(1, nslots=16, limit=10.0))
    sched.enqueue(job(2, nslots=16))
    sched.schedule(0.0)
    sched.enqueue(job(3, nslots=1))
    sched.schedule(50.0)
    assert sched.estimated_start(2) == 50.0


def test_quiet_cycle_returns_without_work(sched):
    sched.enqueue(job(1, nslots=16))
    for j in range(2, 500):
        sched.enqueue(job(j, nslots=2))
    assert len(sched.schedule(0.0)) == 1
    version = sched.graph.version
    assert sched.schedule(1.0) == []
    assert sched.graph.version == version  # nothing was even matched


def test_backfill_depth_bounds_the_scan():
    sched = Scheduler(make_graph(4), backfill_depth=3)
    sched.enqueue(job(1, nslots=15, limit=100.0))
    sched.enqueue(job(2, nslots=16, limit=100.0))  # head
    for j in range(3, 10):
        sched.enqueue(job(j, nslots=2, limit=10.0))  # do not fit: 1 core free
    sched.enqueue(job(10, nslots=1, limit=10.0))     # would fit but lies beyond the depth
    assert started(sched.schedule(0.0)) == [(1, 0)]
    sched2 = Scheduler(make_graph(4), backfill_depth=100)
    for j in [job(1, nslots=15, limit=100.0), job(2, nslots=16, limit=100.0)] + \
            [job(j, nslots=2, limit=10.0) for j in range(3, 10)] + [job(10, nslots=1, limit=10.0)]:
        sched2.enqueue(j)
    assert started(sched2.schedule(0.0)) == [(1, 0), (10, 0)]


def test_adopt_restores_running_allocations():
    graph = make_graph(2)
    first = Scheduler(graph)
    first.enqueue(job(1, nslots=4, limit=50.0))
    start = first.schedule(0.0)[0]
    graph2 = make_graph(2)
    second = Scheduler(graph2)
    second.adopt(1, 0, start.allocation, start_time=0.0, time_limit=50.0)
    second.enqueue(job(2, nslots=8))
    assert second.schedule(1.0) == [] and second.estimated_start(2) == 50.0
    assert graph2.snapshot() != make_graph(2).snapshot()


def test_estimated_start_is_the_earliest_end_that_makes_room(sched):
    for j, limit in ((1, 30.0), (2, 10.0), (3, 20.0)):
        sched.enqueue(job(j, nslots=4, nnodes=1, limit=limit))
    sched.enqueue(job(4, nslots=8, limit=5.0))      # 4 free + 4 more: first end is t=10
    sched.enqueue(job(5, nslots=4, nnodes=1, limit=10.0))
    # job 5 fits on the 4 free cores and ends at t=10 when the head starts: backfilled
    assert started(sched.schedule(0.0)) == [(1, 0), (2, 0), (3, 0), (5, 0)]
    assert sched.estimated_start(4) == 10.0
    sched.release(2, 0, 10.0)
    sched.release(5, 0, 10.0)
    assert started(sched.schedule(10.0)) == [(4, 0)]


def test_cycle_on_full_cluster_does_not_scan_the_queue(sched, monkeypatch):
    sched.enqueue(job(1, nslots=16, limit=100.0))
    sched.schedule(0.0)
    for j in range(2, 5002):
        sched.enqueue(job(j, nslots=1 + j % 3, limit=10.0))
    calls = []
    real_match, real_fits = type(sched.graph).match, type(sched.graph).fits
    monkeypatch.setattr(type(sched.graph), "match",
                        lambda g, *a: calls.append("m") or real_match(g, *a))
    monkeypatch.setattr(type(sched.graph), "fits",
                        lambda g, *a: calls.append("f") or real_fits(g, *a))
    assert sched.schedule(1.0) == []
    assert sched.estimated_start(2) == 100.0
    assert len(calls) < 10  # head match + reservation search; no backfill attempts
