"""What a job asks for: the Request value type and constraint parsing.

A Request is a frozen, hashable value so the scheduler can use it as a cache
key ("this shape did not fit in this cycle").  It is never journalled: the
broker derives it again from the job's jobspec (Request.from_shape).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from minicluster.model import restree

Constraint = tuple[str, frozenset[str]]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.\-/:]+\Z")


class InfeasibleRequest(Exception):
    """The request could never be satisfied by this instance, even when empty."""


def parse_constraint(text: str) -> Constraint:
    """Parse "zone=a", "gpu=h100|a100" or a bare "spot" (key must be present).

    Returns (key, allowed values); an empty frozenset means "key present".
    """
    raw = text.strip()
    if not raw:
        raise ValueError("empty constraint")
    key, sep, values = raw.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise ValueError(
            f"bad constraint {text!r}: property name {key!r} must start with a letter"
            " or '_' and contain only letters, digits, '_', '.', '-', '/'")
    if not sep:
        return key, frozenset()
    allowed = [v.strip() for v in values.split("|")]
    for value in allowed:
        if not _VALUE.match(value):
            raise ValueError(
                f"bad constraint {text!r}: value {value!r} must be non-empty letters,"
                " digits, '_', '.', '-', '/', ':' (use key=a|b for alternatives)")
    return key, frozenset(allowed)


def format_constraint(constraint: Constraint) -> str:
    """Inverse of parse_constraint, values sorted: ("gpu", {a100,h100}) -> "gpu=a100|h100"."""
    key, allowed = constraint
    return f"{key}={'|'.join(sorted(allowed))}" if allowed else key


Group = tuple[str, int, bool]  # (topology level, count, exclusive)


@dataclass(frozen=True, slots=True)
class Request:
    """Resources for one job (or one element of an array job).

    nnodes=0 lets the matcher use any number of nodes; nnodes>0 spreads the
    slots over exactly that many nodes as evenly as possible (5 over 2 -> 3+2).
    slots_per_node>0 fixes the count on every node used; nslots must then be a
    multiple of it.  exclusive allocates whole nodes.

    Tree requests (docs/scheduling.md) add:
      groups: (level, count, exclusive) above the node, top down.  The flat
        fields then describe what ONE vertex of the innermost level holds:
        rack[2]>node[4]>slot[8] is groups=(("rack", 2, False),), nnodes=4,
        nslots=32, slots_per_node=8; total_slots is 64.
      sockets > 0 binds slots to sockets: with socket_slots > 0 a unit is
        `sockets` sockets of one node with socket_slots slots each, all of a
        slot's resources on its socket; with socket_slots == 0 each slot
        lies within one socket.  socket_exclusive holds those sockets whole.
    """

    nslots: int = 1
    cores_per_slot: int = 1
    gpus_per_slot: int = 0
    mem_per_slot: int = 0
    nnodes: int = 0
    slots_per_node: int = 0
    exclusive: bool = False
    constraints: tuple[Constraint, ...] = ()
    groups: tuple[Group, ...] = ()
    sockets: int = 0
    socket_slots: int = 0
    socket_exclusive: bool = False
    # derived: needs the tree walk (groups or socket-bound slots)
    tree: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.nslots < 1:
            raise ValueError(f"nslots must be >= 1, got {self.nslots}")
        if self.cores_per_slot < 1:
            raise ValueError(f"cores_per_slot must be >= 1, got {self.cores_per_slot}")
        for name in ("gpus_per_slot", "mem_per_slot", "nnodes", "slots_per_node", "sockets",
                     "socket_slots"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.nnodes > self.nslots:
            raise ValueError(
                f"nnodes={self.nnodes} exceeds nslots={self.nslots}: every node needs a task")
        spn = self.slots_per_node
        if spn and self.nslots % spn:
            raise ValueError(f"nslots={self.nslots} is not a multiple of slots_per_node={spn}")
        if spn and self.nnodes and self.nnodes * spn != self.nslots:
            raise ValueError(
                f"nnodes={self.nnodes} x slots_per_node={spn} != nslots={self.nslots}")
        self._check_tree()
        # Normalise so equal requests hash equal whatever order constraints came in.
        object.__setattr__(self, "constraints", tuple(sorted(self.constraints)))
        object.__setattr__(self, "tree", bool(self.groups) or self.sockets > 0)

    def _check_tree(self) -> None:
        for level, count, exclusive in self.groups:
            if not level or count < 1 or not isinstance(exclusive, bool):
                raise ValueError(f"bad group {(level, count, exclusive)!r}")
        if len({g[0] for g in self.groups}) != len(self.groups):
            raise ValueError("a topology level appears twice in groups")
        if (self.socket_slots or self.socket_exclusive) and not self.sockets:
            raise ValueError("socket_slots and socket_exclusive need sockets > 0")
        if self.sockets > 1 and not self.socket_slots:
            raise ValueError("a slot can lie within one socket only (sockets=1)")
        unit = self.unit_slots
        for name in ("nslots", "slots_per_node"):
            if getattr(self, name) % unit:
                raise ValueError(f"{name}={getattr(self, name)} is not a multiple of the"
                                 f" {unit} slots of {self.sockets} sockets")
        counts = self.node_counts()
        if counts and self.sockets and any(c % unit for c in counts):
            raise ValueError("with slots bound to sockets, every node holds whole units:"
                             " give slots_per_node")

    @classmethod
    def from_strings(cls, constraints: list[str] | tuple[str, ...] = (),
                     **fields: int | bool) -> Request:
        """Build a Request with constraints given as strings ("zone=a", "spot")."""
        parsed = tuple(parse_constraint(c) for c in constraints)
        return cls(constraints=parsed, **fields)  # type: ignore[arg-type]

    @classmethod
    def from_shape(cls, shape: restree.Shape, constraints: tuple[Constraint, ...] = ()) -> Request:
        """The Request of a resource tree reduced by restree.shape_of."""
        return cls(nslots=shape.nslots, cores_per_slot=shape.cores, gpus_per_slot=shape.gpus,
                   mem_per_slot=shape.memory, nnodes=shape.nnodes,
                   slots_per_node=shape.slots_per_node,
                   exclusive=shape.node_exclusive or any(g[2] for g in shape.groups),
                   constraints=constraints, groups=shape.groups, sockets=shape.sockets,
                   socket_slots=shape.socket_slots, socket_exclusive=shape.socket_exclusive)

    @property
    def total_cores(self) -> int:
        return self.total_slots * self.cores_per_slot

    @property
    def total_slots(self) -> int:
        """Slots (tasks) of the whole request: nslots times every group count."""
        return restree.total_slots(self.nslots, self.groups)

    @property
    def unit_slots(self) -> int:
        """Slots that are placed together: sockets x socket_slots, else 1."""
        return self.sockets * self.socket_slots if self.socket_slots else 1

    @property
    def batchable(self) -> bool:
        """One flat CPU-only non-exclusive slot: array elements may take the batch path."""
        return (self.nslots == 1 and not self.exclusive and not self.gpus_per_slot
                and not self.tree)

    def node_counts(self) -> tuple[int, ...] | None:
        """Slots per node, largest first, when the node count is fixed; else None."""
        nodes = self.nnodes
        if not nodes and self.slots_per_node:
            nodes = self.nslots // self.slots_per_node
        if not nodes:
            return None
        base, extra = divmod(self.nslots, nodes)
        return (base + 1,) * extra + (base,) * (nodes - extra)
