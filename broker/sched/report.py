"""Plain, JSON-safe views of the graph: per-rank rows (`mc resources`), the containment hierarchy
(`mc resources --tree`, protocol.md §3.3) and placements by vertex (`mc jobs -o alloc`).

In the hierarchy free counts only usable (up, undrained) nodes; used is what allocations hold on any
node; so total - free - used is out of service.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minicluster.model.idset import IdSet

from . import idset
from .state import GroupState, NodeState, ancestors
from .view import GraphView


def tree(graph: GraphView) -> dict[str, Any]:
    return _group(graph.cluster)


def _group(group: GroupState) -> dict[str, Any]:
    children = sorted(group.children.values(),
                      key=lambda c: c.rank if isinstance(c, NodeState) else c.min_rank())
    kids = [_node(c) if isinstance(c, NodeState) else _group(c) for c in children]
    out: dict[str, Any] = {"type": group.level, "name": group.name, "path": group.label}
    for kind in ("cores", "gpus", "memory_mb"):
        out[kind] = [sum(k[kind][i] for k in kids) for i in range(3)]
    out["nodes"] = [group.idle_nodes, group.usable_nodes, group.nodes]
    out["children"] = kids
    return out


def node_state(node: NodeState) -> str:
    return "down" if not node.up else "drained" if node.drain_reason is not None else "up"


def summary(graph: GraphView) -> list[dict[str, Any]]:
    rows = []
    for node in graph.iter_nodes():
        free_cores = [c for s in node.sockets for c in idset.iter_ascending(s.cores_free)]
        free_gpus = [g for s in node.sockets for g in idset.iter_ascending(s.gpus_free)]
        rows.append({
            "rank": node.rank, "hostname": node.hostname, "state": node_state(node),
            "reason": node.drain_reason or "",
            "cores_total": node.total_cores, "cores_free": node.free_cores,
            "cores_free_ids": str(IdSet.from_ints(free_cores)),
            "gpus_total": node.total_gpus, "gpus_free": node.free_gpus,
            "gpus_free_ids": str(IdSet.from_ints(free_gpus)),
            "memory_mb_total": node.total_mem, "memory_mb_free": node.free_mem,
            "properties": dict(node.properties),
            "path": node.parent.label if node.parent is not None else "cluster",
        })
    return rows


def cores_busy(graph: GraphView) -> dict[str, list[tuple[Any, ...]]]:
    """For /metrics: (rank, cores, busy) per rank and (level, path, cores, busy) per topology group below the
    cluster root, busy being the cores allocations hold.  O(ranks × levels) from the kept counts."""
    ranks: list[tuple[Any, ...]] = []
    groups: dict[GroupState, list[int]] = {}  # [cores, busy]; by identity, so each label is built once
    for node in graph.iter_nodes():
        busy = node.total_cores - node.free_cores
        ranks.append((node.rank, node.total_cores, busy))
        for group in ancestors(node):
            if group.path:
                found = groups.get(group)
                if found is None:
                    found = groups[group] = [0, 0]
                found[0] += node.total_cores
                found[1] += busy
    return {"ranks": ranks, "domains": [(g.level, g.label, *counts) for g, counts in groups.items()]}


def placement(graph: GraphView, ranks: Iterable[int]) -> list[dict[str, str]]:
    """[{"path": "zone=a/rack=r1", "ranks": "0-3"}, ...] in rank order; unknown ranks: path "?"."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(set(ranks)):
        node = graph.nodes.get(rank)
        label = node.parent.label if node is not None and node.parent is not None else "?"
        groups.setdefault(label, []).append(rank)
    return [{"path": path, "ranks": str(IdSet.from_ints(rs))} for path, rs in groups.items()]


def _node(node: NodeState) -> dict[str, Any]:
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
