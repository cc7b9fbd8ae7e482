"""Resource-tree requests, in the spirit of Flux's canonical jobspec (RFC 14/25). No I/O.

A request is a tree of resource vertices, each a type, a count and an
`exclusive` flag, with children.  Two spellings:

* the jobspec's `resources` list (RFC 14 style):
  ``[{"type": "rack", "count": 1, "with": [{"type": "node", "count": 4, "with": [...]}]}]``
* a shorthand for the command line: ``rack[1]>node[4]>slot[8]>core[2]``,
  ``node[2]>socket[1]>{core[8],gpu[1]}``, ``rack[1]:x>node[2]`` (`:x` or
  `:exclusive` marks a vertex exclusive), ``memory[4G]`` (MiB, or K/M/G/T).

Types: topology levels above the node (whatever the instance names: zone,
rack, switch, ...), `node`, `socket`, `slot` (one task), and the leaves
`core`, `gpu`, `memory`.  What the matcher supports is one chain
levels... > node > (slot | socket) > ... > leaves; `shape_of` reduces a tree
to that chain (a `Shape`) or says, in a sentence, why it cannot.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any, NoReturn

from minicluster.model.jobterms import MAX_COUNT as MAX_COUNT
from minicluster.model.text import brief

LEAVES = ("core", "gpu", "memory")
RESERVED = ("cluster", "node", "socket", "slot", *LEAVES)
_TYPE = re.compile(r"[a-z][a-z0-9_-]*\Z")
_VERTEX = re.compile(r"\s*([a-z][a-z0-9_-]*)\s*\[\s*([0-9]+)\s*([kKmMgGtT]?)\s*\]\s*"
                     r"(?::\s*(x|excl|exclusive)\b)?\s*")
# A real tree is a handful of levels (cluster>rack>node>socket>slot>core); the bound keeps a hostile one from
# exhausting the recursion of the parser and of every walk after it.
MAX_DEPTH = 16
_DEPTH_ERROR = f"the tree is deeper than {MAX_DEPTH} levels"
_MEM_UNITS = {"": 1, "m": 1, "k": 0, "g": 1024, "t": 1024 * 1024}
_PROPERTY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*\Z")


class TreeError(ValueError):
    """The resource tree is malformed or asks for something the matcher cannot express."""


@dataclass(frozen=True, slots=True)
class Vertex:
    type: str
    count: int
    exclusive: bool = False
    children: tuple[Vertex, ...] = ()


@dataclass(frozen=True, slots=True)
class Shape:
    """A tree reduced to the chain the matcher works with.

    groups: (level, count, exclusive) above the node, top down; the rest
    describes what ONE vertex of the innermost group level (or the whole
    cluster) must hold: `nnodes` nodes (0: any number) holding `nslots`
    slots, `slots_per_node` each when nnodes is set; every slot has
    `cores`, `gpus`, `memory` MB.  sockets > 0 binds slots to sockets:
    with socket_slots > 0 a unit is `sockets` sockets (of one node) with
    socket_slots slots each (socket[s]>slot[k]); with socket_slots == 0
    every slot lies within one socket (slot>socket[1]).
    """

    groups: tuple[tuple[str, int, bool], ...] = ()
    nnodes: int = 0
    node_exclusive: bool = False
    nslots: int = 1
    slots_per_node: int = 0
    cores: int = 1
    gpus: int = 0
    memory: int = 0
    sockets: int = 0
    socket_slots: int = 0
    socket_exclusive: bool = False

    @property
    def total_slots(self) -> int:
        return total_slots(self.nslots, self.groups)


def total_slots(nslots: int, groups: tuple[tuple[str, int, bool], ...]) -> int:
    """Slots of a whole request: the slots under one innermost vertex times every level's count."""
    for _level, count, _excl in groups:
        nslots *= count
    return nslots


# ------------------------------------------------------------------ levels

def parse_levels(text: str) -> tuple[tuple[str, str], ...]:
    """Topology levels above the node, top down, from the config's `topology`.

    "zone=topology.kubernetes.io/zone,rack=example.com/rack": level `zone`
    is the node property topology.kubernetes.io/zone, and so on; a bare
    name ("rack") reads the property of the same name.
    """
    levels: list[tuple[str, str]] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            if text.strip():
                raise ValueError(f"topology {text!r}: empty level (stray comma?)")
            continue
        name, _, prop = (p.strip() for p in item.partition("="))
        prop = prop or name
        check_level_name(name, f"topology {text!r}")
        if not _PROPERTY.match(prop):
            raise ValueError(f"topology {text!r}: bad property name {prop!r}")
        if any(name == n for n, _ in levels):
            raise ValueError(f"topology {text!r}: level {name!r} given twice")
        levels.append((name, prop))
    return tuple(levels)


def check_level_name(name: str, where: str) -> None:
    if not _TYPE.match(name):
        raise ValueError(f"{where}: level name {name!r} must be lower-case letters, digits,"
                         " '_' or '-', starting with a letter")
    if name in RESERVED:
        raise ValueError(f"{where}: {name!r} is a resource type, not a topology level")


# ------------------------------------------------------------------ spellings

def parse(text: str) -> tuple[Vertex, ...]:
    """Parse the shorthand; TreeError names the position of the problem."""
    parser = _Parser(text)
    vertices = parser.siblings()
    if parser.pos != len(text):
        parser.fail("unexpected text")
    return vertices


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos, self.depth = text, 0, 0

    def fail(self, what: str) -> NoReturn:
        raise TreeError(f"resources {brief(self.text)}: {what} at position {self.pos + 1}"
                        " (write e.g. node[2]>slot[4]>core[2] or node[1]>socket[1]>{core[8],gpu[1]})")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def siblings(self) -> tuple[Vertex, ...]:
        self.skip()
        if self.text.startswith("{", self.pos):
            self.pos += 1
            out = [self.chain()]
            self.skip()
            while self.text.startswith(",", self.pos):
                self.pos += 1
                out.append(self.chain())
                self.skip()
            if not self.text.startswith("}", self.pos):
                self.fail("missing '}'")
            self.pos += 1
            return tuple(out)
        return (self.chain(),)

    def chain(self) -> Vertex:
        found = _VERTEX.match(self.text, self.pos)
        if not found:
            self.fail("expected TYPE[COUNT]")
        kind, digits, unit, excl = found.groups()
        if len(digits) > 12:  # far beyond MAX_COUNT; int() of thousands of digits would refuse with its own error
            self.fail(f"{kind} count too large")
        self.pos = found.end()
        count = _count(kind, int(digits), unit.lower(), self.text)
        children: tuple[Vertex, ...] = ()
        if self.text.startswith(">", self.pos):
            self.depth += 1
            if self.depth >= MAX_DEPTH:
                self.fail(_DEPTH_ERROR)
            self.pos += 1
            children = self.siblings()
            self.depth -= 1
        return Vertex(kind, count, bool(excl), children)


def _count(kind: str, value: int, unit: str, text: str) -> int:
    if unit and kind != "memory":
        raise TreeError(f"resources {text!r}: only memory takes a unit, not {kind}")
    if unit == "k":
        value = -(-value // 1024)
    else:
        value *= _MEM_UNITS[unit]
    return value


def from_wire(data: Any) -> tuple[Vertex, ...]:
    """The jobspec's `resources`: a shorthand string or a list of vertex maps."""
    if isinstance(data, str):
        return parse(data)
    if not isinstance(data, list) or not data:
        raise TreeError("resources: must be a non-empty list of resource vertices or a string")
    return tuple(_vertex(v, 1) for v in data)


def _vertex(data: Any, depth: int) -> Vertex:
    if depth > MAX_DEPTH:
        raise TreeError(f"resources: {_DEPTH_ERROR}")
    if not isinstance(data, dict):
        raise TreeError("resources: each vertex must be a map with type and count")
    unknown = sorted(str(k) for k in data if k not in ("type", "count", "exclusive", "with", "unit"))
    if unknown:
        raise TreeError(f"resources: unknown key(s) {', '.join(unknown)} in a vertex")
    kind, count, excl = data.get("type"), data.get("count"), data.get("exclusive", False)
    if not isinstance(kind, str) or not _TYPE.match(kind):
        raise TreeError(f"resources: bad vertex type {kind!r}")
    if isinstance(count, bool) or not isinstance(count, int):
        raise TreeError(f"resources: {kind} count must be an integer, got {count!r}")
    if not isinstance(excl, bool):
        raise TreeError(f"resources: {kind} exclusive must be true or false")
    unit = data.get("unit", "")
    if unit not in ("", "MB", "MiB", "GB", "GiB"):
        raise TreeError(f"resources: unit {unit!r} of {kind} must be MiB or GiB")
    if unit:
        count = _count(kind, count, unit[0].lower(), "resources")
    children = data.get("with", [])
    if not isinstance(children, list):
        raise TreeError(f"resources: `with` of {kind} must be a list")
    return Vertex(kind, count, excl, tuple(_vertex(c, depth + 1) for c in children))


def to_wire(vertices: tuple[Vertex, ...]) -> list[dict[str, Any]]:
    out = []
    for v in vertices:
        d: dict[str, Any] = {"type": v.type, "count": v.count}
        if v.exclusive:
            d["exclusive"] = True
        if v.children:
            d["with"] = to_wire(v.children)
        out.append(d)
    return out


def format_tree(vertices: tuple[Vertex, ...]) -> str:
    """The shorthand of a tree (parse(format_tree(t)) == t)."""
    parts = []
    for v in vertices:
        text = f"{v.type}[{v.count}]" + (":x" if v.exclusive else "")
        if v.children:
            text += ">" + format_tree(v.children)
        parts.append(text)
    return parts[0] if len(parts) == 1 else "{" + ",".join(parts) + "}"


# ------------------------------------------------------------------ reduction

def shape_of(vertices: tuple[Vertex, ...]) -> Shape:
    """Reduce a tree to the chain the matcher supports, or TreeError saying why not."""
    for v in _all(vertices):
        if not 1 <= v.count <= MAX_COUNT:
            raise TreeError(f"resources: {v.type} count must be 1..{MAX_COUNT}, got {v.count}")
    if len(vertices) != 1:
        raise TreeError("resources: the tree needs one root (a level, node, socket or slot)")
    v = vertices[0]
    if v.type == "cluster":
        if v.count != 1 or len(v.children) != 1:
            raise TreeError("resources: cluster[1] must have exactly one child")
        v = v.children[0]
    groups: list[tuple[str, int, bool]] = []
    while v.type not in ("node", "socket", "slot", *LEAVES):
        check_level_name(v.type, "resources")
        if any(v.type == g[0] for g in groups):
            raise TreeError(f"resources: {v.type} appears twice on one path")
        groups.append((v.type, v.count, v.exclusive))
        v = _only_child(v, below_node=False)
    nnodes, node_excl, per = 0, False, v
    if v.type == "node":
        nnodes, node_excl = v.count, v.exclusive
        per = _only_child(v, below_node=True)
    unit = _below_node(per)
    if not nnodes and unit["socket_slots"]:
        # socket[s] with no node above: s sockets anywhere, each its own unit
        unit.update(units=unit["sockets"], sockets=1, slots_per_unit=unit["socket_slots"])
    slots_here = unit["units"] * unit["slots_per_unit"]
    shape = Shape(
        groups=tuple(groups), nnodes=nnodes, node_exclusive=node_excl,
        nslots=slots_here * max(nnodes, 1), slots_per_node=slots_here if nnodes else 0,
        cores=unit["core"], gpus=unit["gpu"], memory=unit["memory"],
        sockets=unit["sockets"], socket_slots=unit["socket_slots"],
        socket_exclusive=unit["socket_exclusive"])
    if shape.total_slots > MAX_COUNT:
        raise TreeError(f"resources: {shape.total_slots} tasks is more than {MAX_COUNT}")
    return shape


def shape_from_options(ntasks: int = 1, nnodes: int = 0, tasks_per_node: int = 0, cores: int = 1,
                       gpus: int = 0, memory: int = 0, exclusive: bool = False,
                       locality: str | None = None, spread: str | None = None,
                       gpu_affinity: bool = False) -> Shape:
    """The Shape of the shorthands -N/-n/-c/-g/--mem/--exclusive and --locality/--spread/
    --gpu-affinity.

    -N 4 -n 8 -c 2 is node[4]>slot[2]>core[2] (n not a multiple of N: the
    tasks spread as evenly as possible, 5 over 2 -> 3+2); --locality rack
    puts it all under one rack (rack[1]>...); --spread rack gives every
    node (with -N) or every task (without) its own rack (rack[N]>node[1]>...);
    --gpu-affinity keeps each task's GPUs on the socket of its cores
    (slot>socket[1]>{core,gpu}).
    """
    groups: list[tuple[str, int, bool]] = []
    for name in (locality, spread):
        if name is not None:
            check_level_name(name, "locality" if name is locality else "spread")
    if locality is not None and locality == spread:
        raise TreeError(f"locality and spread name the same level {locality!r}")
    if locality is not None:
        groups.append((locality, 1, False))
    per_node = tasks_per_node or (ntasks // nnodes if nnodes and not ntasks % nnodes else 0)
    nodes = nnodes or (ntasks // tasks_per_node if tasks_per_node else 0)
    if spread is not None:
        if nodes and not per_node:
            raise TreeError(f"spread: {ntasks} tasks do not divide evenly over {nodes} {spread}s"
                            " (make -n a multiple of -N)")
        groups.append((spread, nodes or ntasks, False))
        ntasks, nnodes, tasks_per_node = (per_node, 1, 0) if nodes else (1, 0, 0)
    if gpu_affinity and not gpus:
        raise TreeError("gpu_affinity: the tasks ask for no GPU (add -g)")
    return Shape(groups=tuple(groups), nnodes=nnodes, node_exclusive=exclusive, nslots=ntasks,
                 slots_per_node=tasks_per_node, cores=cores, gpus=gpus, memory=memory,
                 sockets=1 if gpu_affinity else 0)


def _all(vertices: tuple[Vertex, ...]) -> Iterator[Vertex]:
    for v in vertices:
        yield v
        yield from _all(v.children)


def _only_child(v: Vertex, below_node: bool) -> Vertex:
    """The one vertex under v; leaves directly under v form an implicit slot[1].

    A vertex with nothing below holds one slot of one core.
    """
    if not v.children:
        return Vertex("slot", 1, False, (Vertex("core", 1),))
    if all(c.type in LEAVES for c in v.children):
        return Vertex("slot", 1, False, v.children)
    if len(v.children) != 1:
        where = "a node" if below_node else v.type
        raise TreeError(f"resources: {where} must contain exactly one kind of vertex below it"
                        f" (node, socket, slot, or leaves core/gpu/memory), got"
                        f" {len(v.children)}")
    child = v.children[0]
    if below_node and child.type not in ("socket", "slot"):
        raise TreeError(f"resources: a {v.type} contains sockets, slots or leaves, not"
                        f" {child.type}")
    return child


def _below_node(v: Vertex) -> dict[str, Any]:
    """The per-node (or per-group) part: slot[k]>leaves, slot[k]>socket[1]>leaves or
    socket[s]>slot[k]>leaves (socket[s]>leaves: one slot per socket)."""
    out: dict[str, Any] = {"sockets": 0, "socket_slots": 0, "socket_exclusive": False}
    if v.type in LEAVES:
        v = Vertex("slot", 1, False, (v,))
    if v.type == "socket":
        inner = _only_child(v, below_node=True)
        if inner.type != "slot":
            raise TreeError("resources: a socket contains slots or leaves")
        out.update(sockets=v.count, socket_slots=inner.count, socket_exclusive=v.exclusive,
                   units=1, slots_per_unit=v.count * inner.count)
        out.update(_leaves(inner.children, "slot"))
        return out
    if v.type != "slot":
        raise TreeError(f"resources: expected a slot or socket below the node, got {v.type}")
    out.update(units=v.count, slots_per_unit=1)
    if len(v.children) == 1 and v.children[0].type == "socket":
        sock = v.children[0]
        if sock.count != 1:
            raise TreeError("resources: a slot can hold socket[1] only (its cores, GPUs and"
                            " memory on one socket)")
        out.update(sockets=1, socket_exclusive=sock.exclusive)
        out.update(_leaves(sock.children, "socket"))
        return out
    out.update(_leaves(v.children, "slot"))
    return out


def _leaves(children: tuple[Vertex, ...], parent: str) -> dict[str, int]:
    children = children or (Vertex("core", 1),)
    found = {"core": 0, "gpu": 0, "memory": 0}
    for c in children:
        if c.type not in LEAVES:
            raise TreeError(f"resources: a {parent} contains only core, gpu and memory, not {c.type}")
        if found[c.type]:
            raise TreeError(f"resources: {c.type} appears twice in one {parent}")
        if c.children:
            raise TreeError(f"resources: {c.type} cannot contain other resources")
        found[c.type] = c.count
    if not found["core"]:
        raise TreeError(f"resources: every task needs at least one core (add core[1] to the {parent})")
    return found
