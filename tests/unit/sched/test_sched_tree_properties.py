"""Hypothesis properties of the topology-aware matcher on random topologies.

Random graphs with zone/rack levels (ranks joining out of order, nodes skipping levels, GPUs with
and without socket affinity, memory per socket), random resource trees (levels, nodes, slots or
socket-bound units, exclusive anywhere), random alloc/free/drain/down sequences:
  * never over-allocate (accounting per node, socket and group vertex equals a recount);
  * locality holds (tasks under exactly `count` vertices per level, nodes and slots per vertex);
  * exclusive holds at every level (racks, nodes, sockets: nobody else touches them);
  * free restores the exact state, match is pure;
  * check_feasible passes exactly when the walk succeeds on the empty graph;
  * the bitmask fast paths and the pruned walk choose exactly what a plain depth-first walk
    of the networkx containment graph chooses (treegen.reference_match);
  * the scheduler (EASY backfill, reservations) runs tree jobs without overlap, all of them.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.sched import POLICIES, InfeasibleRequest, Request, SchedJob, Scheduler
from broker.sched.walk import match_tree

from treegen import (build, check_accounting, check_aggregates, check_no_overlap, check_tree_shape,
                     empty_graph_match, end_next, flat_requests, free_everything, note_promises, reference_match,
                     topologies, tree_requests)

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def any_request(draw, levels, bad_levels=False):
    if draw(st.booleans()):
        return draw(tree_requests(levels, bad_levels))
    return draw(flat_requests())


def picks_of(alloc):
    return None if alloc is None else {r: len(ra.slots) for r, ra in alloc.items()}


@pytest.mark.slow  # several seconds: the slow tier
@settings(SETTINGS, max_examples=150)
@given(topologies(), st.data())
def test_random_tree_sequences_keep_every_invariant(topology, data):
    graph = build(topology)
    levels, specs = topology
    ranks = [s["rank"] for s in specs]
    initial = graph.snapshot()
    live, requests = {}, {}
    for n in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["alloc", "alloc", "alloc", "free", "health"]))
        if op == "alloc":
            req = any_request(data.draw, levels)
            policy = data.draw(st.sampled_from(POLICIES))
            usable = {r for r, node in graph.nodes.items() if node.usable}
            before = graph.snapshot()
            alloc = graph.match(req, policy)
            assert graph.snapshot() == before  # a pure query
            assert graph.fits(req, policy) == (alloc is not None)
            if alloc is None:
                continue
            check_tree_shape(graph, req, alloc, usable)
            graph.alloc(n, alloc)
            live[n], requests[n] = alloc, req
            if n % 3 == 0:  # free restores the exact state
                graph.free(n)
                del live[n]
                assert graph.snapshot() == before
        elif op == "free" and live:
            key = data.draw(st.sampled_from(sorted(live)))
            graph.free(key)
            del live[key]
        elif op == "health":
            _health(graph, data.draw(st.sampled_from(ranks)), data.draw(st.integers(0, 3)))
        check_no_overlap(graph, live)
        check_accounting(graph, live)
    free_everything(graph, live, initial)


def _health(graph, rank, what):
    [lambda: graph.drain(rank, "t"), lambda: graph.undrain(rank), lambda: graph.set_down(rank),
     lambda: graph.set_up(rank)][what]()


@pytest.mark.slow  # several seconds: the slow tier
@settings(SETTINGS, max_examples=200)
@given(topologies(), st.data())
def test_feasible_exactly_when_the_walk_succeeds_on_the_empty_graph(topology, data):
    graph = build(topology)
    levels, _ = topology
    req = any_request(data.draw, levels, bad_levels=True)
    policy = data.draw(st.sampled_from(POLICIES))
    alloc = empty_graph_match(graph, req, policy)
    if alloc is not None:
        check_tree_shape(graph, req, alloc, set(graph.nodes))
        graph.alloc("job", alloc)
        check_accounting(graph, {"job": alloc})


@pytest.mark.slow  # several seconds: the slow tier
@settings(SETTINGS, max_examples=200)
@given(topologies(), st.data())
def test_matcher_chooses_what_a_plain_walk_of_the_graph_chooses(topology, data):
    """Bitmask fast paths (flat requests) and the pruned walk (trees) against treegen's reference:
    a depth-first walk over graph.graph with no aggregates, no indexes and no pruning."""
    graph = build(topology)
    levels, specs = topology
    live = {}
    for n in range(data.draw(st.integers(0, 8))):  # a partly used, partly drained graph
        alloc = graph.match(data.draw(flat_requests()), data.draw(st.sampled_from(POLICIES)))
        if alloc is not None:
            graph.alloc(n, alloc)
            live[n] = alloc
    for _ in range(data.draw(st.integers(0, 2))):
        _health(graph, data.draw(st.sampled_from([s["rank"] for s in specs])), 0)
    req = any_request(data.draw, levels)
    policy = data.draw(st.sampled_from(POLICIES))
    expected = reference_match(graph, req, policy)
    assert picks_of(graph.match(req, policy)) == expected
    if not req.tree:  # the flat fast paths and the general walk agree with each other too
        assert picks_of(match_tree(graph, req, policy)) == expected


@settings(SETTINGS, max_examples=60)
@given(topologies(max_nodes=5), st.data())
def test_scheduler_runs_tree_jobs_with_easy_backfill(topology, data):
    """Every feasible job (trees, exclusive racks, socket-bound units, flat jobs, arrays) runs;
    no overlap; the reserved head starts no later than first promised; the graph ends as it began."""
    graph = build(topology)
    levels, _ = topology
    sched = Scheduler(graph, policy=data.draw(st.sampled_from(POLICIES)))
    limits, total = {}, 0
    for job_id in range(data.draw(st.integers(1, 10))):
        req = any_request(data.draw, levels)
        try:
            graph.check_feasible(req)
        except InfeasibleRequest:
            continue
        count = data.draw(st.sampled_from([1, 1, 3])) if req.total_slots == 1 else 1
        limits[job_id] = float(data.draw(st.sampled_from([1, 5, 20])))
        sched.enqueue(SchedJob(job_id, urgency=data.draw(st.sampled_from([8, 16])),
                               request=req, time_limit=limits[job_id], count=count,
                               policy=data.draw(st.sampled_from([None, "pack", "locality-first"]))))
        total += count
    initial = graph.snapshot()
    now, ends, running, promised, started = 0.0, {}, {}, {}, {}
    for _ in range(4 * total + 20):
        for s in sched.schedule(now):
            key = (s.job_id, s.element)
            running[key] = s.allocation
            ends[key] = now + limits[s.job_id]
            started.setdefault(s.job_id, now)
        check_no_overlap(graph, running)
        check_accounting(graph, running)
        note_promises(sched, limits, promised)
        if not ends:
            break
        now = end_next(sched, ends, running)
    assert sched.pending_count() == 0 and not running
    assert sum(1 for _ in started) == len(limits)
    for job_id, estimate in promised.items():
        assert started[job_id] <= estimate + 1e-9
    check_aggregates(graph)
    assert graph.snapshot() == initial


@settings(SETTINGS, max_examples=60)
@given(topologies(), st.data())
def test_released_and_redescribed_ranks_keep_aggregates_exact(topology, data):
    """Re-adding a rank with another rack, removing ranks: the group vertices follow."""
    graph = build(topology)
    _levels, specs = topology
    live = {}
    for n in range(data.draw(st.integers(0, 5))):
        alloc = graph.match(data.draw(flat_requests()))
        if alloc is not None:
            graph.alloc(n, alloc)
            live[n] = alloc
    spec = dict(data.draw(st.sampled_from(specs)))
    spec["properties"] = {**spec["properties"], "rack": data.draw(st.sampled_from(["r0", "r9"]))}
    graph.add_rank(**spec)
    check_aggregates(graph)
    for rank in data.draw(st.lists(st.sampled_from([s["rank"] for s in specs]), unique=True)):
        graph.remove_rank(rank)
        check_aggregates(graph)
    assert all(g.nodes for p, g in graph.groups.items() if p)  # empty groups are dropped
    req = Request()
    if graph.nodes:
        assert graph.match(req) is not None or graph.cluster.free_cores == 0
