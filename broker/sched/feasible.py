"""Could a request ever fit?  Checked against node shapes, not node vertices.

The graph keeps a count of nodes per Shape (totals + properties); a cluster
of 16,384 identical nodes is one shape, so checking a submission costs
microseconds.  Every rank currently known counts, whatever its health:
drained or down nodes may come back, only removed ranks are gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from .request import Constraint, InfeasibleRequest, Request, format_constraint
from .state import Shape


def check_feasible(shapes: Mapping[Shape, int], req: Request) -> None:
    """Raise InfeasibleRequest with a user-facing reason, or return None."""
    if not shapes:
        raise InfeasibleRequest("the MiniCluster has no nodes")
    matching = {s: n for s, n in shapes.items() if _satisfies(s, req.constraints)}
    if not matching:
        raise InfeasibleRequest(_constraint_reason(shapes, req.constraints))
    with_ = "".join(f" with {format_constraint(c)}" for c in req.constraints[:1]) + "".join(
        f", {format_constraint(c)}" for c in req.constraints[1:])
    _check_per_slot(matching, req, with_)
    caps = {s: _capacity(s, req) for s in matching}
    counts = req.node_counts()
    if counts:
        _check_nodes(matching, caps, counts, req, with_)
    else:
        most = sum(caps[s] * n for s, n in matching.items())
        if most < req.nslots:
            raise InfeasibleRequest(
                f"needs {req.nslots} tasks of {_slot_text(req)}, the MiniCluster{with_} can"
                f" hold at most {most} at once")


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
    largest = f"the largest node{with_}"
    for need, attr, unit in ((req.cores_per_slot, "cores", "cores"),
                             (req.gpus_per_slot, "gpus", "GPUs"),
                             (req.mem_per_slot, "memory_mb", "MB of memory")):
        most = max(getattr(s, attr) for s in matching)
        if need > most:
            raise InfeasibleRequest(f"needs {need} {unit} per task, {largest} has {most}")


def _check_nodes(matching: Mapping[Shape, int], caps: Mapping[Shape, int],
                 counts: tuple[int, ...], req: Request, with_: str) -> None:
    have = sum(matching.values())
    if len(counts) > have:
        raise InfeasibleRequest(f"needs {len(counts)} nodes, the MiniCluster has {have}{with_}")
    for per_node in sorted(set(counts)):
        need = sum(1 for c in counts if c >= per_node)
        able = sum(n for s, n in matching.items() if caps[s] >= per_node)
        if able < need:
            raise InfeasibleRequest(
                f"needs {need} nodes that each hold {per_node} tasks of {_slot_text(req)},"
                f" the MiniCluster has {able}{with_}")


def _capacity(shape: Shape, req: Request) -> int:
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
    return " + ".join(parts)
