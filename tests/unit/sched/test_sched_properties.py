"""Property-based tests: random graphs and random alloc/free/health sequences."""
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.sched import POLICIES, InfeasibleRequest, Request, ResourceGraph, SchedJob, Scheduler

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
            {"drain": lambda: graph.drain(rank, "test"), "undrain": lambda: graph.undrain(rank),
             "down": lambda: graph.set_down(rank), "up": lambda: graph.set_up(rank)}[op[0]]()
        check_no_overlap(graph, live)
        check_accounting(graph, live)
    for key in list(live):
        graph.free(key)
    for rank in graph.nodes:
        graph.set_up(rank)
        graph.undrain(rank)
    assert graph.snapshot() == initial


@SETTINGS
@given(st.lists(node_specs(), min_size=1, max_size=6), requests(), st.sampled_from(POLICIES))
def test_feasible_exactly_when_it_matches_on_an_empty_graph(specs, req, policy):
    graph = build(specs)
    try:
        graph.check_feasible(req)
    except InfeasibleRequest as err:
        assert str(err)
        assert graph.match(req, policy) is None
    else:
        alloc = graph.match(req, policy)
        assert alloc is not None
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
        for job_id in range(len(jobs)):
            estimate = sched.estimated_start(job_id)
            if estimate is not None:
                promised.setdefault(job_id, estimate)
        if not ends:
            break
        now = min(ends.values())
        for key in [k for k, end in ends.items() if end == now]:
            sched.release(*key, now)
            del ends[key]
    assert sched.pending_count() == 0
    for job_id, estimate in promised.items():
        assert started_at[job_id] <= estimate + 1e-9, (job_id, started_at[job_id], estimate)
