"""Levels above the node: cluster -> zone -> rack (or switch) -> node.

Which levels exist, top down, and which node property names each, is
configuration (restree.parse_levels("zone=topology.kubernetes.io/zone,rack=rack"))
or comes from a JGF file (jgf.py).  A node's path is the values of those properties
in level order; a node without a level's property skips that level (it
hangs from the next level up).  The group vertices themselves, GroupState
and the root ClusterState, are in state.py with the nodes they hold.
"""

from __future__ import annotations

Levels = tuple[tuple[str, str], ...]  # (level name, node property), top down
Path = tuple[tuple[str, str], ...]    # (level name, value), top down


def path_of(levels: Levels, properties: dict[str, str]) -> Path:
    return tuple((name, properties[prop]) for name, prop in levels if prop in properties)
