"""The array fast path: graph.alloc_array, the light free, release_many, Start/Allocation."""
import dataclasses

import pytest

from broker.sched import Allocation, RankAlloc, Request, ResourceGraph, SchedJob, Scheduler, Slot, Start

from conftest import add_node, make_graph


def one_by_one(graph, keys, req, policy="first-fit"):
    out = []
    for key in keys:
        alloc = graph.match(req, policy)
        if alloc is None:
            break
        graph.alloc(key, alloc)
        out.append(alloc)
    return out


def cores_of(allocs):
    return [(r, c) for a in allocs for r, s in a.task_slots() for c in s.cores]


def test_array_fills_each_node_in_one_pass_like_first_fit():
    graph = make_graph(4, cores=64)
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(1, count=1000))
    starts = sched.schedule(0.0)
    assert [(s.job_id, s.element) for s in starts] == [(1, e) for e in range(256)]
    assert cores_of(s.allocation for s in starts) == [(r, c) for r in range(4) for c in range(64)]
    assert graph.cluster.free_cores == 0 and sched.running_count() == 256
    assert sched.pending_count() == 1000 - 256


def test_alloc_array_equals_one_match_per_key_cross_socket_and_memory():
    # sockets of 3 cores, 2-core slots: one slot per socket, then one spanning both
    for policy in ("first-fit", "pack", "spread", "low-id", "high-id"):
        req = Request(cores_per_slot=2, mem_per_slot=300)
        a, b = make_graph(3, cores=6, memory_mb=1000), make_graph(3, cores=6, memory_mb=1000)
        keys = [("a", i) for i in range(20)]
        expected = one_by_one(a, keys, req, policy)
        got = b.alloc_array(keys, req, policy)
        assert len(got) == len(expected) == 9  # memory caps each node at 3
        if policy == "spread":
            assert sorted(map(repr, got)) == sorted(map(repr, expected))
        else:
            assert got == expected
        assert a.snapshot() == b.snapshot()
        assert [s.cores for r, s in got[0].task_slots()] in ([(0, 1)], [(3, 4)])


def test_spread_array_goes_round_robin():
    graph = make_graph(4, cores=4)
    got = graph.alloc_array([("s", i) for i in range(6)], Request(), "spread")
    per_node = sorted(r for a in got for r in a)
    assert per_node == [0, 0, 1, 1, 2, 3]


def test_limit_and_constraints_and_full_cluster():
    graph = ResourceGraph()
    for rank in range(4):
        add_node(graph, rank, properties={"zone": "ab"[rank % 2]})
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(1, request=Request.from_strings(["zone=b"]), count=50))
    first = sched.schedule(0.0, limit=3)
    assert [s.element for s in first] == [0, 1, 2]
    rest = sched.schedule(0.0)
    assert [s.element for s in rest] == [3, 4, 5, 6, 7]
    assert {r for s in first + rest for r in s.allocation} == {1, 3}
    assert sched.schedule(1.0) == []


def test_alloc_array_rejects_what_it_does_not_handle(graph4):
    for req in (Request(nslots=2), Request(exclusive=True), Request(gpus_per_slot=1)):
        with pytest.raises(ValueError, match="one-slot"):
            graph4.alloc_array([("x", 0)], req)
    graph4.alloc_array([("x", 0)], Request())
    with pytest.raises(ValueError, match="already holds"):
        graph4.alloc_array([("x", 1), ("x", 0)], Request())
    assert graph4.held_cores(("x", 1)) == 0


def test_gpu_and_exclusive_arrays_take_the_general_path():
    graph = make_graph(2, cores=4, gpus=2)
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(1, request=Request(gpus_per_slot=1), count=10))
    sched.enqueue(SchedJob(2, request=Request(exclusive=True), count=2, submit_time=1.0))
    starts = sched.schedule(0.0)
    assert [(s.job_id, s.element) for s in starts] == [(1, e) for e in range(4)]
    for s in starts:
        sched.release(s.job_id, s.element, 1.0)
    assert graph.cluster.free_cores == 8


def test_free_after_rank_redescribed_or_removed():
    graph = make_graph(2, cores=4)
    cl = graph.cluster
    before = graph.summary(), cl.free_cores, cl.avail.bit_count(), cl.idle.bit_count()
    graph.alloc_array([("a", i) for i in range(8)], Request())
    add_node(graph, 0, cores=8, hostname="bigger")  # holds on 0 carried to the new node
    assert graph.nodes[0].free_cores == 4
    for i in range(4):
        graph.free(("a", i))
    assert graph.nodes[0].free_cores == 8
    graph.remove_rank(1)
    add_node(graph, 1)  # a new node: must not be credited by the free below
    for i in range(4, 8):
        graph.free(("a", i))
    assert graph.nodes[1].free_cores == 4
    add_node(graph, 0)
    # (rank 1 came back at a new position, so compare counts, not index bits)
    assert (graph.summary(), cl.free_cores, cl.avail.bit_count(), cl.idle.bit_count()) == before


def test_drained_and_down_nodes_account_exactly_on_fast_free():
    graph = make_graph(2, cores=4)
    before = graph.snapshot()
    graph.alloc_array([("a", i) for i in range(8)], Request())
    graph.drain(0, "maint")
    graph.set_down(1)
    for i in range(8):
        graph.free(("a", i))
    assert graph.cluster.free_cores == 0
    graph.undrain(0)
    graph.set_up(1)
    assert graph.snapshot() == before


def test_release_many_equals_release_one_by_one():
    a, b = Scheduler(make_graph(4, cores=8)), Scheduler(make_graph(4, cores=8))
    for s in (a, b):
        s.enqueue(SchedJob(1, count=100, request=Request(mem_per_slot=10)))
        s.enqueue(SchedJob(2, request=Request(nslots=3, nnodes=3), submit_time=1.0))
    starts = a.schedule(0.0)
    assert starts == b.schedule(0.0)
    victims = [(s.job_id, s.element) for s in starts[::3]]
    for key in victims:
        a.release(*key, 1.0)
    b.release_many(victims, 1.0)
    assert a.graph.snapshot() == b.graph.snapshot()
    assert a.running_count() == b.running_count()
    with pytest.raises(KeyError):
        b.release_many([victims[0]], 2.0)
    with pytest.raises(KeyError):
        b.graph.free_many([(1, 1), (1, 1)])
    assert a.schedule(2.0) == b.schedule(2.0)


def test_start_and_allocation_accessors():
    start = Start(3, 4, Allocation({1: RankAlloc((Slot((2,)),))}))
    assert (start.job_id, start.element) == (3, 4) and start == Start(3, 4, start.allocation)
    with pytest.raises(AttributeError):
        start.element = 5  # type: ignore[misc]
    assert not dataclasses.is_dataclass(start)
    alloc = start.allocation
    assert alloc.task_slots() == [(1, Slot((2,)))] and alloc.tasks == ((1, Slot((2,))),)
    alloc.task_slots().clear()  # a fresh list each time
    assert alloc.task_slots() == [(1, Slot((2,)))]


def test_array_elements_share_interned_allocations_between_generations():
    graph = make_graph(1, cores=2)
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(1, count=4))
    first = sched.schedule(0.0)
    for s in first:
        sched.release(s.job_id, s.element, 1.0)
    second = sched.schedule(1.0)
    assert [s.element for s in second] == [2, 3]
    assert [s.allocation for s in second] == [s.allocation for s in first]
    assert all(x.allocation is y.allocation for x, y in zip(first, second, strict=True))
