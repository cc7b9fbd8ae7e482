"""The head of the queue (what the dispatch window takes from) kept as a heap of bucket heads: the same job as a
plain scan of every bucket after any sequence of queue operations, and found without visiting every bucket.
Pure: no sockets."""
import random

import pytest

from broker.sched import LimitCounters, QueueLimits, Request, SchedJob, Scheduler
from minicluster.model.sharing import Limits

from conftest import make_graph

QUEUES = ("q", "lim")


def scanned_head(s):
    """The plain scan: every bucket's first job that still has elements to start, the least merged key wins."""
    best = None
    for bucket in s._ordering.buckets.values():
        if not bucket.keys or bucket.reason:
            continue
        for key in bucket.keys:
            entry = s._pending[key[2]]
            if entry.job.queue in s.stopped:
                break
            if entry.remaining:
                merged = (key[0] - bucket.base, key[1], key[2])
                best = merged if best is None or merged < best else best
                break
    return best


def random_job(rng, job_id, now):
    count = rng.choice((1, 1, 1, 2, 3))
    return SchedJob(job_id, urgency=rng.randrange(0, 32), submit_time=now, request=Request(nslots=1),
                    time_limit=50.0, count=count, queue=rng.choice(QUEUES), user=rng.randrange(6),
                    project=rng.choice(("a", "b")))


def step(s, rng, state):
    """One random queue operation, of the kinds the broker makes."""
    op = rng.randrange(11)
    pending = sorted(s._pending)
    state["now"] += 1.0
    now = state["now"]
    if op <= 2 or not pending:
        state["next"] += 1
        s.enqueue(random_job(rng, state["next"], now), now)
    elif op == 3:
        s.cancel(rng.choice(pending))
    elif op == 4:
        for start in s.schedule(now):
            state["running"].append((start.job_id, start.element))
    elif op == 5 and state["running"]:
        s.release(*state["running"].pop(rng.randrange(len(state["running"]))), now)
    elif op == 6:
        s.take_ahead(rng.choice(pending), rng.randrange(1, 3))
    elif op == 7:
        taken = s.take_ahead_job(lambda job_id: True, after=-1)
        if taken is not None:
            s.drop_ahead(taken.job_id)
            s.enqueue(taken, now)  # came back from the window: queued again
    elif op == 8:
        s.extend(rng.choice(pending), rng.randrange(1, 3))
    elif op == 9:
        bases = {b: rng.choice((0.0, 3.0, 40.0)) for b in s._ordering.buckets}
        if rng.random() < 0.5:
            s.set_bucket_bases(lambda b: bases.get(b, 1.0))
        else:
            s.reprioritize(now)
    else:
        queue = rng.choice(QUEUES)
        (s.start_queue if queue in s.stopped else s.stop_queue)(queue)


@pytest.mark.parametrize("seed", range(12))
def test_the_head_heap_finds_the_same_job_as_a_scan_of_every_bucket(seed):
    rng = random.Random(seed)
    limits = LimitCounters({"lim": QueueLimits(Limits(), Limits(running_jobs=1))})
    s = Scheduler(make_graph(2), default_time_limit=100.0, limits=limits,
                  term=lambda job, now: job.urgency + (now - job.submit_time) / 100.0)
    state = {"now": 0.0, "next": 0, "running": []}
    for _ in range(600):
        step(s, rng, state)
        assert s._ordering.head() == scanned_head(s)


class CountingDict(dict):
    """The scheduler's pending jobs, counting how many are looked up."""

    lookups = 0

    def __getitem__(self, key):
        self.lookups += 1
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_taking_the_head_with_thousands_of_users_does_not_visit_every_bucket():
    users = 5000
    s = Scheduler(make_graph(1), default_time_limit=100.0)
    for job_id in range(1, 4 * users + 5):  # 4 busy cores, then 4 jobs for each of 5,000 users
        s.enqueue(SchedJob(job_id, submit_time=float(job_id), request=Request(nslots=1), time_limit=10.0,
                           user=job_id % users))
    assert len(s.schedule(0.0)) == 4
    s._pending = CountingDict(s._pending)
    taken = [s.take_ahead_job(lambda job_id: True, after=1).job_id for _ in range(10)]
    assert taken == list(range(5, 15))
    assert s._pending.lookups < 10 * 20  # a scan looks up one job per bucket: 5,000 for each take


def test_a_job_queued_behind_its_users_started_array_becomes_the_head_before_another_users_job():
    s = Scheduler(make_graph(1), default_time_limit=100.0)  # 4 cores, all busy
    s.enqueue(SchedJob(1, urgency=31, request=Request(nslots=4), time_limit=10.0))
    assert len(s.schedule(0.0)) == 1
    s.enqueue(SchedJob(2, urgency=20, submit_time=1.0, request=Request(nslots=1), count=2, user=1))
    s.enqueue(SchedJob(3, urgency=10, submit_time=2.0, request=Request(nslots=1), user=1))
    s.enqueue(SchedJob(4, urgency=15, submit_time=3.0, request=Request(nslots=1), user=2))
    assert list(s.take_ahead(2, 2)) == [0, 1]  # the array's last element is taken: it stays queued until a pass
    assert s._ordering.head()[2] == 4
    s.enqueue(SchedJob(5, urgency=17, submit_time=4.0, request=Request(nslots=1), user=1))
    taken = s.take_ahead_job(lambda job_id: True, after=1)
    assert taken is not None and taken.job_id == 5, "user 1's new job comes before user 2's"
