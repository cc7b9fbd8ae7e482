"""What the matcher and the feasibility check read of a resource graph (graph.py's ResourceGraph).

They take the graph as this Protocol rather than as ResourceGraph, so that the graph, which calls them, is the
only one of them that imports the other: no import cycle between the graph and its algorithms.
"""

from __future__ import annotations

from typing import Protocol

from .request import Constraint
from .state import ClusterState, NodeState
from .topology import Levels


class GraphView(Protocol):
    """The index compiled from the model: the root group, the nodes and the masks the matcher prunes with."""

    levels: Levels                    # topology levels, top down
    cluster: ClusterState             # the root vertex: aggregates and the bitmask indexes over nodes
    nodes: dict[int, NodeState]       # rank -> node vertex
    by_pos: list[NodeState | None]    # bit position (the rank) -> node vertex, None where there is none

    def constraint_mask(self, constraints: tuple[Constraint, ...]) -> int:
        """Mask of the nodes that satisfy every constraint."""
        ...
