"""The resource model: one networkx DiGraph of containment, the thing the matcher's index is compiled from.

Vertices, top down, with their attributes:

    "cluster"                        kind="cluster"
    (("zone", "a"), ("rack", "r1"))  kind=<level> ("zone", "rack"), name=<value>: a group vertex, keyed by its path
    ("node", rank)                   kind="node", state=NodeState (description, health, drain reason)
    ("socket", rank, sid)            kind="socket", state=SocketState (core, GPU id-sets and MB, free and total)
    ("memory", rank, sid)            kind="memory", size_mb=<MB of that NUMA domain>

Edges are containment, parent -> child.  graph.py changes this graph first on every join, re-description and
removal and compiles the matcher's index (groups with their aggregates, the bitmask indexes) from it; the reports
(report.py: `mc resources`, `--tree`, /metrics, placements) and JGF out (jgf.dump) read it; JGF in (jgf.build)
builds it and has the index compiled from it.  Group vertices appear with their first node and disappear with
their last.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TypeAlias

import networkx as nx

from .state import NodeState
from .topology import Path

CLUSTER = "cluster"
Model: TypeAlias = "nx.DiGraph[Hashable]"  # vertex keys: "cluster", paths and tuples


def new() -> Model:
    """A model with only the cluster vertex."""
    g: Model = nx.DiGraph()
    g.add_node(CLUSTER, kind="cluster")
    return g


def label(path: Hashable) -> str:
    """A group vertex's path as text, "zone=a/rack=r1" (the cluster vertex: "cluster")."""
    if path == CLUSTER or not path:
        return "cluster"
    return "/".join(f"{lv}={v}" for lv, v in path)  # type: ignore[attr-defined]


def add_node(g: Model, path: Path, node: NodeState) -> None:
    """Add a node vertex with its sockets and memory under the group vertex of path (created, with its
    ancestors, if new)."""
    above: Hashable = CLUSTER
    for depth in range(1, len(path) + 1):
        key = path[:depth]
        if key not in g:
            g.add_node(key, kind=key[-1][0], name=key[-1][1])
            g.add_edge(above, key)
        above = key
    r = node.rank
    vertex = ("node", r)  # one key object per vertex, shared by its edges: 10,000s of vertices
    g.add_node(vertex, kind="node", state=node)
    g.add_edge(above, vertex)
    for sock in node.sockets:
        socket, memory = ("socket", r, sock.index), ("memory", r, sock.index)
        g.add_node(socket, kind="socket", state=sock)
        g.add_edge(vertex, socket)
        g.add_node(memory, kind="memory", size_mb=sock.mem_all)
        g.add_edge(socket, memory)


def remove_node(g: Model, rank: int) -> None:
    """Remove a node vertex, its sockets and memory, and the group vertices it leaves empty."""
    above = group_of(g, rank)
    node: NodeState = g.nodes[("node", rank)]["state"]
    g.remove_nodes_from([("node", rank)] + [(kind, rank, s.index) for s in node.sockets
                                            for kind in ("socket", "memory")])
    while above != CLUSTER and not g.succ[above]:
        up = next(iter(g.pred[above]))
        g.remove_node(above)
        above = up


def group_of(g: Model, rank: int) -> Hashable:
    """The vertex a node hangs from: a group's path, or CLUSTER."""
    above: Hashable = next(iter(g.pred[("node", rank)]))
    return above


def path_of_node(g: Model, rank: int) -> Path:
    """The path of the group vertex a node hangs from (() for the cluster vertex)."""
    above = group_of(g, rank)
    return () if above == CLUSTER else above  # type: ignore[return-value]


def nodes(g: Model) -> Iterator[NodeState]:
    """The node vertices' states, in rank order."""
    found = [data["state"] for _, data in g.nodes(data=True) if data["kind"] == "node"]
    found.sort(key=lambda n: n.rank)
    yield from found

