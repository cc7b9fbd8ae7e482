"""The containment hierarchy as plain nested dicts, for `mc resources --tree` (protocol.md §3.3).

Free counts only usable (up, undrained) nodes; used is what allocations hold on any node; so
total - free - used is out of service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .state import NodeState
from .topology import GroupState

if TYPE_CHECKING:
    from .graph import ResourceGraph


def tree(graph: ResourceGraph) -> dict[str, Any]:
    return _group(graph.cluster)


def _group(group: GroupState) -> dict[str, Any]:
    children = sorted(group.children.values(),
                      key=lambda c: c.rank if isinstance(c, NodeState) else c.min_rank())
    kids = [_node(c) if isinstance(c, NodeState) else _group(c) for c in children]
    out = {"type": group.level, "name": group.name, "path": group.label}
    for kind in ("cores", "gpus", "memory_mb"):
        out[kind] = [sum(k[kind][i] for k in kids) for i in range(3)]
    out["nodes"] = [group.idle_nodes, group.usable_nodes, group.nodes]
    out["children"] = kids
    return out


def _node(node: NodeState) -> dict[str, Any]:
    from .graph import node_state

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
