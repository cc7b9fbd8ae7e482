"""Ranks' resources into the scheduler's graph: join descriptions and the resource graph file.

A rank that joins describes itself (protocol.md §2.7): cores per socket, GPUs (and, when known, the
socket each hangs off), memory (and its split over the sockets), properties.  The config's `topology`
turns properties into levels above the node.  With `resource_graph` the graph comes from a JGF file
instead, every rank in it starts down, and a joining rank is only checked against the file.
"""
from __future__ import annotations

import logging
from typing import Any

from broker import sched
from broker.sched import jgf
from broker.sched.state import NodeState
from minicluster.config import ConfigError, InstanceConfig
from minicluster.model.idset import IdSet

log = logging.getLogger(__name__)

NOT_IN_FILE = "not in the resource graph file"


def build_graph(config: InstanceConfig) -> tuple[sched.ResourceGraph, frozenset[int]]:
    """The empty graph with the configured levels, or the file's graph with its ranks down."""
    if not config.resource_graph:
        return sched.ResourceGraph(config.levels), frozenset()
    try:
        graph = jgf.load(config.resource_graph)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"resource_graph {config.resource_graph}: {exc}") from None
    for rank in graph.nodes:
        graph.set_down(rank)  # up once it joins
    return graph, frozenset(graph.nodes)


def add_rank(graph: sched.ResourceGraph, rank: int, wire: dict[str, Any],
             described: frozenset[int]) -> str | None:
    """Add (or, for a described rank, check) a joining rank; returns a drain reason or None.

    KeyError/TypeError/ValueError on a malformed description.
    """
    sockets = {int(sid): tuple(int(c) for c in cores) for sid, cores in wire["sockets"]}
    gpus = tuple(int(g) for g in wire.get("gpus", ()))
    if rank in described:
        graph.set_up(rank)
        return _differences(graph.nodes[rank], sockets, gpus)
    memory = int(wire.get("memory_mb", 0))
    graph.add_rank(rank, hostname=str(wire["hostname"]), sockets=sockets,
                   gpus=_gpu_affinity(wire, sockets, gpus),
                   memory_mb=_memory_split(wire, sockets, memory),
                   properties={str(k): str(v) for k, v in (wire.get("properties") or {}).items()})
    return NOT_IN_FILE if described else None


def _gpu_affinity(wire: dict[str, Any], sockets: dict[int, tuple[int, ...]],
                  gpus: tuple[int, ...]) -> tuple[int, ...] | dict[int, tuple[int, ...]]:
    placed = {int(s): tuple(int(g) for g in gs) for s, gs in wire.get("gpu_sockets") or ()}
    listed = sorted(g for gs in placed.values() for g in gs)
    if placed and set(placed) <= set(sockets) and listed == sorted(gpus):
        return placed
    return gpus  # unknown or inconsistent: dealt out evenly


def _memory_split(wire: dict[str, Any], sockets: dict[int, tuple[int, ...]],
                  memory: int) -> int | dict[int, int]:
    split = {int(s): int(mb) for s, mb in wire.get("memory_sockets") or ()}
    if split and set(split) <= set(sockets) and sum(split.values()) == memory and all(
            mb >= 0 for mb in split.values()):
        return split
    return memory


def _differences(node: NodeState, sockets: dict[int, tuple[int, ...]],
                 gpus: tuple[int, ...]) -> str | None:
    """Why the worker cannot run what the file gives this rank, or None."""
    have_cores = {c for cs in sockets.values() for c in cs}
    missing_cores = sorted(set(node.core_socket) - have_cores)
    missing_gpus = sorted(set(node.gpu_socket) - set(gpus))
    if not missing_cores and not missing_gpus:
        return None
    parts = []
    if missing_cores:
        parts.append(f"cores {IdSet.from_ints(missing_cores)} missing")
    if missing_gpus:
        parts.append(f"GPUs {IdSet.from_ints(missing_gpus)} missing")
    reason = "resources differ from the resource graph: " + ", ".join(parts)
    log.warning("rank %d: %s", node.rank, reason)
    return reason
