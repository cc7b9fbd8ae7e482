"""The networkx graph is the model; the matcher's index is compiled from it and kept in step with it.

After a seeded random run of joins, re-descriptions, drains, losses, removals, allocations and frees, an index
compiled afresh from (a copy of) the model equals the live one; and `mc resources` (rows and --tree), /metrics'
counts, placements and JGF out are read from the model: they do not change when the index is thrown away.
"""
import copy
import random

from broker.sched import Request, ResourceGraph, jgf
from broker.sched.model import CLUSTER

LEVELS = (("zone", "zone"), ("rack", "rack"))


def index_of(graph):
    """Everything the matcher reads of the index, in a comparable form."""
    cl = graph.cluster
    buckets = list(cl.buckets)
    while buckets and not buckets[-1]:  # a removed big node leaves empty buckets behind
        buckets.pop()
    nodes = {r: (n.parent.path, n.free_cores, n.free_gpus, n.free_mem, n.usable) for r, n in graph.nodes.items()}
    below = {path: {lv: [b.path for b in g.below(lv)] for lv, _ in LEVELS} for path, g in graph.groups.items()}
    masks = {k: m for k, m in graph._prop_masks.items() if m}, {k: m for k, m in graph._key_masks.items() if m}
    shapes = {path: dict(g.shapes) for path, g in graph.groups.items()}
    live = [r for r, n in enumerate(graph.by_pos) if n is not None]
    return graph.snapshot()[:2], buckets, nodes, below, masks, shapes, live


def compiled(graph):
    return ResourceGraph(graph.levels, copy.deepcopy(graph.graph))


def join(graph, rng, rank):
    cores = rng.choice((2, 4, 8))
    props = {"rack": f"r{rng.randrange(3)}"}
    if rng.random() < 0.7:
        props["zone"] = rng.choice("ab")
    if rng.random() < 0.3:
        props["spot"] = ""
    graph.add_rank(rank, hostname=f"n{rank}", sockets={0: tuple(range(cores // 2)),
                                                       1: tuple(range(cores // 2, cores))},
                   gpus=tuple(range(rng.choice((0, 2)))), memory_mb=rng.choice((0, 1024)), properties=props)


def random_run(seed, steps=500):
    rng = random.Random(seed)
    graph = ResourceGraph(LEVELS)
    held, key = [], 0
    for step in range(steps):
        ranks = sorted(graph.nodes)
        roll = rng.random()
        if roll < 0.2 or not ranks:
            join(graph, rng, rng.randrange(24))  # a new rank, or a known one re-described
        elif roll < 0.3:
            graph.remove_rank(rng.choice(ranks))
        elif roll < 0.4:
            rank = rng.choice(ranks)
            graph.drain(rank, "x") if graph.nodes[rank].drain_reason is None else graph.undrain(rank)
        elif roll < 0.5:
            rank = rng.choice(ranks)
            graph.set_down(rank) if graph.nodes[rank].up else graph.set_up(rank)
        elif roll < 0.8:
            request = rng.choice((Request(), Request(nslots=3), Request(cores_per_slot=2, mem_per_slot=100),
                                  Request(gpus_per_slot=1), Request(nnodes=2, nslots=2, exclusive=True),
                                  Request.from_strings(["spot"])))
            alloc = graph.match(request, rng.choice(("first-fit", "spread", "pack")))
            if alloc is not None:
                graph.alloc(key, alloc)
                held.append(key)
                key += 1
        elif held:
            graph.free(held.pop(rng.randrange(len(held))))
        if step % 50 == 49:
            assert index_of(compiled(graph)) == index_of(graph), f"seed {seed}, step {step}"
    return graph


def test_the_index_compiled_from_the_model_equals_the_live_index():
    for seed in range(3):
        graph = random_run(seed)
        assert len(graph.nodes) > 5 and len(graph.groups) > 3, "the run exercised a topology"
        assert index_of(compiled(graph)) == index_of(graph)


def test_the_reports_and_jgf_out_read_the_model_not_the_index():
    graph = random_run(7, steps=300)
    rows, tree, busy = graph.summary(), graph.tree(), graph.cores_busy()
    place, out = graph.placement([*graph.nodes, 99]), jgf.dump(graph)
    assert tree["nodes"][2] == len(graph.nodes) and tree["children"]
    # Throw the index away: the model alone still answers every reader the same.
    for node in graph.nodes.values():
        node.parent = None
    graph.groups.clear()
    graph.cluster.subgroups.clear()
    graph.nodes.clear()
    assert (graph.summary(), graph.tree(), graph.cores_busy()) == (rows, tree, busy)
    assert graph.placement([*(row["rank"] for row in rows), 99]) == place
    assert jgf.dump(graph) == out


def test_jgf_in_builds_the_model_and_compiles_the_index_from_it():
    graph = random_run(11, steps=200)
    loaded = jgf.build(jgf.dump(graph))
    assert set(loaded.graph.successors(CLUSTER)) == set(graph.graph.successors(CLUSTER))
    assert {r: n.parent.path for r, n in loaded.nodes.items()} == {r: n.parent.path for r, n in graph.nodes.items()}
    for rank, node in loaded.nodes.items():
        assert loaded.graph.nodes[("node", rank)]["state"] is node, "the index's node is the model's vertex"
