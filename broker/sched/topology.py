"""Levels above the node: cluster -> zone -> rack (or switch) -> node.

Which levels exist, top down, and which node property names each, is
configuration (restree.parse_levels("zone=topology.kubernetes.io/zone,rack=rack"))
or comes from a JGF file (jgf.py).  A node's path is the values of those properties
in level order; a node without a level's property skips that level (it
hangs from the next level up).  Every group vertex carries the aggregates
of its subtree that the walk prunes with, kept in step by graph.py on every
alloc/free/health change: free cores, GPUs and memory and the number of
idle and of usable nodes (usable = up and not drained), plus the bitmask of
its nodes and a count of its node shapes (for feasibility).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import NodeState, Shape

Levels = tuple[tuple[str, str], ...]  # (level name, node property), top down
Path = tuple[tuple[str, str], ...]    # (level name, value), top down


def path_of(levels: Levels, properties: dict[str, str]) -> Path:
    return tuple((name, properties[prop]) for name, prop in levels if prop in properties)


class GroupState:
    """A vertex above the nodes (a zone, a rack, or the cluster root)."""

    __slots__ = ("level", "path", "parent", "children", "mask", "nodes", "usable_nodes",
                 "idle_nodes", "free_cores", "free_gpus", "free_mem", "shapes", "_below")

    def __init__(self, level: str, path: Path, parent: GroupState | None) -> None:
        self.level, self.path, self.parent = level, path, parent
        self.children: dict[object, GroupState | NodeState] = {}  # vertex key -> state
        self.mask = 0  # bits (ranks) of every node below, whatever its health
        self.nodes = 0
        # Aggregates over the usable nodes below (what the walk prunes with).
        self.usable_nodes = self.idle_nodes = 0
        self.free_cores = self.free_gpus = self.free_mem = 0
        self.shapes: Counter[Shape] = Counter()  # every node below, for feasibility
        self._below: dict[str, list[GroupState]] | None = None

    @property
    def name(self) -> str:
        return self.path[-1][1] if self.path else "cluster"

    @property
    def label(self) -> str:
        """"zone=a/rack=r1" (the cluster root: "cluster")."""
        return "/".join(f"{lv}={v}" for lv, v in self.path) or "cluster"

    def min_rank(self) -> int:
        return (self.mask & -self.mask).bit_length() - 1

    def all_idle(self) -> bool:
        """Every node below usable and idle: the group can be taken exclusively."""
        return self.idle_nodes == self.nodes

    def below(self, level: str) -> list[GroupState]:
        """Descendant groups at `level`, in rank order (cached until the tree changes)."""
        cache = self._below
        if cache is None:
            cache = self._below = {}
        found = cache.get(level)
        if found is None:
            found = cache[level] = sorted(self._walk(level), key=GroupState.min_rank)
        return found

    def _walk(self, level: str) -> Iterator[GroupState]:
        for child in self.children.values():
            if isinstance(child, GroupState):
                if child.level == level:
                    yield child
                else:
                    yield from child._walk(level)

    def forget_order(self) -> None:
        """Drop cached orderings here and above (membership changed)."""
        g: GroupState | None = self
        while g is not None:
            g._below = None
            g = g.parent


class ClusterState(GroupState):
    """The root group plus the bitmask indexes over nodes (bit = rank)."""

    __slots__ = ("buckets", "avail", "gpu_avail", "idle", "usable")

    def __init__(self) -> None:
        super().__init__("cluster", (), None)
        self.buckets: list[int] = [0]  # buckets[c]: mask of nodes with exactly c free cores
        self.avail = 0      # nodes with >= 1 free core
        self.gpu_avail = 0  # nodes with >= 1 free gpu
        self.idle = 0       # nodes with nothing allocated
        self.usable = 0     # up and not drained


def ancestors(node: NodeState) -> Iterator[GroupState]:
    g = node.parent
    while g is not None:
        yield g
        g = g.parent


def group_of(node: NodeState, level: str) -> GroupState | None:
    """The node's ancestor at `level` (None if the node skips that level)."""
    for g in ancestors(node):
        if g.level == level:
            return g
    return None
