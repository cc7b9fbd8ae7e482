"""Random topologies and resource-tree requests, invariant checks, and a reference walk.

The reference walk is the matcher written the slow, obvious way: a depth-first walk over the
networkx containment graph (graph.graph successors), reading only socket vertex states, with no
aggregates, no bitmask indexes and no pruning.  The property tests hold the real matcher (bitmask
fast paths for flat requests, the pruned walk for trees) to it.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

from broker.sched import Request, ResourceGraph
from broker.sched.model import CLUSTER
from broker.sched.state import group_of
from minicluster.model import restree

LEVEL_SETS = [(), (("rack", "rack"),), (("zone", "zone"), ("rack", "rack"))]
CONSTRAINTS = [(), (), (), (("zone", frozenset({"a"})),), (("spot", frozenset()),)]


@st.composite
def node_specs(draw, rank):
    nsock = draw(st.integers(1, 2))
    per = draw(st.integers(1, 4))
    sockets = {s: tuple(range(s * per, (s + 1) * per)) for s in range(nsock)}
    if draw(st.booleans()):
        gpus = {}
        for s in range(nsock):
            n = draw(st.integers(0, 2))
            gpus[s] = tuple(range(len([g for gs in gpus.values() for g in gs]),
                                  len([g for gs in gpus.values() for g in gs]) + n))
    else:
        gpus = tuple(range(draw(st.integers(0, 3))))
    if draw(st.booleans()):
        memory = {s: draw(st.sampled_from([0, 1000, 2000])) for s in range(nsock)}
    else:
        memory = draw(st.sampled_from([0, 2000, 3001]))
    props = {}
    zone = draw(st.sampled_from(["a", "b", "a", None]))
    if zone:
        props["zone"] = zone
    rack = draw(st.sampled_from(["r0", "r1", "r2", "r0", "r1", "r0", None]))
    if rack:
        props["rack"] = rack
    if draw(st.integers(0, 3)) == 0:
        props["spot"] = ""
    return dict(rank=rank, hostname=f"n{rank}", sockets=sockets, gpus=gpus, memory_mb=memory,
                properties=props)


@st.composite
def topologies(draw, max_nodes=9):
    levels = draw(st.sampled_from(LEVEL_SETS[:1] + LEVEL_SETS[1:] * 2))
    n = draw(st.integers(3 if levels else 1, max_nodes))
    ranks = draw(st.permutations(list(range(n + 2))))[:n]  # joins out of rank order, gaps
    return levels, [draw(node_specs(r)) for r in ranks]


def build(topology) -> ResourceGraph:
    levels, specs = topology
    graph = ResourceGraph(levels)
    for spec in specs:
        graph.add_rank(**spec)
    return graph


@st.composite
def tree_texts(draw, levels, bad_levels=False):
    parts = []
    names = [name for name, _ in levels]
    if bad_levels and draw(st.integers(0, 3)) == 0:
        names = [*reversed(names), "pod"]
    for name in names:
        if draw(st.integers(0, 3)):
            excl = ":x" if draw(st.integers(0, 3)) == 0 else ""
            parts.append(f"{name}[{draw(st.sampled_from([1, 1, 2]))}]{excl}")
    if draw(st.integers(0, 2)):
        excl = ":x" if draw(st.integers(0, 4)) == 0 else ""
        parts.append(f"node[{draw(st.integers(1, 2))}]{excl}")
    leaves = [f"core[{draw(st.sampled_from([1, 1, 2, 3]))}]"]
    if draw(st.integers(0, 3)) == 0:
        leaves.append(f"gpu[{draw(st.integers(1, 2))}]")
    if draw(st.integers(0, 3)) == 0:
        leaves.append(f"memory[{draw(st.sampled_from([300, 900]))}]")
    leaf = "{" + ",".join(leaves) + "}" if len(leaves) > 1 else leaves[0]
    k = draw(st.sampled_from([1, 1, 2, 3]))
    sx = ":x" if draw(st.integers(0, 3)) == 0 else ""
    kind = draw(st.sampled_from(["flat", "flat", "socket-above", "socket-below"]))
    if kind == "flat":
        parts.append(f"slot[{k}]>{leaf}")
    elif kind == "socket-above":
        parts.append(f"socket[{draw(st.integers(1, 2))}]{sx}>slot[{k}]>{leaf}")
    else:
        parts.append(f"slot[{k}]>socket[1]{sx}>{leaf}")
    return ">".join(parts)


@st.composite
def tree_requests(draw, levels, bad_levels=False):
    text = draw(tree_texts(levels, bad_levels))
    shape = restree.shape_of(restree.parse(text))
    return Request.from_shape(shape, draw(st.sampled_from(CONSTRAINTS)))


@st.composite
def flat_requests(draw):
    nslots = draw(st.integers(1, 6))
    nnodes = draw(st.integers(0, min(nslots, 3)))
    spn = 0
    if not nnodes and draw(st.booleans()):
        spn = draw(st.sampled_from([d for d in range(1, nslots + 1) if nslots % d == 0]))
    return Request(nslots=nslots, nnodes=nnodes, slots_per_node=spn,
                   cores_per_slot=draw(st.integers(1, 3)), gpus_per_slot=draw(st.integers(0, 1)),
                   mem_per_slot=draw(st.sampled_from([0, 0, 400])),
                   exclusive=draw(st.integers(0, 4)) == 0,
                   constraints=draw(st.sampled_from(CONSTRAINTS)))


def empty_graph_match(graph, req, policy):
    """check_feasible and match on an empty graph must agree: the allocation, or None if refused."""
    from broker.sched import InfeasibleRequest

    try:
        graph.check_feasible(req)
    except InfeasibleRequest as err:
        assert str(err)
        assert graph.match(req, policy) is None
        return None
    alloc = graph.match(req, policy)
    assert alloc is not None, req
    return alloc


# ---------------------------------------------------------------- scheduler runs

def note_promises(sched, job_ids, promised):
    """Remember each job's first estimated start (EASY: the head's reservation)."""
    for job_id in job_ids:
        estimate = sched.estimated_start(job_id)
        if estimate is not None:
            promised.setdefault(job_id, estimate)


def end_next(sched, ends, running=None):
    """Jump to the earliest end and release everything that ends then; the new time."""
    now = min(ends.values())
    for key in [k for k, end in ends.items() if end == now]:
        sched.release(*key, now)
        del ends[key]
        if running is not None:
            del running[key]
    return now


# ---------------------------------------------------------------- invariant checks

def free_everything(graph, live, initial):
    """Free every live allocation, bring every rank back: the graph must be as it began."""
    for key in list(live):
        graph.free(key)
    for rank in graph.nodes:
        graph.set_up(rank)
        graph.undrain(rank)
    assert graph.snapshot() == initial


def held_ids(graph, alloc):
    """rank -> (core ids, gpu ids, MB) that alloc holds, derived from the Allocation alone."""
    out = {}
    held = alloc.held or {}
    for rank in alloc.all_ranks():
        node = graph.nodes[rank]
        if (alloc.exclusive and rank in alloc) or (rank in held and held[rank] is None):
            out[rank] = (set(node.core_socket), set(node.gpu_socket), node.total_mem)
            continue
        cores, gpus, mem = set(), set(), 0
        whole = set(held.get(rank) or ())
        for i, sock in enumerate(node.sockets):
            if sock.index in whole:
                cores |= {c for c, s in node.core_socket.items() if s == i}
                gpus |= {g for g, s in node.gpu_socket.items() if s == i}
                mem += sock.mem_all
        for slot in alloc[rank].slots if rank in alloc else ():
            on_whole = any(node.sockets[node.core_socket[c]].index in whole for c in slot.cores)
            cores |= set(slot.cores)
            gpus |= set(slot.gpus)
            mem += 0 if on_whole else slot.memory_mb
        out[rank] = (cores, gpus, mem)
    return out


def check_no_overlap(graph, live):
    owners = Counter()
    whole = Counter()
    for alloc in live.values():
        for rank, (cores, gpus, _) in held_ids(graph, alloc).items():
            owners.update(("c", rank, c) for c in cores)
            owners.update(("g", rank, g) for g in gpus)
            if (alloc.exclusive and rank in alloc) or (alloc.held and rank in alloc.held
                                                       and alloc.held[rank] is None):
                whole[rank] += 1
    assert not [k for k, n in owners.items() if n > 1]
    for rank, n in whole.items():
        assert n == 1 and sum(1 for a in live.values() if rank in a.all_ranks()) == 1


def check_accounting(graph, live):
    used = {}
    for alloc in live.values():
        for rank, (cores, gpus, mem) in held_ids(graph, alloc).items():
            c, g, m = used.get(rank, (0, 0, 0))
            used[rank] = (c + len(cores), g + len(gpus), m + mem)
    for rank, node in graph.nodes.items():
        c, g, m = used.get(rank, (0, 0, 0))
        assert node.free_cores == node.total_cores - c >= 0
        assert node.free_gpus == node.total_gpus - g >= 0
        assert node.free_mem == node.total_mem - m >= 0
        assert node.free_cores == sum(s.cores_free.bit_count() for s in node.sockets)
        assert node.free_mem == sum(s.mem_free for s in node.sockets)
        assert all(0 <= s.mem_free <= s.mem_all for s in node.sockets)
    check_aggregates(graph)


def check_aggregates(graph):
    """Every group vertex's aggregates equal a recount over the nodes below it."""
    for path, group in graph.groups.items():
        below = [n for n in graph.nodes.values() if n.parent.path[:len(path)] == path]
        usable = [n for n in below if n.usable]
        assert group.nodes == len(below) and group.mask == sum(n.bit for n in below)
        assert group.usable_nodes == len(usable)
        assert group.idle_nodes == sum(1 for n in usable if n.is_idle())
        assert group.free_cores == sum(n.free_cores for n in usable)
        assert group.free_gpus == sum(n.free_gpus for n in usable)
        assert group.free_mem == sum(n.free_mem for n in usable)
        assert group.nodes > 0 or group is graph.cluster


def check_tree_shape(graph, req, alloc, usable):
    """Slots, locality per level, nodes per vertex, exclusivity, socket binding."""
    assert alloc.nslots == req.total_slots
    tasks = set(alloc)
    assert tasks <= usable
    for rank in tasks:
        props = graph.nodes[rank].properties
        assert all(k in props and (not vs or props[k] in vs) for k, vs in req.constraints)
    parents = dict.fromkeys(tasks, ())
    for level, count, exclusive in req.groups:
        vertices = {}
        for rank in tasks:
            group = group_of(graph.nodes[rank], level)
            assert group is not None, f"rank {rank} is not in a {level}"
            vertices.setdefault(parents[rank], set()).add(group.path)
            parents[rank] = group.path
        assert all(len(v) == count for v in vertices.values()), (level, vertices)
        if exclusive:
            for path in {parents[r] for r in tasks}:
                members = {n.rank for n in graph.nodes.values() if n.parent.path[:len(path)] == path}
                assert members <= set(alloc.all_ranks())
    per_vertex = Counter(parents[r] for r in tasks for _ in alloc[r].slots)
    assert set(per_vertex.values()) == {req.nslots}
    counts = req.node_counts()
    if counts:
        for vertex in set(parents.values()):
            on = sorted((len(alloc[r].slots) for r in tasks if parents[r] == vertex), reverse=True)
            assert on == list(counts)
    on_socket = Counter()
    for rank in tasks:
        node = graph.nodes[rank]
        for slot in alloc[rank].slots:
            on_socket[(rank, node.core_socket[slot.cores[0]])] += 1
            assert len(slot.cores) == req.cores_per_slot and len(slot.gpus) == req.gpus_per_slot
            assert slot.memory_mb == req.mem_per_slot
            if req.sockets:
                socks = {node.core_socket[c] for c in slot.cores} | {
                    node.gpu_socket[g] for g in slot.gpus}
                assert len(socks) == 1
                if req.socket_exclusive:
                    assert node.sockets[socks.pop()].index in alloc.held[rank]
    if req.socket_slots:  # socket[s]>slot[k]: k slots on each socket used
        assert set(on_socket.values()) == {req.socket_slots}
    elif req.socket_exclusive:  # slot>socket[1]:x: a socket of its own per slot
        assert set(on_socket.values()) == {1}
    assert alloc.exclusive == req.exclusive


# ------------------------------------------------------------------ the reference walk

def _free(node):
    return (sum(s.cores_free.bit_count() for s in node.sockets),
            sum(s.gpus_free.bit_count() for s in node.sockets), sum(s.mem_free for s in node.sockets))


def _idle(node):
    return all(s.cores_free == s.cores_all and s.gpus_free == s.gpus_all and s.mem_free == s.mem_all
               for s in node.sockets)


def _capacity(node, req):
    c, g, m = req.cores_per_slot, req.gpus_per_slot, req.mem_per_slot
    big = 1 << 30
    if not req.sockets:
        fc, fg, fm = _free(node)
        return min(fc // c, fg // g if g else big, fm // m if m else big)
    per = []
    for s in node.sockets:
        idle = s.cores_free == s.cores_all and s.gpus_free == s.gpus_all and s.mem_free == s.mem_all
        if req.socket_exclusive and not idle:
            per.append(0)
            continue
        fit = min(s.cores_free.bit_count() // c, s.gpus_free.bit_count() // g if g else big,
                  s.mem_free // m if m else big)
        per.append(fit)
    if req.socket_slots:
        return sum(1 for f in per if f >= req.socket_slots) // req.sockets
    return sum(min(f, 1) if req.socket_exclusive else f for f in per)


def _nodes_under(graph, key):
    g = graph.graph
    for child in g.successors(key):
        kind = g.nodes[child]["kind"]
        if kind == "node":
            yield g.nodes[child]["state"]
        elif kind not in ("socket", "memory"):
            yield from _nodes_under(graph, child)


def _groups_at(graph, key, level):
    g = graph.graph
    for child in g.successors(key):
        kind = g.nodes[child]["kind"]
        if kind == level:
            yield child
        elif kind not in ("node", "socket", "memory"):
            yield from _groups_at(graph, child, level)


def _ref_choose(nodes, req, policy):
    unit = req.unit_slots
    able = []
    for node in nodes:
        props = node.properties
        if not node.usable or not all(k in props and (not vs or props[k] in vs)
                                      for k, vs in req.constraints):
            continue
        if req.exclusive and not _idle(node):
            continue
        cap = _capacity(node, req)
        if cap:
            able.append((node, cap))
    order = {"high-id": lambda e: -e[0].rank, "pack": lambda e: (_free(e[0])[0], e[0].rank),
             "spread": lambda e: (-_free(e[0])[0], e[0].rank)}.get(policy, lambda e: e[0].rank)
    able.sort(key=order)
    counts = req.node_counts()
    if counts:
        want = sorted((c // unit for c in counts), reverse=True)
        picks = []
        for node, cap in able:  # the largest counts to the first nodes that hold them
            fitting = [i for i, w in enumerate(want) if w <= cap]
            if fitting:
                picks.append((node.rank, want.pop(fitting[0])))
            if not want:
                return picks
        return None
    need = req.nslots // unit
    if policy == "spread":
        chosen = able[:need]
        if sum(c for _, c in chosen) < need:
            return None
        got = {n.rank: 0 for n, _ in chosen}
        while need:
            for node, cap in chosen:
                if need and got[node.rank] < cap:
                    got[node.rank] += 1
                    need -= 1
        return list(got.items())
    picks = []
    for node, cap in able:
        take = min(cap, need)
        picks.append((node.rank, take))
        need -= take
        if not need:
            return picks
    return None


def _group_free(graph, key):
    return sum(_free(n)[0] for n in _nodes_under(graph, key) if n.usable)


def _ref_descend(graph, key, req, i, policy):
    if i == len(req.groups):
        node_policy = "first-fit" if policy == "locality-first" else policy
        return _ref_choose(list(_nodes_under(graph, key)), req, node_policy)
    level, count, exclusive = req.groups[i]
    children = list(_groups_at(graph, key, level))
    ranks = {c: min(n.rank for n in _nodes_under(graph, c)) for c in children}
    children.sort(key=lambda c: ranks[c])
    if policy == "high-id":
        children.sort(key=lambda c: -max(n.rank for n in _nodes_under(graph, c)))
    elif policy in ("pack", "locality-first"):
        children.sort(key=lambda c: _group_free(graph, c))
    elif policy == "spread":
        children.sort(key=lambda c: -_group_free(graph, c))
    found = []
    for child in children:
        if exclusive and not all(n.usable and _idle(n) for n in _nodes_under(graph, child)):
            continue
        picks = _ref_descend(graph, child, req, i + 1, policy)
        if picks is not None:
            found += picks
            count -= 1
            if not count:
                return found
    return None


def reference_match(graph, req, policy):
    """{rank: slots} the matcher must choose, or None."""
    from dataclasses import replace

    node_policy = "first-fit" if policy == "locality-first" else policy
    attempts = [(req, policy)]
    if policy == "locality-first" and not req.groups and req.nslots > 1:
        attempts = [(replace(req, groups=((name, 1, False),)), "locality-first")
                    for name, _ in reversed(graph.levels)] + [(req, "first-fit")]
    for attempt, order in attempts:
        if attempt.groups:
            picks = _ref_descend(graph, CLUSTER, attempt, 0, order)
        else:
            picks = _ref_choose(list(_nodes_under(graph, CLUSTER)), attempt, node_policy)
        if picks is not None:
            return {rank: n * attempt.unit_slots for rank, n in picks}
    return None
