"""Scheduler with sharing: bucket order (fair share as bucket bases), limits and their reasons, stopped queues,
preemption choice, and that none of it makes a cycle walk the queue.  Pure: no sockets."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.sched import LimitCounters, QueueLimits, Request, SchedJob, Scheduler
from broker.sched.ordering import Ordering
from broker.sched.preempt import choose_victims
from broker.policy.priority import Priority
from minicluster.model.sharing import Limits, Weights

from conftest import make_graph


def job(job_id, user=1, queue="q", project="p", nslots=1, t=None, limit=100.0, urgency=16, count=1, **kw):
    return SchedJob(job_id, urgency=urgency, submit_time=float(job_id if t is None else t),
                    request=Request(nslots=nslots, **kw), time_limit=limit, count=count,
                    queue=queue, user=user, project=project)


def started(starts):
    return [(s.job_id, s.element) for s in starts]


def sched_with(limits=None, nodes=4, **graph):
    counters = LimitCounters({name: QueueLimits(*lim) for name, lim in (limits or {}).items()})
    return Scheduler(make_graph(nodes, **graph), default_time_limit=1000.0, limits=counters)


# --- order -------------------------------------------------------------------------------------------------


def test_bucket_bases_order_users_and_keep_each_users_own_order():
    s = sched_with(nodes=1)  # 4 cores
    for jid, user in ((1, 1), (2, 1), (3, 2), (4, 2), (5, 1), (6, 2)):
        s.enqueue(job(jid, user=user))
    s.set_bucket_bases(lambda bucket: 100.0 if bucket[1] == 2 else 0.0)
    assert started(s.schedule(0.0)) == [(3, 0), (4, 0), (6, 0), (1, 0)]
    assert s.priority_of(2) == pytest.approx(16.0)  # urgency term + base 0


def test_merge_equals_a_global_sort():
    """The merged walk is exactly the order of a sort by -(base + term), submit time, id."""
    rng = random.Random(4)
    ordering = Ordering()
    bases = {b: rng.choice([0.0, 5.0, 7.5]) for b in range(6)}
    expected = []
    for jid in range(300):
        bucket, term, t = rng.randrange(6), rng.choice([1.0, 2.0, 3.0]), rng.random()
        ordering.insert(bucket, (-term, t, jid))
        expected.append((-(bases[bucket] + term), t, jid))
    ordering.set_bases(bases.__getitem__)
    walked = [jid for _, jid in ordering.merged()]
    assert walked == [jid for _, _, jid in sorted(expected)]


def test_a_job_queued_later_after_its_submission_does_not_overtake_an_older_one_by_age():
    """The age term is dated at one time for every job queued since the last reprioritize: a job whose
    submission took longer to become durable is not older for it (an array queued this way took every core
    from the one before it, whose last elements then waited with none running)."""
    s = Scheduler(make_graph(1), default_time_limit=1000.0, term=Priority(Weights(), {}).term)
    s.enqueue(job(1, t=100.0, count=8), now=100.001)
    s.enqueue(job(2, t=100.002, count=8), now=100.5)
    assert {start.job_id for start in s.schedule(100.5)} == {1}


def test_reprioritize_resorts_by_a_new_term():
    s = Scheduler(make_graph(1), default_time_limit=1000.0, term=lambda j, now: -j.submit_time)
    for jid in (1, 2, 3):
        s.enqueue(job(jid, nslots=4))
    s.term = lambda j, now: float(j.job_id == 3)  # job 3 now first
    s.reprioritize(0.0)
    assert started(s.schedule(0.0)) == [(3, 0)]


# --- limits ------------------------------------------------------------------------------------------------


def test_user_running_jobs_limit_holds_the_bucket_with_a_reason_and_frees_on_release():
    s = sched_with({"q": (Limits(), Limits(running_jobs=2))})
    for jid in (1, 2, 3):
        s.enqueue(job(jid, user=1))
    s.enqueue(job(4, user=2))
    assert started(s.schedule(0.0)) == [(1, 0), (2, 0), (4, 0)]
    assert s.reason_of(3) == "UserMaxRunningJobs: uid 1 in queue q has 2 of 2 jobs in use"
    s.release(1, 0, 1.0)
    assert started(s.schedule(1.0)) == [(3, 0)]
    assert s.reason_of(3) is None


def test_queue_core_limit_caps_an_array_batch():
    s = sched_with({"q": (Limits(cores=5), Limits())})
    s.enqueue(job(1, count=100))
    assert len(s.schedule(0.0)) == 5
    assert s.reason_of(1).startswith("QueueMaxCores: queue q has 5 of 5 cores in use")
    s.release_many([(1, 0), (1, 1)], 1.0)
    assert len(s.schedule(1.0)) == 2
    assert s.limits.by_queue["q"].cores == 5 and s.limits.by_queue["q"].pending == 93


def test_gpu_limit_and_refusals():
    s = sched_with({"q": (Limits(gpus=2), Limits(cores=8, queued_jobs=3))}, gpus=2)
    assert s.limits.refuse("q", 1, 9, 0, 1) == "asks 9 cores, more than the per-user limit of 8 in queue q"
    assert s.limits.refuse("q", 1, 1, 3, 1) == "asks 3 GPUs, more than the queue limit of 2 in queue q"
    for jid in (1, 2, 3):
        s.enqueue(job(jid, gpus_per_slot=1))
    assert "max queued jobs" in s.limits.refuse("q", 1, 1, 0, 1)
    assert s.limits.refuse("q", 2, 1, 0, 1) is None  # another user
    assert started(s.schedule(0.0)) == [(1, 0), (2, 0)]
    assert s.reason_of(3).startswith("QueueMaxGpus")


@pytest.mark.slow  # several seconds: the slow tier
def test_a_held_bucket_is_skipped_whole_not_walked():
    """50,000 jobs held by a limit cost one look per cycle: the bucket is dropped from the merge."""
    s = sched_with({"q": (Limits(), Limits(running_jobs=1))}, nodes=1)
    for jid in range(1, 50_001):
        s.enqueue(job(jid, user=1))
    s.enqueue(job(60_000, user=2))
    looked = []
    limit_room = s._limit_room
    s._limit_room = lambda j, want: (looked.append(j.job_id), limit_room(j, want))[1]
    assert started(s.schedule(0.0)) == [(1, 0), (60_000, 0)]
    assert len(looked) <= 4


def test_stopped_queue_keeps_jobs_and_says_why():
    s = sched_with()
    s.enqueue(job(1, queue="a"))
    s.enqueue(job(2, queue="b"))
    s.stop_queue("a")
    assert started(s.schedule(0.0)) == [(2, 0)]
    assert s.reason_of(1) == "QueueStopped: queue a is stopped"
    s.start_queue("a")
    assert started(s.schedule(0.0)) == [(1, 0)]


def test_reasons_resources_and_priority():
    s = sched_with(nodes=1)
    s.enqueue(job(1, nslots=4))
    s.enqueue(job(2, nslots=4))
    s.enqueue(job(3, nslots=4))
    s.schedule(0.0)
    assert (s.reason_of(1), s.reason_of(2), s.reason_of(3)) == (None, "Resources", "Priority")


def test_usage_hook_sees_starts_and_releases():
    s = sched_with()
    seen = []
    s.usage_hook = lambda j, n, now, ran: seen.append((j.job_id, n, now, ran))
    s.enqueue(job(1, count=3))
    s.schedule(0.0)
    s.release_many([(1, 0), (1, 2)], 5.0)
    s.release(1, 1, 7.0)
    assert seen == [(1, 3, 0.0, 0.0), (1, -2, 5.0, 10.0), (1, -1, 7.0, 7.0)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6)), min_size=1, max_size=25),
       st.integers(1, 6), st.integers(1, 3))
def test_limits_are_never_exceeded(jobs, user_cores, user_running):
    s = sched_with({"q": (Limits(), Limits(cores=max(user_cores, 4), running_jobs=user_running))}, nodes=2)
    for jid, (user, cores, count) in enumerate(jobs, 1):
        s.enqueue(job(jid, user=user, cores_per_slot=cores, count=count))
    running = {}
    for step in range(60):
        for st_ in s.schedule(float(step)):
            running[(st_.job_id, st_.element)] = jobs[st_.job_id - 1]
        for user in (1, 2, 3):
            mine = [v for v in running.values() if v[0] == user]
            assert len(mine) <= user_running
            assert sum(v[1] for v in mine) <= max(user_cores, 4)
        if running:
            key = sorted(running)[step % len(running)]
            del running[key]
            s.release(*key, float(step))
    # limits never deadlock: once what runs ends, everything runs in the end
    for key in running:
        s.release(*key, 99.0)
    while s.pending_count():
        starts = s.schedule(100.0)
        assert starts
        for st_ in starts:
            s.release(st_.job_id, st_.element, 100.0)


# --- preemption --------------------------------------------------------------------------------------------


def test_victims_lose_the_least_work_and_only_what_is_needed():
    graph = make_graph(2)  # 2 nodes x 4 cores
    s = Scheduler(graph, default_time_limit=1000.0)
    s.queue_priority = {"low": 0, "high": 10}
    s.preemptible = {"low"}
    s.preempt_grace = 5.0
    # Node 0: one 4-core job started long ago; node 1: four 1-core jobs started recently.
    s.enqueue(job(1, queue="low", cores_per_slot=4, t=0.0, limit=1000.0))
    s.schedule(0.0)
    for jid in (2, 3, 4, 5):
        s.enqueue(job(jid, queue="low", t=90.0, limit=1000.0))
    s.schedule(90.0)
    s.enqueue(job(9, queue="high", cores_per_slot=2, t=100.0))
    assert s.schedule(100.0) == []
    victims = s.take_preemptions()
    # 2 cores: two 1-core jobs that ran 10 s (20 core-s) rather than the 4-core one (400 core-s).
    assert [(v.job_id, v.element, v.by) for v in victims] == [(2, 0, 9), (3, 0, 9)]
    assert s.reason_of(9) == "Resources"
    assert s.estimated_start(9) == 105.0  # the kill grace
    # Nothing more is preempted while they are on their way out.
    s.schedule(101.0)
    assert s.take_preemptions() == []
    s.release(2, 0, 102.0)
    s.release(3, 0, 102.0)
    assert started(s.schedule(102.0)) == [(9, 0)]


def test_no_preemption_from_an_equal_or_lower_queue_or_of_a_non_preemptible_one():
    s = Scheduler(make_graph(1), default_time_limit=1000.0)
    s.queue_priority = {"a": 5, "b": 5, "c": 1}
    s.preemptible = {"b"}
    s.enqueue(job(1, queue="b", nslots=4))
    s.schedule(0.0)
    s.enqueue(job(2, queue="a", nslots=1))  # same priority as b
    s.schedule(1.0)
    assert s.take_preemptions() == []
    s.preemptible = set()
    s.queue_priority["a"] = 9
    s.schedule(2.0)
    assert s.take_preemptions() == []


def test_a_gang_is_preempted_whole_or_not_at_all():
    graph = make_graph(2)
    s = Scheduler(graph, default_time_limit=1000.0)
    s.queue_priority = {"low": 0, "high": 1}
    s.preemptible = {"low"}
    s.enqueue(job(1, queue="low", nslots=8, t=0.0))   # a gang over both nodes
    s.schedule(0.0)
    s.enqueue(job(2, queue="high", t=50.0))
    s.schedule(50.0)
    assert [(v.job_id, v.element) for v in s.take_preemptions()] == [(1, 0)]


def test_choose_victims_returns_none_when_nothing_helps_and_leaves_the_graph_alone():
    graph = make_graph(1)
    s = Scheduler(graph, default_time_limit=1000.0)
    s.enqueue(job(1, nslots=2))
    s.schedule(0.0)
    before = graph.snapshot()
    assert choose_victims(graph, Request(nslots=8), "first-fit", [((1, 0), 10.0)]) is None
    assert choose_victims(graph, Request(nslots=3), "first-fit", [((1, 0), 10.0)]) == [(1, 0)]
    assert graph.snapshot() == before


def test_easy_backfill_still_works_around_a_limit_held_bucket():
    """A job a limit holds is not the head: the head is the next one, with its reservation, and a short job
    backfills in front of it while a long one does not."""
    s = sched_with({"q": (Limits(), Limits(running_jobs=1))}, nodes=1)  # 4 cores
    s.enqueue(job(1, user=1, nslots=2, limit=50.0, t=0.0))
    s.schedule(0.0)                                        # user 1 runs 2 cores until t=50
    s.enqueue(job(2, user=1, nslots=1, t=1.0))             # held by user 1's limit
    s.enqueue(job(3, user=2, nslots=4, t=2.0))             # the head: needs all 4 cores
    s.enqueue(job(4, user=3, nslots=1, limit=500.0, t=3.0))   # too long to backfill
    s.enqueue(job(5, user=4, nslots=2, limit=40.0, t=4.0))    # ends before t=50: backfills
    assert started(s.schedule(5.0)) == [(5, 0)]
    assert s.reason_of(2).startswith("UserMaxRunningJobs") and s.reason_of(3) == "Resources"
    assert s.estimated_start(3) == 50.0 and s.reason_of(4) == "Priority"


def test_a_single_job_of_a_queue_with_limits_goes_ahead_only_behind_one_of_its_own_user():
    """A job sent ahead (protocol.md §2.10) starts in its predecessor's place: where limits count, only a job of
    the same queue and user keeps the counts right."""
    s = sched_with({"q": (Limits(), Limits(running_jobs=2))}, nodes=1)  # 4 cores
    for jid, user in ((1, 1), (2, 1), (3, 2), (4, 2)):
        s.enqueue(job(jid, user=user))
    assert len(s.schedule(0.0)) == 4
    s.enqueue(job(5, user=2))
    s.enqueue(job(6, user=1, queue="free"))
    anything = lambda job_id: True  # noqa: E731
    assert s.take_ahead_job(anything, after=1) is None, "behind uid 1, uid 2 would run a third job"
    taken = s.take_ahead_job(anything, after=3)
    assert taken is not None and taken.job_id == 5
    s.hand_over(3, 0, 5, 1.0)
    assert s.limits.by_user[("q", 2)].running == 2
    assert s.take_ahead_job(anything, after=1).job_id == 6, "a queue without limits: behind anyone"


def test_a_job_only_down_nodes_could_hold_waits_for_them_by_name_and_starts_once_they_are_back():
    s = sched_with(nodes=3)  # 4 cores a node
    s.graph.set_down(2)
    s.enqueue(job(1, nslots=3, nnodes=3))  # one task on each of 3 nodes
    s.enqueue(job(2, nslots=9))  # more cores than the nodes that are up have
    s.enqueue(job(3, nslots=8, limit=1.0))  # fits on the two that are up
    assert started(s.schedule(0.0)) == [(3, 0)]
    assert s.reason_of(1) == s.reason_of(2) == "NodesDown: 2"
    s.graph.set_down(1)
    assert s.reason_of(1) == "NodesDown: 1-2"
    s.graph.set_up(1)
    s.graph.set_up(2)
    s.release(3, 0, 1.0)
    assert started(s.schedule(1.0)) == [(1, 0), (2, 0)]
