"""Topology levels, resource-tree requests, the walk's policies, exclusivity, NUMA, feasibility messages."""
import pytest

from broker.sched import InfeasibleRequest, Request, ResourceGraph, SchedJob, Scheduler
from broker.sched import rebuild_allocation
from broker.sched.walk import match_tree
from minicluster.model import restree


def tree(text, constraints=()):
    return Request.from_shape(restree.shape_of(restree.parse(text)), constraints)


def racks(layout, cores=4, gpus=0, levels=(("zone", "zone"), ("rack", "rack")), memory=2000):
    """layout: {rank: (zone, rack)}; 2 sockets per node, GPUs attached half per socket."""
    graph = ResourceGraph(levels)
    half = cores // 2
    for rank, (zone, rack) in layout.items():
        props = {k: v for k, v in (("zone", zone), ("rack", rack)) if v}
        graph.add_rank(rank, hostname=f"n{rank}", sockets={0: tuple(range(half)),
                                                           1: tuple(range(half, cores))},
                       gpus={0: tuple(range(gpus // 2)), 1: tuple(range(gpus // 2, gpus))},
                       memory_mb=memory, properties=props)
    return graph


TWO_RACKS = {r: ("a", "r0" if r < 3 else "r1") for r in range(6)}


def ranks(alloc):
    return sorted(alloc)


def busy(graph, rank, cores=1):
    """Hold the first `cores` cores of rank under ("busy", rank)."""
    from broker.sched import Allocation, RankAlloc, Slot

    graph.alloc(("busy", rank), Allocation({rank: RankAlloc((Slot(tuple(range(cores))),))}))


# ------------------------------------------------------------------ the tree language

@pytest.mark.parametrize("text, shape", [
    ("rack[1]>node[4]>slot[8]>core[2]", dict(groups=(("rack", 1, False),), nnodes=4, nslots=32,
                                            slots_per_node=8, cores=2)),
    ("node[2]>socket[1]>{core[8],gpu[1]}", dict(nnodes=2, nslots=2, slots_per_node=1, cores=8,
                                                gpus=1, sockets=1, socket_slots=1)),
    ("zone[1]:x>rack[2]>node[1]>slot[1]>{core[1],memory[2G]}",
     dict(groups=(("zone", 1, True), ("rack", 2, False)), nnodes=1, nslots=1, slots_per_node=1,
          memory=2048)),
    ("slot[4]>socket[1]:x>{core[2],gpu[1]}", dict(nslots=4, cores=2, gpus=1, sockets=1,
                                                 socket_exclusive=True)),
    ("socket[2]>slot[3]>core[1]", dict(nslots=6, sockets=1, socket_slots=3)),
    ("cluster[1]>core[4]", dict(nslots=1, cores=4)),
    ("rack[1]:x>node[2]", dict(groups=(("rack", 1, True),), nnodes=2, nslots=2, slots_per_node=1)),
])
def test_trees_reduce_to_the_matchers_chain(text, shape):
    vertices = restree.parse(text)
    assert restree.parse(restree.format_tree(vertices)) == vertices
    assert restree.from_wire(restree.to_wire(vertices)) == vertices
    assert restree.shape_of(vertices) == restree.Shape(**shape)


@pytest.mark.parametrize("text, message", [
    ("node[2]>core[1]x", "unexpected text at position 16"),
    ("node[2", "expected TYPE[COUNT]"),
    ("node[0]", "count must be 1..16777216"),
    ("node[1]>{slot[1]>core[1],socket[1]}", "exactly one kind of vertex"),
    ("node[1]>slot[2]>socket[2]>core[1]", "socket[1] only"),
    ("node[1]>slot[1]>{core[1],core[2]}", "core appears twice"),
    ("node[1]>slot[1]>gpu[1]", "at least one core"),
    ("rack[1]>rack[1]>node[1]", "rack appears twice"),
    ("node[1]>node[1]", "not node"),
    ("node[1]>slot[1]>memory[1x]", "expected TYPE[COUNT]"),
    ("core[2G]", "only memory takes a unit"),
    ("{node[1],node[1]}", "one root"),
    ("Rack[1]>node[1]", "expected TYPE[COUNT]"),
])
def test_bad_trees_are_refused_with_the_reason(text, message):
    with pytest.raises(restree.TreeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        restree.shape_of(restree.parse(text))


def test_wire_form_checks_types():
    with pytest.raises(restree.TreeError, match="count must be an integer"):
        restree.from_wire([{"type": "node", "count": "2"}])
    with pytest.raises(restree.TreeError, match="unknown key"):
        restree.from_wire([{"type": "node", "count": 2, "label": "x"}])
    assert restree.from_wire([{"type": "memory", "count": 2, "unit": "GiB"}])[0].count == 2048


def test_options_are_shorthands_for_trees():
    assert restree.shape_from_options(8, nnodes=4, cores=2, locality="rack") == restree.Shape(
        groups=(("rack", 1, False),), nnodes=4, nslots=8, cores=2)
    assert restree.shape_from_options(8, nnodes=4, spread="rack") == restree.Shape(
        groups=(("rack", 4, False),), nnodes=1, nslots=2)
    assert restree.shape_from_options(3, spread="rack").groups == (("rack", 3, False),)
    assert restree.shape_from_options(2, gpus=1, gpu_affinity=True).sockets == 1
    with pytest.raises(restree.TreeError, match="do not divide evenly"):
        restree.shape_from_options(5, nnodes=2, spread="rack")
    with pytest.raises(restree.TreeError, match="same level"):
        restree.shape_from_options(2, locality="rack", spread="rack")


def test_request_of_a_tree_keeps_the_tree():
    req = tree("zone[1]>rack[2]:x>node[1]>socket[1]:x>slot[2]>core[1]", (("zone", frozenset("a")),))
    assert req.tree and req.total_slots == 4 and req != Request(nslots=4)
    # a tree that says what a flat request says IS that flat request (and takes its fast paths)
    assert tree("core[1]") == Request() and Request().batchable
    assert not tree("socket[1]>core[1]").batchable


# ------------------------------------------------------------------ the model

def test_levels_are_group_vertices_with_aggregates():
    graph = racks({0: ("a", "r0"), 1: ("a", "r0"), 2: ("b", "r0"), 3: (None, "r5"), 4: ("a", None)})
    g = graph.graph
    assert set(g.successors("cluster")) == {(("zone", "a"),), (("zone", "b"),), (("rack", "r5"),)}
    assert set(g.successors((("zone", "a"),))) == {(("zone", "a"), ("rack", "r0")), ("node", 4)}
    # the same rack name under two zones is two vertices
    assert graph.groups[(("zone", "b"), ("rack", "r0"))].mask == 1 << 2
    a = graph.groups[(("zone", "a"),)]
    assert (a.nodes, a.usable_nodes, a.idle_nodes, a.free_cores) == (3, 3, 3, 12)
    busy(graph, 0)
    graph.drain(1, "x")
    assert (a.usable_nodes, a.idle_nodes, a.free_cores) == (2, 1, 7)
    graph.remove_rank(3)
    assert (("rack", "r5"),) not in graph.groups and (("rack", "r5"),) not in g
    graph.add_rank(4, hostname="n4", sockets={0: (0,)}, properties={"zone": "b", "rack": "r0"})
    assert graph.groups[(("zone", "b"), ("rack", "r0"))].nodes == 2 and a.nodes == 2
    assert graph.summary()[-1]["path"] == "zone=b/rack=r0"


def test_memory_is_per_socket_and_flat_slots_spill_over():
    graph = ResourceGraph()
    graph.add_rank(0, hostname="n", sockets={0: (0, 1), 1: (2, 3)}, memory_mb={0: 100, 1: 300})
    first = graph.match(Request(mem_per_slot=150))  # socket 0 has only 100 MB: 50 more from socket 1
    graph.alloc("a", first)
    assert [s.mem_free for s in graph.nodes[0].sockets] == [0, 250]
    assert graph.match(tree("slot[1]>socket[1]>{core[1],memory[200]}"))[0].slots[0].cores == (2,)
    assert graph.match(tree("slot[1]>socket[1]>{core[1],memory[260]}")) is None
    graph.free("a")
    assert graph.nodes[0].free_mem == 400


# ------------------------------------------------------------------ the walk

def test_locality_keeps_a_gang_in_one_rack_and_skips_racks_that_cannot_hold_it():
    graph = racks(TWO_RACKS)
    busy(graph, 1, cores=4)
    req = Request.from_shape(restree.shape_from_options(3, nnodes=3, locality="rack"))
    assert ranks(graph.match(req)) == [3, 4, 5]
    assert ranks(graph.match(Request(nslots=3, nnodes=3))) == [0, 2, 3]  # without locality
    assert graph.match(Request.from_shape(restree.shape_from_options(4, nnodes=4,
                                                                     locality="rack"))) is None


def test_spread_puts_each_node_under_its_own_rack():
    graph = racks({r: ("a", f"r{r % 3}") for r in range(6)})
    alloc = graph.match(Request.from_shape(restree.shape_from_options(6, nnodes=3, spread="rack")))
    assert ranks(alloc) == [0, 1, 2] and all(len(alloc[r].slots) == 2 for r in alloc)


@pytest.mark.parametrize("policy, rack", [
    ("first-fit", "r1"), ("low-id", "r1"), ("high-id", "r2"), ("pack", "r2"), ("spread", "r1"),
    ("locality-first", "r2"),
])
def test_policies_order_the_racks(policy, rack):
    graph = racks({r: ("a", f"r{r // 2}") for r in range(6)})  # r0: 0-1, r1: 2-3, r2: 4-5
    busy(graph, 0, cores=3)
    busy(graph, 1, cores=3)  # r0: 2 free, cannot hold 2 tasks of 2 cores: pruned
    busy(graph, 2, cores=1)  # r1: 7 free
    busy(graph, 5, cores=2)  # r2: 6 free
    alloc = graph.match(tree("rack[1]>slot[2]>core[2]"), policy)
    assert {graph.nodes[r].parent.name for r in alloc} == {rack}


def test_locality_first_prefers_one_rack_then_one_zone_then_anywhere():
    layout = {0: ("a", "r0"), 1: ("a", "r0"), 2: ("a", "r1"), 3: ("a", "r1"), 4: ("b", "r2"),
              5: ("b", "r3")}
    graph = racks(layout)
    busy(graph, 0)
    assert ranks(graph.match(Request(nslots=2, nnodes=2), "locality-first")) == [0, 1]  # best fit
    assert ranks(graph.match(Request(nslots=3, nnodes=3), "locality-first")) == [0, 1, 2]
    assert ranks(graph.match(Request(nslots=5, nnodes=5), "locality-first")) == [0, 1, 2, 3, 4]


def test_exclusive_rack_holds_every_node_of_it():
    graph = racks(TWO_RACKS)
    before = graph.snapshot()
    alloc = graph.match(tree("rack[1]:x>node[1]>slot[2]>core[1]"))
    assert ranks(alloc) == [0] and alloc.held == {1: None, 2: None} and alloc.exclusive
    graph.alloc("x", alloc)
    assert [n.free_cores for n in graph.iter_nodes()] == [0, 0, 0, 4, 4, 4]
    assert ranks(graph.match(tree("rack[1]:x>node[1]"))) == [3]
    graph.free("x")
    assert graph.snapshot() == before
    busy(graph, 2)
    assert ranks(graph.match(tree("rack[1]:x>node[1]"))) == [3]  # r0 is not idle any more
    graph.drain(4, "x")
    assert graph.match(tree("rack[1]:x>node[1]")) is None  # nor is r1 all usable


def test_exclusive_socket_and_gpu_affinity():
    graph = racks({0: ("a", "r0")}, cores=8, gpus=4)
    alloc = graph.match(tree("node[1]>socket[2]:x>slot[1]>{core[2],gpu[1]}"))
    assert alloc.held == {0: (0, 1)} and [s.cores for s in alloc[0].slots] == [(0, 1), (4, 5)]
    graph.alloc("s", alloc)
    assert graph.nodes[0].free_cores == 0 and graph.nodes[0].free_mem == 0
    graph.free("s")
    # GPUs 0-1 hang off socket 0 (cores 0-3), 2-3 off socket 1: two such tasks fit, not three
    aff = graph.match(tree("slot[2]>socket[1]>{core[1],gpu[2]}"))
    for slot in aff[0].slots:
        assert {c // 4 for c in slot.cores} == {g // 2 for g in slot.gpus}
    assert graph.match(tree("slot[3]>socket[1]>{core[1],gpu[2]}")) is None
    assert graph.match(Request(nslots=3, gpus_per_slot=1)) is not None


def test_an_exclusive_socket_per_task_and_k_tasks_per_socket():
    graph = racks({0: ("a", "r0"), 1: ("a", "r0")}, cores=4)  # 2 sockets x 2 cores per node
    alloc = graph.match(tree("slot[2]>socket[1]:x>core[1]"))
    assert alloc[0].slots == (alloc[0].slots[0], alloc[0].slots[1]) and alloc.held == {0: (0, 1)}
    assert [s.cores for s in alloc[0].slots] == [(0,), (2,)]  # one socket each, not both on one
    assert ranks(graph.match(tree("slot[3]>socket[1]:x>core[1]"))) == [0, 1]
    assert graph.match(tree("node[1]>slot[3]>socket[1]:x>core[1]")) is None
    two = graph.match(tree("node[1]>socket[1]>slot[2]>core[1]"))
    assert [s.cores for s in two[0].slots] == [(0,), (1,)]


def test_flat_requests_through_the_walk_equal_the_fast_paths():
    graph = racks(TWO_RACKS, gpus=2)
    busy(graph, 1, cores=3)
    for req in (Request(), Request(nslots=5), Request(nslots=4, nnodes=2), Request(nslots=3, gpus_per_slot=1),
                Request(nslots=2, nnodes=2, exclusive=True)):
        for policy in ("first-fit", "pack", "spread", "high-id"):
            assert match_tree(graph, req, policy) == graph.match(req, policy)


# ------------------------------------------------------------------ feasibility

@pytest.mark.parametrize("text, message", [
    ("pod[1]>node[1]", "no pod level in this MiniCluster; its levels: zone, rack"),
    ("rack[1]>zone[1]>node[1]", "a rack cannot contain a zone: the levels are zone > rack"),
    ("rack[1]>node[4]", "needs 1 rack that holds 4 nodes for 4 tasks of 1 core, the MiniCluster has 0"
                        " (needs 4 nodes, rack r0 has 3)"),
    ("rack[3]>node[1]", "needs 3 racks that each hold 1 node for 1 task of 1 core, the MiniCluster"
                        " has 2"),
    ("zone[1]>rack[3]>node[1]", "needs 1 zone that holds 3 racks of 1 node for 1 task of 1 core,"
                                " the MiniCluster has 0 (zone a has 2 such racks)"),
    ("node[1]>socket[1]>core[3]", "needs 3 cores per task on one socket, the largest socket has 2"),
    ("node[1]>socket[3]>core[1]", "needs 1 node that holds 3 tasks of 1 core on one socket,"
                                  " the MiniCluster has 0"),
])
def test_infeasible_trees_say_why(text, message):
    graph = racks(TWO_RACKS)
    with pytest.raises(InfeasibleRequest) as info:
        graph.check_feasible(tree(text))
    assert str(info.value) == message
    graph.check_feasible(tree("zone[1]>rack[2]>node[3]"))  # drained or busy nodes still count
    assert ResourceGraph().match(tree("core[1]")) is None


def test_feasibility_without_levels_configured():
    graph = ResourceGraph()
    graph.add_rank(0, hostname="n", sockets={0: (0,)})
    with pytest.raises(InfeasibleRequest, match=r"its levels: none \(set `topology` in the config\)"):
        graph.check_feasible(tree("rack[1]>node[1]"))


# ------------------------------------------------------------------ scheduler and restart

def test_easy_reservation_for_a_rack_job_and_backfill_around_it():
    graph = racks(TWO_RACKS)
    sched = Scheduler(graph)
    sched.enqueue(SchedJob(1, request=Request(nslots=4), time_limit=100))      # on rank 0
    sched.enqueue(SchedJob(2, request=Request(nslots=4, nnodes=1, constraints=(
        ("rack", frozenset({"r1"})),)), time_limit=50))                          # on rank 3
    assert [s.job_id for s in sched.schedule(0.0)] == [1, 2]
    sched.enqueue(SchedJob(3, submit_time=1, request=tree("rack[1]:x>node[3]"), time_limit=10))
    sched.enqueue(SchedJob(4, submit_time=2, request=Request(), time_limit=60))  # would delay job 3
    sched.enqueue(SchedJob(5, submit_time=3, request=Request(), time_limit=40))  # ends in time
    started = sched.schedule(1.0)
    assert sched.estimated_start(3) == 50.0
    assert [s.job_id for s in started] == [4, 5]
    assert {graph.nodes[r].parent.name for s in started for r in s.allocation} == {"r0"}
    sched.release(2, 0, 50.0)
    sched.release(5, 0, 50.0)
    (start,) = sched.schedule(50.0)
    assert start.job_id == 3 and sorted(start.allocation) == [3, 4, 5]


def test_rebuild_after_restart_recovers_exclusive_rack_and_sockets():
    graph = racks(TWO_RACKS, cores=4)
    req = tree("rack[1]:x>node[1]>socket[1]:x>slot[1]>core[1]")
    alloc = graph.match(req)
    rebuilt = rebuild_allocation(graph, req, [(r, s.cores, s.gpus) for r, s in alloc.tasks])
    assert rebuilt == alloc
    graph.alloc("x", rebuilt)
    assert [n.free_cores for n in graph.iter_nodes()] == [0, 0, 0, 4, 4, 4]


def test_tree_report_and_placement():
    graph = racks(TWO_RACKS)
    graph.alloc("x", graph.match(tree("rack[1]:x>node[1]")))
    graph.drain(5, "broken")
    top = graph.tree()
    (zone,) = top["children"]
    r0, r1 = zone["children"]
    assert top["cores"] == [8, 12, 24] and top["nodes"] == [2, 5, 6]
    assert r0["cores"] == [0, 12, 12] and r1["nodes"] == [2, 2, 3]
    assert r1["children"][2]["state"] == "drained" and r1["children"][2]["cores"] == [0, 0, 4]
    assert [s["id"] for s in r1["children"][0]["children"]] == [0, 1]
    assert graph.placement([0, 1, 2, 4]) == [{"path": "zone=a/rack=r0", "ranks": "0-2"},
                                             {"path": "zone=a/rack=r1", "ranks": "4"}]
