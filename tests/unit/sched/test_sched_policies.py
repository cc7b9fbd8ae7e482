"""Node-selection policies: first-fit, pack, spread, low-id, high-id."""
import pytest

from broker.sched import POLICIES, Request, ResourceGraph, Scheduler, SchedJob, check_policy

from conftest import add_node, make_graph


def used(graph, rank, cores):
    """Occupy `cores` cores of `rank` under a unique key."""
    from broker.sched import Allocation, RankAlloc, Slot
    graph.alloc(("pre", rank), Allocation({rank: RankAlloc((Slot(tuple(range(cores))),))}))


@pytest.fixture
def loaded():
    """Four 4-core nodes with 0, 3, 1, 2 cores in use."""
    graph = make_graph(4)
    used(graph, 1, 3)
    used(graph, 2, 1)
    used(graph, 3, 2)
    return graph


def ranks(alloc):
    return [(r, len(alloc[r].slots)) for r in alloc]


def test_policy_names_and_errors():
    assert POLICIES == ("first-fit", "pack", "spread", "low-id", "high-id", "locality-first")
    with pytest.raises(ValueError,
                       match="valid policies: first-fit, pack, spread, low-id, high-id"):
        check_policy("best")
    with pytest.raises(ValueError, match="unknown scheduling policy 'best'"):
        make_graph(1).match(Request(), "best")
    with pytest.raises(ValueError, match="valid policies"):
        Scheduler(make_graph(1), policy="fifo")
    with pytest.raises(ValueError, match="valid policies"):
        SchedJob(1, policy="nope")


def test_first_fit_takes_lowest_graph_order(loaded):
    assert ranks(loaded.match(Request(nslots=1), "first-fit")) == [(0, 1)]
    assert ranks(loaded.match(Request(nslots=6), "first-fit")) == [(0, 4), (1, 1), (2, 1)]


def test_pack_prefers_most_used_node_that_fits(loaded):
    assert ranks(loaded.match(Request(nslots=1), "pack")) == [(1, 1)]
    assert ranks(loaded.match(Request(nslots=1, cores_per_slot=2), "pack")) == [(3, 1)]
    # 6 slots: fill rank 1 (1 free), rank 3 (2), rank 2 (3) before opening rank 0
    assert ranks(loaded.match(Request(nslots=6), "pack")) == [(1, 1), (2, 3), (3, 2)]


def test_spread_one_slot_per_least_used_node_first(loaded):
    assert ranks(loaded.match(Request(nslots=1), "spread")) == [(0, 1)]
    assert ranks(loaded.match(Request(nslots=3), "spread")) == [(0, 1), (2, 1), (3, 1)]
    assert ranks(loaded.match(Request(nslots=6), "spread")) == [(0, 2), (1, 1), (2, 2), (3, 1)]


def test_first_fit_low_and_high_id_follow_rank_not_insertion_order():
    graph = ResourceGraph()
    for rank in (5, 2, 9, 0):  # joined out of order: graph order differs from rank order
        add_node(graph, rank)
    assert ranks(graph.match(Request(), "first-fit")) == [(0, 1)]
    assert ranks(graph.match(Request(nslots=3, nnodes=3), "first-fit")) == [(0, 1), (2, 1), (5, 1)]
    assert ranks(graph.match(Request(nslots=6), "first-fit")) == [(0, 4), (2, 2)]
    assert ranks(graph.match(Request(), "low-id")) == [(0, 1)]
    assert ranks(graph.match(Request(), "high-id")) == [(9, 1)]
    assert ranks(graph.match(Request(nslots=5), "high-id")) == [(5, 1), (9, 4)]
    assert ranks(graph.match(Request(nslots=2, nnodes=2), "low-id")) == [(0, 1), (2, 1)]


def test_policies_with_fixed_node_count(loaded):
    req = Request(nslots=4, nnodes=2)
    assert ranks(loaded.match(req, "first-fit")) == [(0, 2), (2, 2)]
    assert ranks(loaded.match(req, "pack")) == [(2, 2), (3, 2)]
    assert ranks(loaded.match(req, "spread")) == [(0, 2), (2, 2)]
    assert ranks(loaded.match(req, "high-id")) == [(2, 2), (3, 2)]


def test_per_job_policy_overrides_instance_default():
    graph = make_graph(4)
    used(graph, 2, 1)
    sched = Scheduler(graph, policy="first-fit")
    sched.enqueue(SchedJob(1, request=Request(), policy="pack"))
    sched.enqueue(SchedJob(2, submit_time=1, request=Request()))
    starts = sched.schedule(0.0)
    assert [(s.job_id, list(s.allocation)) for s in starts] == [(1, [2]), (2, [0])]
