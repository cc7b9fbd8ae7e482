"""Topology cases of benchmarks/matcher.py (imported only by the cases that need them).

* topology: 16,384 nodes in 512 racks of 32 in 8 zones (2 sockets x 32 cores, 4 GPUs): graph build
  with its levels (time, RSS), then gangs on a half-busy cluster (half the racks, chosen at random,
  fully allocated): 64 nodes --locality zone (exclusive), a whole rack (32 nodes --locality rack,
  exclusive), 64 nodes --spread rack, 64 nodes under the locality-first policy; the refusal at
  submit of 64 nodes --locality rack (no rack has 64 nodes); and the same gangs once every idle rack
  also has one busy core (no rack is wholly idle: the exclusive rack gang must fail everywhere).
* sockets: node[2]>socket[1]>{core[8],gpu[1]} on 4,096 nodes x 2 sockets x 32 cores x 4 GPUs
  (2 per socket): match + alloc until full, CPU rate.
* mixed: the EASY cycle of matcher.py with 10 % of the 10,000 queued jobs replaced by tree
  requests, on the same nodes arranged in racks of 32 and zones.
"""
from __future__ import annotations

import random
import statistics
import time

from broker.sched import Allocation, InfeasibleRequest, RankAlloc, Request, ResourceGraph, Slot
from broker.sched.state import GroupState, NodeState
from minicluster.model import restree

LEVELS = "zone=topology.kubernetes.io/zone,rack=example.com/rack"
TREES = [  # (weight, tree) mixed into the queue; GPU trees only on graphs with GPUs
    (3, "rack[1]>node[4]>slot[8]>core[2]"),     # --locality rack
    (2, "rack[4]>node[1]>slot[4]>core[1]"),     # --spread rack
    (2, "slot[4]>socket[1]>core[4]"),           # tasks within one socket
    (1, "zone[1]>node[16]:x"),                  # exclusive nodes in one zone
    (2, "node[2]>socket[1]>{core[8],gpu[1]}"),  # GPUs next to the cores
]


def tree(text: str) -> Request:
    return Request.from_shape(restree.shape_of(restree.parse(text)))


def build_racks(nodes: int, per_rack: int, zones: int, cores: int, gpus: int) -> ResourceGraph:
    graph = ResourceGraph(restree.parse_levels(LEVELS))
    half, racks = cores // 2, nodes // per_rack
    sockets = {0: tuple(range(half)), 1: tuple(range(half, cores))}
    gpu_map = {0: tuple(range(gpus // 2)), 1: tuple(range(gpus // 2, gpus))}
    for rank in range(nodes):
        rack = rank // per_rack
        graph.add_rank(rank, hostname=f"node{rank:05d}", sockets=sockets, gpus=gpu_map,
                       memory_mb=256_000, properties={
                           "topology.kubernetes.io/zone": f"zone-{rack * zones // racks}",
                           "example.com/rack": f"rack-{rack:03d}", "zone": "ab"[rank % 2]})
    return graph


def gang_cases(graph: ResourceGraph) -> dict:
    from matcher import median_ms

    cases = {
        "zone_locality_64_exclusive": Request.from_shape(restree.shape_from_options(
            64, nnodes=64, exclusive=True, locality="zone")),
        "rack_locality_32_exclusive": Request.from_shape(restree.shape_from_options(
            32, nnodes=32, exclusive=True, locality="rack")),
        "spread_rack_64": Request.from_shape(restree.shape_from_options(64, nnodes=64,
                                                                        spread="rack")),
        "locality_first_64": Request(nslots=64, nnodes=64),
    }
    out = {}
    for name, req in cases.items():
        policy = "locality-first" if name.startswith("locality_first") else "first-fit"
        found = graph.match(req, policy)

        def cycle(req=req, policy=policy) -> None:
            alloc = graph.match(req, policy)
            if alloc is not None:
                graph.alloc("gang", alloc)
                graph.free("gang")

        out[name] = {"match_ms": median_ms(lambda req=req, policy=policy: graph.match(req, policy)),
                     "match_alloc_free_ms": median_ms(cycle),
                     "found": found is not None,
                     "racks": len({rack_of(graph.nodes[r]).path for r in found.all_ranks()})
                     if found else 0}
    return out


def rack_of(node: NodeState) -> GroupState:
    assert node.parent is not None, "every node of build_racks() hangs from a rack"
    return node.parent


def bench_topology(nodes: int, per_rack: int, zones: int, cores: int, gpus: int,
                   rss_mb) -> dict:
    before = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    graph = build_racks(nodes, per_rack, zones, cores, gpus)
    built = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
             "rss_mb": rss_mb(), "rss_delta_mb": rss_mb() - before,
             "vertices": graph.graph.number_of_nodes(), "racks": nodes // per_rack, "zones": zones}
    rng = random.Random(11)
    racks = sorted({rack_of(n) for n in graph.nodes.values()}, key=lambda g: g.min_rank())
    for rack in rng.sample(racks, len(racks) // 2):
        for rank in range(rack.min_rank(), rack.min_rank() + per_rack):
            graph.alloc(("busy", rank), Allocation({rank: RankAlloc((Slot((0,)),))}, True))
    half_busy = gang_cases(graph)
    refuse = Request.from_shape(restree.shape_from_options(64, nnodes=64, locality="rack"))
    t0 = time.process_time()
    try:
        graph.check_feasible(refuse)
        refusal = None
    except InfeasibleRequest as exc:
        refusal = str(exc)
    refusal_ms = (time.process_time() - t0) * 1000
    for rack in racks:  # one busy core in every rack still idle: no rack is wholly idle now
        if rack.all_idle():
            rank = rack.min_rank()
            graph.alloc(("frag", rank), Allocation({rank: RankAlloc((Slot((0,)),))}))
    fragmented = gang_cases(graph)
    return {"nodes": nodes, "build": built, "half_busy": half_busy, "fragmented": fragmented,
            "locality_rack_64_refused": {"ms": refusal_ms, "reason": refusal}}


def bench_sockets(nodes: int, cores: int, gpus: int, chunks: int = 10) -> dict:
    from matcher import median_ms

    graph = build_racks(nodes, 32, max(1, nodes // 512), cores, gpus)
    req = tree("node[2]>socket[1]>{core[8],gpu[1]}")
    empty_ms = median_ms(lambda: graph.match(req))
    keys, rates = 0, []
    total = nodes * min(cores // 2 // 8, gpus // 2) * 2 // 2  # units per node / 2 nodes per match
    chunk = max(1, total // chunks)
    while True:
        c0 = time.process_time()
        done = 0
        for _ in range(chunk):
            alloc = graph.match(req)
            if alloc is None:
                break
            graph.alloc(keys, alloc)
            keys += 1
            done += 1
        cpu = time.process_time() - c0
        if done == chunk:
            rates.append(done / max(cpu, 1e-9))
        if done < chunk:
            break
    full = graph.match(req) is None
    for key in range(keys):
        graph.free(key)
    return {"nodes": nodes, "cores_per_node": cores, "gpus_per_node": gpus, "matches": keys,
            "expected_matches": total, "full_at_end": full, "empty_match_ms": empty_ms,
            "cpu_rate_median": statistics.median(rates) if rates else 0.0}


def mixed_with_trees(jobs: list, gpus: bool, share: float, seed: int = 13) -> list:
    """Replace `share` of the jobs' requests with tree requests (same ids, urgencies, limits)."""
    from dataclasses import replace

    rng = random.Random(seed)
    trees = [(w, tree(t)) for w, t in TREES if gpus or "gpu" not in t]
    weights = [w for w, _ in trees]
    return [replace(job, request=rng.choices([r for _, r in trees], weights)[0])
            if rng.random() < share else job for job in jobs]
