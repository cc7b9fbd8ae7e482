"""Plain, JSON-safe views of the resource model (model.py, the networkx graph): per-rank rows (`mc resources`),
the containment hierarchy (`mc resources --tree`, protocol.md §3.3), cores busy per rank and group (/metrics) and
placements by vertex (`mc jobs -o alloc`).  All read the model's vertices, not the matcher's index.

In the hierarchy free counts only usable (up, undrained) nodes; used is what allocations hold on any
node; so total - free - used is out of service.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from minicluster.model.idset import IdSet

from . import idset, model
from .model import CLUSTER, Model
from .state import NodeState


def tree(g: Model) -> dict[str, Any]:
    return _group(g, CLUSTER)[1]


def _group(g: Model, key: Hashable) -> tuple[int, dict[str, Any]]:
    """(lowest rank below, the vertex's subtree) of a group vertex (or the cluster vertex)."""
    kids: list[tuple[int, dict[str, Any]]] = []
    idle = usable = count = 0  # nodes below
    vertices = g.nodes
    for child in g.succ[key]:
        data = vertices[child]
        if data["kind"] == "node":
            node: NodeState = data["state"]
            kids.append((node.rank, _node(node)))
            idle += node.usable and node.is_idle()
            usable += node.usable
            count += 1
        else:
            kid = _group(g, child)
            kids.append(kid)
            i, u, c = kid[1]["nodes"]
            idle, usable, count = idle + i, usable + u, count + c
    kids.sort(key=lambda kid: kid[0])
    data = vertices[key]
    out: dict[str, Any] = {"type": data["kind"], "name": data.get("name", "cluster"), "path": model.label(key)}
    for kind in ("cores", "gpus", "memory_mb"):
        out[kind] = [sum(k[kind][i] for _, k in kids) for i in range(3)]
    out["nodes"] = [idle, usable, count]
    out["children"] = [k for _, k in kids]
    return min((r for r, _ in kids), default=-1), out


def node_state(node: NodeState) -> str:
    return "down" if not node.up else "drained" if node.drain_reason is not None else "up"


def summary(g: Model) -> list[dict[str, Any]]:
    rows = []
    for node in model.nodes(g):
        # The sockets' masks hold the node's own ids: one mask, read run by run (10,000 ranks answer in ~0.1 s).
        free_cores = free_gpus = 0
        for s in node.sockets:
            free_cores |= s.cores_free
            free_gpus |= s.gpus_free
        rows.append({
            "rank": node.rank, "hostname": node.hostname, "state": node_state(node),
            "reason": node.drain_reason or "",
            "cores_total": node.total_cores, "cores_free": node.free_cores,
            "cores_free_ids": str(IdSet(idset.runs(free_cores))),
            "gpus_total": node.total_gpus, "gpus_free": node.free_gpus,
            "gpus_free_ids": str(IdSet(idset.runs(free_gpus))),
            "memory_mb_total": node.total_mem, "memory_mb_free": node.free_mem,
            "properties": dict(node.properties),
            "path": model.label(model.group_of(g, node.rank)),
        })
    return rows


def cores_busy(g: Model) -> dict[str, list[tuple[Any, ...]]]:
    """For /metrics: (rank, cores, busy) per rank and (level, path, cores, busy) per group vertex below the
    cluster vertex, busy being the cores allocations hold.  One walk of the model down to the nodes."""
    ranks: list[tuple[Any, ...]] = []
    domains: list[tuple[Any, ...]] = []

    def walk(key: Hashable) -> tuple[int, int]:
        cores = busy = 0
        for child in g.succ[key]:
            data = g.nodes[child]
            if data["kind"] == "node":
                node: NodeState = data["state"]
                ranks.append((node.rank, node.total_cores, node.total_cores - node.free_cores))
                c, b = node.total_cores, node.total_cores - node.free_cores
            else:
                c, b = walk(child)
                domains.append((data["kind"], model.label(child), c, b))
            cores, busy = cores + c, busy + b
        return cores, busy

    walk(CLUSTER)
    ranks.sort()
    return {"ranks": ranks, "domains": domains}


def placement(g: Model, ranks: Iterable[int]) -> list[dict[str, str]]:
    """[{"path": "zone=a/rack=r1", "ranks": "0-3"}, ...] in rank order; unknown ranks: path "?"."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(set(ranks)):
        label = model.label(model.group_of(g, rank)) if ("node", rank) in g else "?"
        groups.setdefault(label, []).append(rank)
    return [{"path": path, "ranks": str(IdSet.from_ints(rs))} for path, rs in groups.items()]


def _node(node: NodeState) -> dict[str, Any]:
    """A node vertex's subtree; its socket vertices' states are node.sockets."""
    usable = node.usable
    sockets = [{
        "type": "socket", "name": f"socket{s.index}", "id": s.index,
        "cores": _counts(s.cores_free.bit_count(), s.cores_all.bit_count(), usable),
        "gpus": _counts(s.gpus_free.bit_count(), s.gpus_all.bit_count(), usable),
        "memory_mb": _counts(s.mem_free, s.mem_all, usable),
        "children": [],
    } for s in node.sockets]
    return {"type": "node", "name": node.hostname, "rank": node.rank, "state": node_state(node),
            "reason": node.drain_reason or "",
            "cores": _counts(node.free_cores, node.total_cores, usable),
            "gpus": _counts(node.free_gpus, node.total_gpus, usable),
            "memory_mb": _counts(node.free_mem, node.total_mem, usable),
            "children": sockets}


def _counts(free: int, total: int, usable: bool) -> list[int]:
    return [free if usable else 0, total - free, total]
