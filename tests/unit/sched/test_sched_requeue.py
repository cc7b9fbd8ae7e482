"""Elements queued again (retries, releases after a hold): numbered after the job's last, never colliding with
elements still running, and grown in place while the job is queued."""
from broker.sched import Request, SchedJob, Scheduler

from conftest import make_graph


def test_elements_continue_after_the_last_and_extend_a_queued_array():
    sched = Scheduler(make_graph(1), default_time_limit=1000.0)   # 4 cores
    sched.enqueue(SchedJob(7, request=Request(nslots=1), count=6))
    first = sched.schedule(0.0)
    assert [s.element for s in first] == [0, 1, 2, 3]
    assert sched.extend(7, 2) is True                              # still queued: grows in place
    sched.release(7, 0, 1.0)
    sched.release(7, 1, 1.0)
    assert [s.element for s in sched.schedule(1.0)] == [4, 5]
    for e in (2, 3, 4, 5):
        sched.release(7, e, 2.0)
    assert [s.element for s in sched.schedule(2.0)] == [6, 7]
    assert sched.extend(7, 1) is False                             # all started: no longer queued
    sched.enqueue(SchedJob(7, request=Request(nslots=1), count=2, first_element=8))
    assert [s.element for s in sched.schedule(3.0)] == [8, 9]
    assert sched.pending_count() == 0


def test_a_requeued_remainder_keeps_its_numbers():
    sched = Scheduler(make_graph(1), default_time_limit=1000.0)
    sched.enqueue(SchedJob(3, request=Request(nslots=1), count=10))
    assert len(sched.schedule(0.0)) == 4
    remaining = sched.cancel(3)                                    # a hold
    assert remaining == 6
    sched.enqueue(SchedJob(3, request=Request(nslots=1), count=remaining, first_element=10 - remaining))
    for e in range(4):
        sched.release(3, e, 1.0)
    assert [s.element for s in sched.schedule(1.0)] == [4, 5, 6, 7]
