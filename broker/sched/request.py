"""What a job asks for: the Request value type and constraint parsing.

A Request is a frozen, hashable value so the scheduler can use it as a cache
key ("this shape did not fit in this cycle") and the broker can journal it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class Request:
    """Resources for one job (or one element of an array job).

    nnodes=0 lets the matcher use any number of nodes; nnodes>0 spreads the
    slots over exactly that many nodes as evenly as possible (5 over 2 -> 3+2).
    slots_per_node>0 fixes the count on every node used; nslots must then be a
    multiple of it.  exclusive allocates whole nodes.
    """

    nslots: int = 1
    cores_per_slot: int = 1
    gpus_per_slot: int = 0
    mem_per_slot: int = 0
    nnodes: int = 0
    slots_per_node: int = 0
    exclusive: bool = False
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        if self.nslots < 1:
            raise ValueError(f"nslots must be >= 1, got {self.nslots}")
        if self.cores_per_slot < 1:
            raise ValueError(f"cores_per_slot must be >= 1, got {self.cores_per_slot}")
        for name in ("gpus_per_slot", "mem_per_slot", "nnodes", "slots_per_node"):
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
        # Normalise so equal requests hash equal whatever order constraints came in.
        object.__setattr__(self, "constraints", tuple(sorted(self.constraints)))

    @classmethod
    def from_strings(cls, constraints: list[str] | tuple[str, ...] = (),
                     **fields: int | bool) -> Request:
        """Build a Request with constraints given as strings ("zone=a", "spot")."""
        parsed = tuple(parse_constraint(c) for c in constraints)
        return cls(constraints=parsed, **fields)  # type: ignore[arg-type]

    @property
    def total_cores(self) -> int:
        return self.nslots * self.cores_per_slot

    def node_counts(self) -> tuple[int, ...] | None:
        """Slots per node, largest first, when the node count is fixed; else None."""
        nodes = self.nnodes
        if not nodes and self.slots_per_node:
            nodes = self.nslots // self.slots_per_node
        if not nodes:
            return None
        base, extra = divmod(self.nslots, nodes)
        return (base + 1,) * extra + (base,) * (nodes - extra)

    def to_wire(self) -> dict[str, object]:
        """Plain dict (msgpack/JSON safe) for journaling."""
        return {
            "nslots": self.nslots, "cores_per_slot": self.cores_per_slot,
            "gpus_per_slot": self.gpus_per_slot, "mem_per_slot": self.mem_per_slot,
            "nnodes": self.nnodes, "slots_per_node": self.slots_per_node,
            "exclusive": self.exclusive,
            "constraints": [format_constraint(c) for c in self.constraints],
        }

    @classmethod
    def from_wire(cls, wire: dict[str, object]) -> Request:
        fields = dict(wire)
        constraints = fields.pop("constraints", [])
        return cls.from_strings(constraints, **fields)  # type: ignore[arg-type]
