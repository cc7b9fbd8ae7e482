"""Property-based tests: random graphs and random alloc/free/health sequences."""
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.sched import POLICIES, InfeasibleRequest, Request, ResourceGraph, SchedJob, Scheduler

from treegen import empty_graph_match, end_next, free_everything, note_promises

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROPS = [{}, {"zone": "a"}, {"zone": "b"}, {"zone": "a", "spot": ""}, {"gpu": "h100"}]
CONSTRAINTS = [(), (("zone", frozenset({"a"})),), (("zone", frozenset({"a", "b"})),),
               (("spot", frozenset()),), (("gpu", frozenset({"h100"})),)]


@st.composite
def node_specs(draw):
    nsockets = draw(st.integers(1, 2))
    per = draw(st.integers(1, 4))
    first = draw(st.integers(0, 3))  # core ids need not start at 0
    sockets = {s: tuple(range(first + s * per, first + (s + 1) * per)) for s in range(nsockets)}
    return dict(sockets=sockets, gpus=tuple(range(draw(st.integers(0, 3)))),
                memory_mb=draw(st.sampled_from([0, 1000, 4000])),
                properties=draw(st.sampled_from(PROPS)))


@st.composite
def requests(draw):
    nslots = draw(st.integers(1, 8))
    nnodes = draw(st.integers(0, min(nslots, 4)))
    spn = 0
    if not nnodes and draw(st.booleans()):
        spn = draw(st.sampled_from([d for d in range(1, nslots + 1) if nslots % d == 0]))
    return Request(nslots=nslots, nnodes=nnodes, slots_per_node=spn,
                   cores_per_slot=draw(st.integers(1, 3)), gpus_per_slot=draw(st.integers(0, 1)),
                   mem_per_slot=draw(st.sampled_from([0, 0, 500])),
                   exclusive=draw(st.integers(0, 4)) == 0,
                   constraints=draw(st.sampled_from(CONSTRAINTS)))


ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), requests(), st.sampled_from(POLICIES)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.sampled_from(["drain", "undrain", "down", "up"]), st.integers(0, 5)),
), max_size=30)


def build(specs):
    graph = ResourceGraph()
    for rank, spec in enumerate(specs):
        graph.add_rank(rank, hostname=f"n{rank}", **spec)
    return graph


def satisfies(props, constraints):
    return all(k in props and (not allowed or props[k] in allowed) for k, allowed in constraints)


def check_shape(graph, req, alloc, usable):
    assert alloc.nslots == req.nslots and alloc.exclusive == req.exclusive
    per_node = [len(alloc[r].slots) for r in alloc]
    assert min(per_node) >= 1
    counts = req.node_counts()
    if counts:
        assert sorted(per_node, reverse=True) == list(counts)
    for rank in alloc:
        assert rank in usable
        assert satisfies(graph.nodes[rank].properties, req.constraints)
        for slot in alloc[rank].slots:
            assert len(slot.cores) == req.cores_per_slot
            assert len(slot.gpus) == req.gpus_per_slot
            assert slot.memory_mb == req.mem_per_slot


def check_no_overlap(graph, live):
    """No core/gpu in two live allocations; exclusive ranks are not shared at all."""
    owners = Counter()
    exclusive_ranks = Counter()
    for alloc in live.values():
        for rank in alloc:
            if alloc.exclusive:
                exclusive_ranks[rank] += 1
            for slot in alloc[rank].slots:
                owners.update(("c", rank, c) for c in slot.cores)
                owners.update(("g", rank, g) for g in slot.gpus)
    assert not [k for k, n in owners.items() if n > 1]
    for rank, n in exclusive_ranks.items():
        sharing = sum(1 for a in live.values() if rank in a)
        assert n == 1 and sharing == 1


def check_accounting(graph, live):
    """Free counts equal totals minus what live allocations hold; never negative."""
    for rank, node in graph.nodes.items():
        cores = gpus = mem = 0
        for alloc in live.values():
            if rank in alloc:
                if alloc.exclusive:
                    cores, gpus, mem = node.total_cores, node.total_gpus, node.total_mem
                else:
                    cores += sum(len(s.cores) for s in alloc[rank].slots)
                    gpus += sum(len(s.gpus) for s in alloc[rank].slots)
                    mem += sum(s.memory_mb for s in alloc[rank].slots)
        assert node.free_cores == node.total_cores - cores >= 0
        assert node.free_gpus == node.total_gpus - gpus >= 0
        assert node.free_mem == node.total_mem - mem >= 0
        assert node.free_cores == sum(s.cores_free.bit_count() for s in node.sockets)
    usable = [n for n in graph.nodes.values() if n.usable]
    assert graph.cluster.free_cores == sum(n.free_cores for n in usable)
    assert graph.cluster.free_mem == sum(n.free_mem for n in usable)


@settings(SETTINGS, max_examples=120)
@given(st.lists(node_specs(), min_size=1, max_size=6), ops)
def test_random_sequences_keep_every_invariant(specs, operations):
    graph = build(specs)
    initial = graph.snapshot()
    live = {}
    for n, op in enumerate(operations):
        if op[0] == "alloc":
            _, req, policy = op
            usable = {r for r, node in graph.nodes.items() if node.usable}
            before = graph.snapshot()
            alloc = graph.match(req, policy)
            assert graph.snapshot() == before  # match is a pure query
            if alloc is None:
                continue
            check_shape(graph, req, alloc, usable)
            graph.alloc(n, alloc)
            live[n] = alloc
            if n % 3 == 0:  # free restores the exact state
                graph.free(n)
                del live[n]
                assert graph.snapshot() == before
        elif op[0] == "free":
            if live:
                key = sorted(live)[op[1] % len(live)]
                graph.free(key)
                del live[key]
        else:
            rank = op[1] % len(specs)
            {"drain": lambda r: graph.drain(r, "test"), "undrain": graph.undrain,
             "down": graph.set_down, "up": graph.set_up}[op[0]](rank)
        check_no_overlap(graph, live)
        check_accounting(graph, live)
    free_everything(graph, live, initial)


@SETTINGS
@given(st.lists(node_specs(), min_size=1, max_size=6), requests(), st.sampled_from(POLICIES))
def test_feasible_exactly_when_it_matches_on_an_empty_graph(specs, req, policy):
    graph = build(specs)
    alloc = empty_graph_match(graph, req, policy)
    if alloc is not None:
        check_shape(graph, req, alloc, set(graph.nodes))
        graph.alloc("job", alloc)
        check_accounting(graph, {"job": alloc})


@SETTINGS
@given(st.lists(node_specs(), min_size=1, max_size=5),
       st.lists(st.tuples(requests(), st.integers(1, 3), st.integers(1, 50)), min_size=1,
                max_size=12))
def test_every_feasible_job_eventually_runs(specs, jobs):
    graph = build(specs)
    sched = Scheduler(graph, default_time_limit=10.0)
    expected = 0
    for job_id, (req, count, limit) in enumerate(jobs):
        try:
            graph.check_feasible(req)
        except InfeasibleRequest:
            continue
        sched.enqueue(SchedJob(job_id, submit_time=float(job_id), request=req,
                               time_limit=float(limit), count=count))
        expected += count
    now, running, done = 0.0, {}, 0
    for _ in range(10 * expected + 10):
        for start in sched.schedule(now):
            running[(start.job_id, start.element)] = start.allocation
        check_no_overlap(graph, running)
        if not running:
            break
        key = min(running)  # jobs end in some order: oldest job first
        sched.release(*key, now)
        del running[key]
        done += 1
        now += 1.0
    assert done == expected and sched.pending_count() == 0


@settings(SETTINGS, max_examples=150)
@given(st.lists(node_specs(), min_size=1, max_size=3),
       st.lists(st.tuples(requests(), st.sampled_from([1, 5, 20, 100]), st.integers(0, 1)),
                min_size=2, max_size=20))
@pytest.mark.slow  # several seconds: the slow tier
def test_easy_backfill_never_delays_the_reserved_head(specs, jobs):
    """Jobs run exactly their time limit; the head starts no later than first promised."""
    graph = build(specs)
    sched = Scheduler(graph)
    limits = {}
    for job_id, (req, limit, urgency) in enumerate(jobs):
        try:
            graph.check_feasible(req)
        except InfeasibleRequest:
            continue
        sched.enqueue(SchedJob(job_id, urgency=8 * urgency, submit_time=0.0, request=req,
                               time_limit=float(limit)))
        limits[job_id] = float(limit)
    now, ends, promised, started_at = 0.0, {}, {}, {}
    for _ in range(200):
        for start in sched.schedule(now):
            started_at[start.job_id] = now
            ends[(start.job_id, start.element)] = now + limits[start.job_id]
        note_promises(sched, range(len(jobs)), promised)
        if not ends:
            break
        now = end_next(sched, ends)
    assert sched.pending_count() == 0
    for job_id, estimate in promised.items():
        assert started_at[job_id] <= estimate + 1e-9, (job_id, started_at[job_id], estimate)


# ------------------------------------------------------------ the array fast path

NON_SPREAD = tuple(p for p in POLICIES if p != "spread")


@st.composite
def element_requests(draw):
    """What the array fast path handles: one CPU-only, non-exclusive slot."""
    return Request(cores_per_slot=draw(st.integers(1, 3)),
                   mem_per_slot=draw(st.sampled_from([0, 0, 500])),
                   constraints=draw(st.sampled_from(CONSTRAINTS)))


def slots_of(allocs):
    return Counter((r, s) for a in allocs for r, s in a.task_slots())


@settings(SETTINGS, max_examples=150)
@given(st.lists(node_specs(), min_size=1, max_size=5),
       st.lists(st.tuples(requests(), st.sampled_from(POLICIES)), max_size=8),
       st.lists(st.integers(0, 4), max_size=2), element_requests(), st.sampled_from(POLICIES),
       st.integers(1, 40), st.integers(0, 40))
@pytest.mark.slow  # several seconds: the slow tier
def test_alloc_array_is_one_match_and_alloc_per_element(specs, prior, drained, req, policy,
                                                         count, split):
    """Same allocations (spread: same multiset) and state as a loop of match + alloc."""
    slow, fast = build(specs), build(specs)
    live = {}
    for n, (prior_req, prior_policy) in enumerate(prior):
        alloc = slow.match(prior_req, prior_policy)
        if alloc is not None:
            slow.alloc(n, alloc)
            fast.alloc(n, alloc)
            live[n] = alloc
    for rank in drained:
        for graph in (slow, fast):
            graph.drain(rank % len(specs), "test")
    before = fast.snapshot()
    keys = [("array", i) for i in range(count)]
    expected = []
    for key in keys:
        alloc = slow.match(req, policy)
        if alloc is None:
            break
        slow.alloc(key, alloc)
        expected.append(alloc)
    got = fast.alloc_array(keys, req, policy)
    if policy == "spread":  # elements are numbered node by node within one pass
        assert slots_of(got) == slots_of(expected) and len(got) == len(expected)
    else:
        assert got == expected
    assert fast.snapshot() == slow.snapshot()
    live.update(zip(keys, got, strict=False))
    check_no_overlap(fast, live)
    check_accounting(fast, live)
    done = keys[:len(got)]
    fast.free_many(done[:split])
    for key in done[split:]:
        fast.free(key)
    assert fast.snapshot() == before


@st.composite
def mixed_jobs(draw, policies):
    """Arrays of fast-path elements mixed with gangs, exclusive and GPU jobs."""
    req = draw(st.one_of(element_requests(), requests()))
    return (req, draw(st.sampled_from([1, 2, 5, 30])), draw(st.integers(1, 60)),
            draw(st.integers(0, 1)), draw(st.sampled_from(policies)))


def enqueue_all(scheds, jobs):
    count = 0
    for job_id, (req, n, limit, urgency, policy) in enumerate(jobs):
        try:
            scheds[0].graph.check_feasible(req)
        except InfeasibleRequest:
            continue
        for sched in scheds:
            sched.enqueue(SchedJob(job_id, urgency=8 * urgency, submit_time=float(job_id),
                                   request=req, time_limit=float(limit), policy=policy, count=n))
        count += n
    return count


@settings(SETTINGS, max_examples=80)
@given(st.lists(node_specs(), min_size=1, max_size=4),
       st.lists(mixed_jobs(NON_SPREAD), min_size=1, max_size=10), st.data())
@pytest.mark.slow  # several seconds: the slow tier
def test_array_fast_path_schedules_exactly_like_one_match_per_element(specs, jobs, data):
    """Same starts (ids, elements, allocations), reservations and state, cycle by cycle,
    through limits, drains, EASY backfill and releases in random order."""
    fast, slow = Scheduler(build(specs)), Scheduler(build(specs))
    slow.array_fast_path = False
    total = enqueue_all((fast, slow), jobs)
    initial = fast.graph.snapshot()
    now, running, done = 0.0, {}, 0
    for _ in range(4 * total + 20):
        limit = data.draw(st.sampled_from([None, None, 1, 3]))
        starts = fast.schedule(now, limit)
        assert starts == slow.schedule(now, limit)
        for job_id in range(len(jobs)):
            assert fast.estimated_start(job_id) == slow.estimated_start(job_id)
        running.update({(s.job_id, s.element): s.allocation for s in starts})
        check_no_overlap(fast.graph, running)
        check_accounting(fast.graph, running)
        assert fast.graph.snapshot() == slow.graph.snapshot()
        if data.draw(st.integers(0, 9)) == 0:
            rank = data.draw(st.integers(0, len(specs) - 1))
            drain = fast.graph.nodes[rank].drain_reason is None
            for sched in (fast, slow):
                sched.graph.drain(rank, "t") if drain else sched.graph.undrain(rank)
        if not running:
            if not fast.pending_count() or limit is None:
                break
            continue
        keys = sorted(running)
        picked = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys),
                                    unique=True))
        for key in picked:
            slow.release(*key, now)
            del running[key]
        fast.release_many(picked, now)
        done += len(picked)
        now += data.draw(st.sampled_from([0.0, 1.0, 30.0]))
    for rank in fast.graph.nodes:
        fast.graph.undrain(rank)
    for key in list(running):
        fast.release(*key, now)
    assert fast.graph.snapshot() == initial


@settings(SETTINGS, max_examples=80)
@given(st.lists(node_specs(), min_size=1, max_size=4),
       st.lists(mixed_jobs(POLICIES), min_size=1, max_size=10), st.data())
def test_arrays_mixed_with_gang_and_exclusive_jobs_never_overlap(specs, jobs, data):
    """Every policy (spread included): no shared core/GPU, exclusive nodes unshared,
    exact accounting, every element runs, and freeing everything restores the graph."""
    sched = Scheduler(build(specs), default_time_limit=10.0)
    total = enqueue_all((sched,), jobs)
    initial = sched.graph.snapshot()
    now, running, done = 0.0, {}, 0
    for _ in range(4 * total + 20):
        for start in sched.schedule(now):
            key = (start.job_id, start.element)
            assert key not in running
            running[key] = start.allocation
        check_no_overlap(sched.graph, running)
        check_accounting(sched.graph, running)
        if not running:
            break
        keys = sorted(running)
        picked = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys),
                                    unique=True))
        if data.draw(st.booleans()):
            sched.release_many(picked, now)
        else:
            for key in picked:
                sched.release(*key, now)
        for key in picked:
            del running[key]
        done += len(picked)
        now += 1.0
    assert done == total and sched.pending_count() == 0
    assert sched.graph.snapshot() == initial
