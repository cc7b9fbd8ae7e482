"""ResourceGraph: model, alloc/free, health changes, constraints, feasibility, summary."""
import pytest

from broker.sched import InfeasibleRequest, Request, ResourceGraph
from broker.sched.model import CLUSTER

from conftest import add_node, make_graph


def test_graph_is_the_containment_model(graph4):
    g = graph4.graph
    assert g.nodes[CLUSTER]["kind"] == "cluster"
    assert sorted(g.successors(CLUSTER)) == [("node", r) for r in range(4)]
    children = set(g.successors(("node", 2)))
    assert children == {("socket", 2, 0), ("socket", 2, 1)}
    sock = g.nodes[("socket", 2, 1)]["state"]
    assert sock.cores_all == 0b1100 and sock.gpus_all == 0b10
    # memory is per socket (NUMA): the node's 1024 MB split over its two sockets
    assert set(g.successors(("socket", 2, 1))) == {("memory", 2, 1)}
    assert g.nodes[("memory", 2, 0)]["size_mb"] + g.nodes[("memory", 2, 1)]["size_mb"] == 1024


def test_properties_bare_label_stored_as_empty_value():
    graph = ResourceGraph()
    add_node(graph, 0, properties={"zone": "a", "spot": ""})
    assert graph.summary()[0]["properties"] == {"zone": "a", "spot": ""}
    assert graph.match(Request.from_strings(["spot"])) is not None
    assert graph.match(Request.from_strings(["spot=x"])) is None


def test_one_core_match_alloc_free_restores_exact_state(graph4):
    before = graph4.snapshot()
    alloc = graph4.match(Request())
    assert dict(alloc) == {0: alloc[0]} and alloc[0].slots[0].cores == (0,)
    graph4.alloc("a", alloc)
    assert graph4.summary()[0]["cores_free_ids"] == "1-3"
    assert graph4.match(Request()) [0].slots[0].cores == (1,)
    graph4.free("a")
    assert graph4.snapshot() == before


def test_alloc_rejects_busy_unknown_and_duplicate(graph4):
    alloc = graph4.match(Request(nslots=2))
    graph4.alloc("a", alloc)
    with pytest.raises(ValueError, match="not free"):
        graph4.alloc("b", alloc)
    with pytest.raises(ValueError, match="already holds"):
        graph4.alloc("a", graph4.match(Request()))
    from broker.sched import Allocation, RankAlloc, Slot
    with pytest.raises(ValueError, match="unknown rank 9"):
        graph4.alloc("c", Allocation({9: RankAlloc((Slot((0,)),))}))
    with pytest.raises(ValueError, match="no core/gpu 99"):
        graph4.alloc("c", Allocation({1: RankAlloc((Slot((99,)),))}))
    with pytest.raises(KeyError):
        graph4.free("nope")


def test_slot_cores_stay_on_one_socket_when_possible(graph4):
    graph4.alloc("x", graph4.match(Request(nslots=1, cores_per_slot=1)))  # core 0 of node 0
    alloc = graph4.match(Request(nslots=1, cores_per_slot=2))
    # node 0 has 3 free cores (1 | 2,3): the 2-core slot must take socket 1 whole
    assert alloc[0].slots[0].cores == (2, 3)
    wide = graph4.match(Request(nslots=1, cores_per_slot=3))
    assert wide[0].slots[0].cores == (1, 2, 3)  # spans sockets only when it must


def test_gpus_and_memory_are_counted(graph4):
    req = Request(nslots=4, gpus_per_slot=1, mem_per_slot=512)
    alloc = graph4.match(req)
    assert [len(alloc[r].slots) for r in alloc] == [2, 2]
    assert alloc[0].slots[1].gpus == (1,) and alloc[0].slots[0].memory_mb == 512
    graph4.alloc("g", alloc)
    row = graph4.summary()[0]
    assert row["gpus_free"] == 0 and row["memory_mb_free"] == 0 and row["cores_free"] == 2
    assert graph4.match(Request(nslots=1, mem_per_slot=1)).keys() == {2}


def test_exclusive_takes_whole_nodes_and_needs_idle(graph4):
    graph4.alloc("small", graph4.match(Request()))
    alloc = graph4.match(Request(nslots=2, exclusive=True))
    assert list(alloc) == [1] and alloc.exclusive  # node 0 is busy, node 1 holds 2 slots
    graph4.alloc("ex", alloc)
    row = graph4.summary()[1]
    assert row["cores_free"] == 0 and row["gpus_free"] == 0 and row["memory_mb_free"] == 0
    assert graph4.match(Request(nslots=3, nnodes=3, exclusive=True)) is None
    with pytest.raises(ValueError, match="not idle"):
        graph4.alloc("ex2", alloc)
    graph4.free("ex")
    assert graph4.summary()[1]["memory_mb_free"] == 1024


def test_nnodes_spreads_slots_evenly(graph4):
    alloc = graph4.match(Request(nslots=5, nnodes=2))
    assert [len(alloc[r].slots) for r in alloc] == [3, 2]
    alloc = graph4.match(Request(nslots=8, nnodes=4))
    assert [len(alloc[r].slots) for r in alloc] == [2, 2, 2, 2]
    assert graph4.match(Request(nslots=5, nnodes=1)) is None


def test_constraints_select_nodes():
    graph = ResourceGraph()
    for rank, props in enumerate([{"zone": "a"}, {"zone": "b", "gpu": "h100"},
                                  {"zone": "b", "gpu": "a100"}, {"zone": "c"}]):
        add_node(graph, rank, properties=props)
    def pick(*c: str, **kw: int) -> list[int]:
        return sorted(graph.match(Request.from_strings(list(c), **kw)) or ())

    assert pick("zone=b") == [1]
    assert pick("gpu=a100|h100", nslots=2, nnodes=2) == [1, 2]
    assert pick("zone=b", "gpu=a100") == [2]
    assert pick("gpu", nslots=8) == [1, 2]
    assert graph.match(Request.from_strings(["zone=b"], nslots=9)) is None


def test_drain_down_up_never_match_but_free_correctly(graph4):
    alloc = graph4.match(Request(nslots=4))
    graph4.alloc("on0", alloc)
    graph4.drain(1, "bad dimm")
    graph4.set_down(2)
    assert sorted(graph4.match(Request(nslots=4))) == [3]
    assert graph4.match(Request(nslots=5)) is None
    rows = {r["rank"]: r for r in graph4.summary()}
    assert rows[1]["state"] == "drained" and rows[1]["reason"] == "bad dimm"
    assert rows[2]["state"] == "down"
    graph4.set_down(0)              # lose the node under a running allocation
    graph4.free("on0")              # still freed correctly
    assert graph4.summary()[0]["cores_free"] == 4
    assert graph4.cluster.free_cores == 4  # only rank 3 counts while 0,1,2 are out
    graph4.set_up(0)
    graph4.undrain(1)
    graph4.set_up(2)
    assert graph4.cluster.free_cores == 16
    assert sorted(graph4.match(Request(nslots=16))) == [0, 1, 2, 3]


def test_readd_lost_rank_replaces_description_and_keeps_live_holds(graph4):
    graph4.alloc("job", graph4.match(Request(nslots=2, nnodes=1)))  # cores 0,1 of rank 0
    graph4.set_down(0)
    add_node(graph4, 0, cores=8, gpus=1, hostname="bigger")
    row = graph4.summary()[0]
    assert row["state"] == "up" and row["hostname"] == "bigger" and row["cores_total"] == 8
    assert row["cores_free_ids"] == "2-7"
    graph4.free("job")
    assert graph4.summary()[0]["cores_free"] == 8
    graph4.drain(1, "maint")
    add_node(graph4, 1)
    assert graph4.summary()[1]["state"] == "drained"


def test_remove_rank(graph4):
    graph4.alloc("job", graph4.match(Request(nslots=1)))
    graph4.remove_rank(0)
    assert ("node", 0) not in graph4.graph
    assert 0 not in graph4.match(Request(nslots=12))
    add_node(graph4, 0)  # comes back as a new node: must not be credited by free()
    graph4.free("job")
    assert graph4.summary()[0]["cores_free"] == 4
    graph4.remove_rank(0)
    with pytest.raises(InfeasibleRequest, match="needs 4 nodes, the MiniCluster has 3"):
        graph4.check_feasible(Request(nslots=4, nnodes=4))


@pytest.mark.parametrize("request_, message", [
    (Request(nslots=9, nnodes=9), "needs 9 nodes, the MiniCluster has 4"),
    (Request(cores_per_slot=8), "needs 8 cores per task, the largest node has 4"),
    (Request(gpus_per_slot=3), "needs 3 GPUs per task, the largest node has 2"),
    (Request(mem_per_slot=2048), "needs 2048 MB of memory per task, the largest node has 1024"),
    (Request.from_strings(["zone=b"]), "no node has zone=b"),
    (Request.from_strings(["zone=a", "gpu=h100"]), "no node has all of gpu=h100, zone=a"),
    (Request.from_strings(["zone=a"], nslots=5, nnodes=5),
     "needs 5 nodes, the MiniCluster has 2 with zone=a"),
    (Request(nslots=17), "needs 17 tasks of 1 core, the MiniCluster can hold at most 16 at once"),
    (Request.from_strings(["zone=a"], cores_per_slot=2, gpus_per_slot=1, nslots=5),
     "needs 5 tasks of 2 cores + 1 GPU, the MiniCluster with zone=a can hold at most 4 at once"),
    (Request.from_strings(["zone=a"], cores_per_slot=8),
     "needs 8 cores per task, the largest node with zone=a has 4"),
    (Request(nslots=4, nnodes=2, cores_per_slot=3),
     "needs 2 nodes that each hold 2 tasks of 3 cores, the MiniCluster has 0; the largest node holds 1 such task"
     " (4 cores)"),
    # Issue 24 item 13: it said "needs 1 nodes that each hold 4 tasks ..., the MiniCluster has 0" and no more.
    (Request(nslots=8, nnodes=1), "needs 1 node that holds 8 tasks of 1 core, the MiniCluster has 0; the largest node"
                                  " holds 4 such tasks (4 cores)"),
    (Request(nslots=2, nnodes=1, cores_per_slot=2, gpus_per_slot=2),
     "needs 1 node that holds 2 tasks of 2 cores + 2 GPUs, the MiniCluster has 0; the largest node holds 1 such"
     " task (4 cores, 2 GPUs)"),
])
def test_infeasible_messages(request_, message):
    graph = make_graph(4, gpus=2)
    graph.add_rank(0, hostname="n0", sockets={0: (0, 1), 1: (2, 3)}, gpus=(0, 1),
                   memory_mb=1024, properties={"zone": "a"})
    graph.add_rank(1, hostname="n1", sockets={0: (0, 1), 1: (2, 3)}, gpus=(0, 1),
                   memory_mb=1024, properties={"zone": "a"})
    graph.add_rank(2, hostname="n2", sockets={0: (0, 1), 1: (2, 3)}, gpus=(0, 1),
                   memory_mb=1024, properties={"gpu": "h100"})
    with pytest.raises(InfeasibleRequest) as err:
        graph.check_feasible(request_)
    assert str(err.value) == message


def test_feasible_ignores_current_load_and_health(graph4):
    graph4.alloc("all", graph4.match(Request(nslots=16)))
    graph4.drain(0, "maint")
    graph4.check_feasible(Request(nslots=16, nnodes=4))  # does not raise: could fit later
    assert graph4.match(Request()) is None                # but not now


def test_summary_rows(graph4):
    graph4.alloc("x", graph4.match(Request(nslots=3, gpus_per_slot=0)))
    row = graph4.summary()[0]
    assert row == {
        "rank": 0, "hostname": "node0", "state": "up", "reason": "",
        "cores_total": 4, "cores_free": 1, "cores_free_ids": "3",
        "gpus_total": 2, "gpus_free": 2, "gpus_free_ids": "0-1",
        "memory_mb_total": 1024, "memory_mb_free": 1024, "properties": {}, "path": "cluster",
    }
