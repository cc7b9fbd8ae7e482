"""Could a request ever fit?  Checked against node shapes, not node vertices.

Every group vertex (and the cluster root) keeps a count of the nodes below
it per Shape (totals, per-socket totals, properties); a cluster of 16,384
identical nodes is one shape, so checking a submission costs microseconds,
and a request with topology levels costs one such check per group.  Every
rank currently known counts, whatever its health: drained or down nodes may
come back, only removed ranks are gone.  The answer is exactly "the walk
would succeed on this instance if it were empty" (property-tested).
"""

from __future__ import annotations

from collections.abc import Mapping

from . import units
from .request import Constraint, InfeasibleRequest, Request, format_constraint
from .state import GroupState, Shape
from .view import GraphView


def check_feasible(graph: GraphView, req: Request) -> None:
    """Raise InfeasibleRequest with a user-facing reason, or return None."""
    shapes = graph.cluster.shapes
    if not shapes:
        raise InfeasibleRequest("the MiniCluster has no nodes")
    matching = _matching(shapes, req)
    if not matching:
        raise InfeasibleRequest(_constraint_reason(shapes, req.constraints))
    with_ = _with(req)
    _check_per_slot(matching, req, with_)
    if not req.groups:
        reason = _holds(matching, req, "the MiniCluster", with_)
        if reason:
            raise InfeasibleRequest(reason)
        return
    _check_levels(graph, req)
    able: dict[tuple[int, int], bool] = {}
    level, count, _ = req.groups[0]
    found = sum(1 for g in graph.cluster.below(level) if _able(g, 1, req, able))
    if found < count:
        raise InfeasibleRequest(_level_reason(graph.cluster, 0, req, found, with_))


def down_nodes_needed(graph: GraphView, req: Request) -> list[int]:
    """The down nodes a request waits for (Slurm's ReqNodeNotAvail): the down ranks that match its constraints,
    when the nodes that are up could not hold it even if they were empty; [] when they could, and for a request
    with topology levels (not looked at). O(1) while every node is up."""
    cluster = graph.cluster
    if cluster.usable_nodes == cluster.nodes or req.groups:
        return []
    down = [node for node in graph.nodes.values() if not node.up and _satisfies(Shape.of(node), req.constraints)]
    if not down:
        return []
    up = dict(_matching(cluster.shapes, req))
    for node in down:
        up[Shape.of(node)] -= 1
    up = {shape: count for shape, count in up.items() if count > 0}
    try:
        if up:
            _check_per_slot(up, req, "")
        fits = bool(up) and not _holds(up, req, "", "")
    except InfeasibleRequest:
        fits = False
    return [] if fits else sorted(node.rank for node in down)


def _matching(shapes: Mapping[Shape, int], req: Request) -> dict[Shape, int]:
    return {s: n for s, n in shapes.items() if _satisfies(s, req.constraints)}


def _with(req: Request) -> str:
    c = req.constraints
    return "".join(f" with {format_constraint(x)}" for x in c[:1]) + "".join(
        f", {format_constraint(x)}" for x in c[1:])


def _satisfies(shape: Shape, constraints: tuple[Constraint, ...]) -> bool:
    props = dict(shape.properties)
    return all(key in props and (not allowed or props[key] in allowed)
               for key, allowed in constraints)


def _constraint_reason(shapes: Mapping[Shape, int], constraints: tuple[Constraint, ...]) -> str:
    for constraint in constraints:
        if not any(_satisfies(s, (constraint,)) for s in shapes):
            return f"no node has {format_constraint(constraint)}"
    return "no node has all of " + ", ".join(format_constraint(c) for c in constraints)


def _check_per_slot(matching: Mapping[Shape, int], req: Request, with_: str) -> None:
    if req.sockets:
        where, on = f"the largest socket{with_}", " on one socket"
        sockets = [sock for s in matching for sock in s.sockets]
        most = {k: max(sock[i] for sock in sockets) for i, k in enumerate(("cores", "gpus", "mem"))}
    else:
        where, on = f"the largest node{with_}", ""
        most = {"cores": max(s.cores for s in matching), "gpus": max(s.gpus for s in matching),
                "mem": max(s.memory_mb for s in matching)}
    for need, key, unit in ((req.cores_per_slot, "cores", "cores"),
                            (req.gpus_per_slot, "gpus", "GPUs"),
                            (req.mem_per_slot, "mem", "MB of memory")):
        if need > most[key]:
            raise InfeasibleRequest(f"needs {need} {unit} per task{on}, {where} has {most[key]}")


def _check_levels(graph: GraphView, req: Request) -> None:
    names = [name for name, _ in graph.levels]
    last = -1
    for level, _count, _excl in req.groups:
        if level not in names:
            have = ", ".join(names) if names else "none (set `topology` in the config)"
            raise InfeasibleRequest(f"no {level} level in this MiniCluster; its levels: {have}")
        if names.index(level) < last:
            raise InfeasibleRequest(f"a {names[last]} cannot contain a {level}:"
                                    f" the levels are {' > '.join(names)}")
        last = names.index(level)


def _able(group: GroupState, i: int, req: Request, memo: dict[tuple[int, int], bool]) -> bool:
    """Whether one vertex, at level groups[i-1], could hold everything below it."""
    key = (id(group), i)
    if key not in memo:
        if i == len(req.groups):
            matching = _matching(group.shapes, req)
            memo[key] = bool(matching) and not _holds(matching, req, "", "")
        else:
            level, count, _ = req.groups[i]
            memo[key] = sum(1 for g in group.below(level) if _able(g, i + 1, req, memo)) >= count
    return memo[key]


def _level_reason(top: GroupState, i: int, req: Request, found: int, with_: str) -> str:
    level, count, _ = req.groups[i]
    candidates = top.below(level)
    each = f"{count} {level}s that each hold" if count > 1 else f"1 {level} that holds"
    text = f"needs {each} {_describe(req, i + 1)}, the MiniCluster has {found}{with_}"
    if not candidates:
        return f"no node is in a {level}" if i == 0 else text
    largest = max(candidates, key=lambda g: (g.nodes, -g.min_rank()))
    if i + 1 == len(req.groups):
        why = _holds(_matching(largest.shapes, req), req, f"{level} {largest.name}", with_)
    else:
        inner = req.groups[i + 1]
        have = sum(1 for g in largest.below(inner[0]) if _able(g, i + 2, req, {}))
        why = (f"{level} {largest.name} has {have} such {inner[0]}"
               f"{'s' if have != 1 else ''}")
    return f"{text} ({why})" if why else text


def _describe(req: Request, i: int) -> str:
    """What one vertex above groups[i] must hold, in words."""
    inner = ""
    for level, count, _ in req.groups[i:]:
        inner += f"{count} {level}{'s' if count > 1 else ''} of "
    counts = req.node_counts()
    tasks = f"{req.nslots} task{'s' if req.nslots > 1 else ''} of {_slot_text(req)}"
    if counts:
        tasks = f"{len(counts)} node{'s' if len(counts) > 1 else ''} for {tasks}"
    return inner + tasks


def _holds(matching: Mapping[Shape, int], req: Request, where: str, with_: str) -> str | None:
    """None if nodes of these shapes could hold req's slots, else why not."""
    caps = {s: _capacity(s, req) for s in matching}
    unit = req.unit_slots
    counts = req.node_counts()
    if counts:
        have = sum(matching.values())
        if len(counts) > have:
            return f"needs {_count(len(counts), 'node')}, {where} has {have}{with_}"
        for per_node in sorted(set(counts)):
            need = sum(1 for c in counts if c >= per_node)
            able = sum(n for s, n in matching.items() if caps[s] * unit >= per_node)
            if able < need:
                nodes = f"{_count(need, 'node')} that {'holds' if need == 1 else 'each hold'}"
                text = f"needs {nodes} {_count(per_node, 'task')} of {_slot_text(req)}, {where} has {able}{with_}"
                # On sockets a node's capacity counts whole socket groups, not tasks: no largest node there.
                return text if req.sockets else f"{text}; {_largest_node(matching, caps, req)}"
        return None
    most = sum(caps[s] * n for s, n in matching.items()) * unit
    if most < req.nslots:
        return (f"needs {_count(req.nslots, 'task')} of {_slot_text(req)}, {where}{with_} can hold at"
                f" most {most} at once")
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _largest_node(matching: Mapping[Shape, int], caps: Mapping[Shape, int], req: Request) -> str:
    """What the node that holds the most of req's tasks holds, and what it has."""
    best = max(matching, key=lambda s: (caps[s], s.cores))
    has = [_count(best.cores, "core")]
    if req.gpus_per_slot:
        has.append(_count(best.gpus, "GPU"))
    if req.mem_per_slot:
        has.append(f"{best.memory_mb} MB")
    return f"the largest node holds {_count(caps[best] * req.unit_slots, 'such task')} ({', '.join(has)})"


def _capacity(shape: Shape, req: Request) -> int:
    """Units an empty node of this shape holds."""
    if req.sockets:
        return units.capacity([(c, g, m, True) for c, g, m in shape.sockets], req)
    cap = shape.cores // req.cores_per_slot
    if req.gpus_per_slot:
        cap = min(cap, shape.gpus // req.gpus_per_slot)
    if req.mem_per_slot:
        cap = min(cap, shape.memory_mb // req.mem_per_slot)
    return cap


def _slot_text(req: Request) -> str:
    parts = [f"{req.cores_per_slot} core{'s' if req.cores_per_slot > 1 else ''}"]
    if req.gpus_per_slot:
        parts.append(f"{req.gpus_per_slot} GPU{'s' if req.gpus_per_slot > 1 else ''}")
    if req.mem_per_slot:
        parts.append(f"{req.mem_per_slot} MB")
    text = " + ".join(parts)
    if req.sockets:
        text += " on one socket"
    return text
