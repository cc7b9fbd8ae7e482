"""A whole resource graph from a JSON Graph Format file, as Fluxion's JGF reader takes.

    {"graph": {"nodes": [{"id": "0", "metadata": {"type": "cluster", "name": "c0", ...}}, ...],
               "edges": [{"source": "0", "target": "1", "metadata": {"subsystem": "containment"}}]}}

Vertex metadata used: `type`, `name` (else `basename` + `id`), `id` (socket,
core and GPU ids), `rank` (node vertices; required), `size` and `unit`
(memory: B, KB, MB, GB, TB in powers of 1024, or KiB...; empty means MB),
`properties` (node vertices: a map of strings; Fluxion's are bare names, kept
as `name=""`).  Only containment edges count (no metadata, or
`subsystem: containment`).  The types between the root and the nodes become
the topology levels, top down (e.g. rack, or zone > rack), and each node gets
the property `<level>=<name of its vertex there>`.  Below a node: sockets
with cores, GPUs and memory; cores, GPUs and memory directly under a node
form socket 0 (memory and GPUs directly under a node with sockets are dealt
over them evenly); other types (numanode, ...) are looked through, and
vertices that are neither (ssd, ...) are ignored.  Errors are ValueError
naming the vertex.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from minicluster.model import restree

from . import model
from .graph import ResourceGraph
from .idset import iter_ascending
from .sockets import SocketState
from .state import NodeState
from .topology import Path, path_of

Meta = dict[str, Any]  # a JGF vertex's metadata

_UNITS = {"": 1, "B": 1 / (1 << 20), "KB": 1 / 1024, "KIB": 1 / 1024, "MB": 1, "MIB": 1,
          "GB": 1024, "GIB": 1024, "TB": 1 << 20, "TIB": 1 << 20}
_BELOW_NODE = ("socket", "core", "gpu", "memory")


def load(path: str) -> ResourceGraph:
    """Read a JGF file into a fresh ResourceGraph (OSError, ValueError)."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
    return build(data)


def build(data: Any) -> ResourceGraph:
    """The model (model.py) of the JGF data, and the index compiled from it."""
    names, ranks = read(data)
    levels = tuple((name, name) for name in names)
    g = model.new()
    for spec in ranks:
        node = NodeState(spec["rank"], spec["hostname"], spec["sockets"], spec["gpus"], spec["memory_mb"],
                         spec["properties"])
        model.add_node(g, path_of(levels, node.properties), node)
    return ResourceGraph(levels, g)


def read(data: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """(levels top down, add_rank keyword arguments per node) from JGF data."""
    vertices, children = _containment(data)
    contained = {c for cs in children.values() for c in cs}
    # vertices only on other subsystems' edges (power, ...) are not part of the tree
    roots = [v for v in vertices
             if v not in contained and (v in children or vertices[v]["type"] == "node")]
    if len(roots) != 1:
        raise ValueError(f"JGF: expected one containment root (the cluster), found {len(roots)}")
    chains: list[list[str]] = []
    ranks: list[dict[str, Any]] = []
    seen: set[int] = set()
    for node_id, path in _nodes(roots[0], vertices, children, []):
        meta = vertices[node_id]
        rank = meta.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"JGF: node {_name(meta)} has no rank (metadata.rank >= 0)")
        if rank in seen:
            raise ValueError(f"JGF: rank {rank} appears twice")
        seen.add(rank)
        chain = [vertices[v]["type"] for v in path[1:]]
        chains.append(chain)
        spec = _node_spec(node_id, vertices, children)
        spec["properties"].update({vertices[v]["type"]: _name(vertices[v]) for v in path[1:]})
        ranks.append(dict(rank=rank, **spec))
    return _levels(chains), sorted(ranks, key=lambda r: r["rank"])


def _containment(data: Any) -> tuple[dict[str, Meta], dict[str, list[str]]]:
    graph = data.get("graph") if isinstance(data, dict) else None
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ValueError("JGF: expected {\"graph\": {\"nodes\": [...], \"edges\": [...]}}")
    vertices: dict[str, Meta] = {}
    for v in graph["nodes"]:
        meta = v.get("metadata") if isinstance(v, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("type"), str):
            raise ValueError(f"JGF: vertex {v!r:.80} has no metadata.type")
        vertices[str(v.get("id"))] = meta
    children: dict[str, list[str]] = defaultdict(list)
    for e in graph.get("edges") or []:
        meta = e.get("metadata") or {}
        if meta.get("subsystem", "containment") != "containment":
            continue
        source, target = str(e.get("source")), str(e.get("target"))
        if source not in vertices or target not in vertices:
            raise ValueError(f"JGF: edge {source} -> {target} names an unknown vertex")
        children[source].append(target)
    return vertices, children


def _nodes(vid: str, vertices: Mapping[str, Meta], children: Mapping[str, list[str]],
           path: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(node vertex id, path of group vertex ids from the root) for every node."""
    if len(path) > 64:
        raise ValueError("JGF: containment deeper than 64 levels (a cycle?)")
    kind = vertices[vid]["type"]
    if kind == "node":
        yield vid, path
        return
    if kind in _BELOW_NODE:
        return  # resources outside any node are not schedulable here
    for child in children.get(vid, ()):
        yield from _nodes(child, vertices, children, [*path, vid])


def _levels(chains: list[list[str]]) -> list[str]:
    """One top-down order of the group types that is consistent with every node's path."""
    order: list[str] = []
    for chain in chains:
        if len(set(chain)) != len(chain):
            raise ValueError(f"JGF: a node's path repeats a type: {' > '.join(chain)}")
        for kind in chain:
            restree.check_level_name(kind, "JGF")
            if kind not in order:
                above = [k for k in chain[:chain.index(kind)] if k in order]
                at = max((order.index(k) for k in above), default=-1) + 1
                order.insert(at, kind)
        positions = [order.index(k) for k in chain]
        if positions != sorted(positions):
            raise ValueError(f"JGF: levels in conflicting order: {' > '.join(chain)} vs"
                             f" {' > '.join(order)}")
    return order


def _name(meta: Mapping[str, Any]) -> str:
    name = meta.get("name")
    if isinstance(name, str) and name:
        return name
    return f"{meta.get('basename') or meta['type']}{meta.get('id', '')}"


def _node_spec(node_id: str, vertices: Mapping[str, Meta],
               children: Mapping[str, list[str]]) -> dict[str, Any]:
    """add_rank's keyword arguments (but rank) for the node vertex node_id."""
    meta = vertices[node_id]
    sockets, gpus, memory, loose = _per_socket(node_id, vertices, children)
    sids = _deal_loose(loose, sockets, gpus, memory)
    properties = _node_properties(meta)
    return dict(hostname=_name(meta), sockets={s: tuple(c) for s, c in sockets.items()},
                gpus={s: tuple(g) for s, g in gpus.items()},
                memory_mb={s: memory[s] for s in sids}, properties=properties)


def _per_socket(node_id: str, vertices: Mapping[str, Meta], children: Mapping[str, list[str]]) -> tuple[
        dict[int, list[int]], dict[int, list[int]], defaultdict[int, int], dict[str, list[Meta]]]:
    """Core ids, GPU ids and MB per socket id below a node (socket 0 if it has no socket vertex),
    and the core, GPU and memory vertices directly under it ("loose", by type)."""
    sockets: dict[int, list[int]] = {}
    gpus: dict[int, list[int]] = {}
    memory: defaultdict[int, int] = defaultdict(int)
    loose: dict[str, list[Meta]] = {"core": [], "gpu": [], "memory": []}
    for vid, sock in _below(node_id, vertices, children, None):
        v = vertices[vid]
        kind = v["type"]
        if kind == "socket":
            sockets.setdefault(_int_id(v, len(sockets)), [])
            continue
        if sock is None:
            loose[kind].append(v)
            continue
        sid = _int_id(vertices[sock], 0)
        if kind == "core":
            sockets.setdefault(sid, []).append(_int_id(v, None))
        elif kind == "gpu":
            gpus.setdefault(sid, []).append(_int_id(v, None))
        else:
            memory[sid] += _megabytes(v)
    if not sockets:
        sockets[0] = []
    return sockets, gpus, memory, loose


def _deal_loose(loose: Mapping[str, list[Meta]], sockets: dict[int, list[int]], gpus: dict[int, list[int]],
                memory: defaultdict[int, int]) -> list[int]:
    """Put what lies directly under the node on its sockets: the cores on the lowest socket, the GPUs and
    the memory dealt evenly over all; returns the socket ids in order."""
    sockets[min(sockets)].extend(_int_id(v, None) for v in loose["core"])
    loose_gpus = sorted(_int_id(v, None) for v in loose["gpu"])
    sids = sorted(sockets)
    for i, g in enumerate(loose_gpus):
        gpus.setdefault(sids[i * len(sids) // len(loose_gpus)], []).append(g)
    spread = sum(_megabytes(v) for v in loose["memory"])
    for i, sid in enumerate(sids):
        memory[sid] += spread // len(sids) + (1 if i < spread % len(sids) else 0)
    return sids


def _node_properties(meta: Mapping[str, Any]) -> dict[str, str]:
    """A node vertex's properties: a map of strings, or Fluxion's bare names (as name="")."""
    props = meta.get("properties") or {}
    if not isinstance(props, (dict, list)):
        raise ValueError(f"JGF: properties of node {_name(meta)} must be a map")
    return ({str(k): str(v) for k, v in props.items()} if isinstance(props, dict)
            else {str(k): "" for k in props})


def _below(vid: str, vertices: Mapping[str, Meta], children: Mapping[str, list[str]],
           sock: str | None) -> Iterator[tuple[str, str | None]]:
    """(vertex id, its socket vertex id or None) below a node; other types looked through."""
    for child in children.get(vid, ()):
        kind = vertices[child]["type"]
        if kind == "socket":
            yield child, None
            yield from _below(child, vertices, children, child)
        elif kind in ("core", "gpu", "memory"):
            yield child, sock
        elif kind != "node":
            yield from _below(child, vertices, children, sock)


def _int_id(meta: Mapping[str, Any], default: int | None) -> int:
    value = meta.get("id", default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if default is None:
            raise ValueError(f"JGF: {meta['type']} {_name(meta)} needs metadata.id >= 0")
        return default
    return value


def _megabytes(meta: Mapping[str, Any]) -> int:
    size, unit = meta.get("size", 1), str(meta.get("unit", "")).upper()
    if unit not in _UNITS or isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"JGF: memory {_name(meta)}: bad size {size!r} {unit!r}")
    return int(size * _UNITS[unit])


def dump(graph: ResourceGraph) -> dict[str, Any]:
    """The model as JGF (levels, nodes, sockets, cores, GPUs, memory): what `load` reads back."""
    g = graph.graph
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []

    def vertex(kind: str, name: str, parent: int | None, **meta: Any) -> int:
        uid = len(nodes)
        nodes.append({"id": str(uid), "metadata": {"type": kind, "name": name, "uniq_id": uid,
                                                   "rank": meta.pop("rank", -1), **meta}})
        if parent is not None:
            edges.append({"source": str(parent), "target": str(uid),
                          "metadata": {"subsystem": "containment"}})
        return uid

    root = vertex("cluster", "cluster0", None, id=0)
    ids: dict[Path, int] = {(): root}
    level_props = {prop for _, prop in graph.levels}
    for node in model.nodes(g):
        parent = ids[()]
        path = model.path_of_node(g, node.rank)
        for depth in range(1, len(path) + 1):
            above = path[:depth]
            if above not in ids:
                ids[above] = vertex(g.nodes[above]["kind"], g.nodes[above]["name"], parent)
            parent = ids[above]
        props = {k: v for k, v in node.properties.items() if k not in level_props}
        nid = vertex("node", node.hostname, parent, rank=node.rank, properties=props)
        below = g.succ[("node", node.rank)]
        found: list[tuple[SocketState, Hashable]] = [(g.nodes[key]["state"], key) for key in below]
        for sock, key in sorted(found, key=lambda found: found[0].index):
            sid = vertex("socket", f"socket{sock.index}", nid, id=sock.index)
            for c in iter_ascending(sock.cores_all):
                vertex("core", f"core{c}", sid, id=c)
            for gpu in iter_ascending(sock.gpus_all):
                vertex("gpu", f"gpu{gpu}", sid, id=gpu)
            for memory in g.succ[key]:
                if g.nodes[memory]["size_mb"]:
                    vertex("memory", f"memory{sock.index}", sid, id=sock.index,
                           size=g.nodes[memory]["size_mb"], unit="MB")
    return {"graph": {"nodes": nodes, "edges": edges}}
