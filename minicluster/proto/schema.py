"""One decoder for every typed wire body: a field table read off the dataclass, built once per class. No I/O.

A message class is a frozen dataclass deriving from `WireMessage`. Its fields and their annotations are the
schema: a field without a default is required, one with a default may be absent or nil. Types are checked
exactly (msgpack makes no subclasses): `int` refuses bools, `float` takes ints too, `Any` takes anything,
`list[int]`/`list[str]`/`dict[str, str]` check their elements, `dict[int, C]` with `C` another message class
decodes each value as a `C`. Field metadata adds what annotations cannot say:
`wire(name)` for a body key that is not a Python name (`from`), `rows(check)` for a list whose rows are checked
one by one (a bad row is dropped and counted in the class's `dropped` field, the rest still counts), and
`LOCAL` for a field that never travels (`dropped` itself). A class may add `check(kind)` for rules across fields.

A missing or mistyped field raises BadMessage with code `bad-request` naming the kind and the field, the form
protocol.md §2.5 gives (`join: field 'pid' has the wrong type`). Client requests (minicluster/proto/requests.py)
speak the client protocol's dialect (§3.2), set by `STRICT_NIL` and `INT64` on the class: their messages name
only the field, a nil is a wrong type rather than an absent field, and integers must fit in 64 signed bits;
`rest()` there gathers the body's other keys (`update`'s changes).

Each class's decoder and encoder are Python source generated from its table on first use and compiled, as
dataclasses does for `__init__`: every message of the hot path (`run`, `done`, `ahead`) crosses them, and a
generic loop over the fields cost two to three times as much (docs/performance.md, "Typed messages").
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from minicluster.proto.envelope import BadMessage

RowCheck = Callable[[Any], bool]
LOCAL: Mapping[str, Any] = {"local": True}


def wire(name: str) -> Mapping[str, Any]:
    """Field metadata: the body key is `name`, not the field's own name."""
    return {"wire": name}


def rest(*ignored: str) -> Mapping[str, Any]:
    """Field metadata: a dict of every body key no other field reads, except `ignored`."""
    return {"rest": frozenset(ignored)}


def rows(check: RowCheck) -> Mapping[str, Any]:
    """Field metadata: a list whose rows are checked one by one with `check`; bad ones are dropped."""
    return {"rows": check}


class WireMessage:
    """A typed message body. `KIND` is its kind on the wire; `dropped` counts malformed rows left out."""

    __slots__ = ()
    KIND: ClassVar[str] = ""
    STRICT_NIL: ClassVar[bool] = False  # a nil value is a wrong type, not an absent field
    INT64: ClassVar[bool] = False  # integers out of the signed 64-bit range are refused

    @property
    def dropped(self) -> int:
        return 0

    def check(self, kind: str) -> None:
        """Rules across fields; raises BadMessage starting with `kind`. Most kinds have none."""


M = TypeVar("M", bound=WireMessage)


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    attr: str
    key: str
    types: frozenset[type] | None  # the exact types accepted (msgpack makes no subclasses); None: anything
    required: bool
    default: Any
    factory: Callable[[], Any] | None
    # The field's extra work: "float" widens ints, "list" checks elements of type `element`, "str-map" keys and
    # values, "nested" decodes each value of a dict[int, C] as an `element` message (and encodes it back).
    convert: str | None
    element: type | None
    rows: RowCheck | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Table:
    fields: tuple[_Field, ...]
    # Both compiled from the fields when the table is built (see _compile): a loop over the fields, with its
    # branches taken per field and message, cost several times the CPU of the straight-line code.
    decode: Callable[[Mapping[str, Any], str], Any]  # (body, "kind: ") -> the message, before its check()
    encode: Callable[[Any], dict[str, Any]]


_TABLES: dict[type, _Table] = {}


def _runtime(hint: Any) -> tuple[frozenset[type] | None, str | None, type | None]:
    """(exact types accepted, conversion, element type) of one field's annotation."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        accepted: set[type] = set()
        convert, element = None, None
        for arm in (a for a in args if a is not type(None)):
            arm_types, arm_convert, arm_element = _runtime(arm)
            if arm_types is None:
                return None, None, None
            accepted |= arm_types
            if convert is None:
                convert, element = arm_convert, arm_element
        return frozenset(accepted), convert, element
    origin = typing.get_origin(hint) or hint
    if origin is Any:
        return None, None, None
    if origin is float:
        return frozenset({int, float}), "float", None
    if origin is list and args and args[0] in (int, str):
        return frozenset({list}), "list", args[0]
    if origin is dict and args and isinstance(args[1], type) and issubclass(args[1], WireMessage):
        return frozenset({dict}), "nested", args[1]
    if origin is dict and args == (str, str):
        return frozenset({dict}), "str-map", None
    return frozenset({origin}), None, None


def field_table(cls: type) -> _Table:
    """The decoding table of a message class, built from its fields on first use."""
    table = _TABLES.get(cls)
    if table is not None:
        return table
    hints = typing.get_type_hints(cls)
    built = []
    rest = None
    for f in dataclasses.fields(cls):
        if "rest" in f.metadata:
            rest = (f.name, f.metadata["rest"])
        if f.metadata.get("local") or "rest" in f.metadata:
            continue
        accepted, convert, element = _runtime(hints[f.name])
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        required = f.default is dataclasses.MISSING and factory is None
        built.append(_Field(f.name, f.metadata.get("wire", f.name), accepted, required, f.default, factory, convert,
                            element, f.metadata.get("rows")))
    table = _TABLES[cls] = _Table(tuple(built), _compile_decode(cls, built, rest), _compile_encode(built))
    return table


def _wrong(key: str) -> str:
    return f"raise BadMessage(f\"{{where}}field {key!r} has the wrong type\", 'bad-request')"


def _field_lines(cls: type, i: int, f: _Field) -> list[str]:
    """The decoder's lines for field `f`, leaving its value in `a<i>`."""
    absent = f"v is None and {f.key!r} not in body" if cls.STRICT_NIL else "v is None"  # type: ignore[attr-defined]
    lines = [f" v = get({f.key!r})", f" if {absent}:"]
    if f.required:
        lines.append(f"  raise BadMessage(f\"{{where}}missing field {f.key!r}\", 'bad-request')")
    else:
        lines.append(f"  a{i} = F{i}()" if f.factory is not None else f"  a{i} = D{i}")
    lines.append(" else:")
    if f.types is not None:
        lines.append(f"  if type(v) not in T{i}: {_wrong(f.key)}")
    if cls.INT64:  # type: ignore[attr-defined]
        lines.append(f"  if type(v) is int and not -(1 << 63) <= v < 1 << 63: raise BadMessage("
                     f"f\"{{where}}field {f.key!r} is out of range (a signed 64-bit integer)\", 'bad-request')")
    if f.rows is not None:
        lines += [f"  kept = [row for row in v if R{i}(row)]", "  dropped += len(v) - len(kept)", "  v = kept"]
    elif f.convert == "float":
        lines.append("  v = float(v)")
    elif f.convert == "list":
        lines += ["  for x in v:", f"   if type(x) is not E{i}: {_wrong(f.key)}"]
    elif f.convert == "str-map":
        lines += ["  for k, x in v.items():", f"   if type(k) is not str or type(x) is not str: {_wrong(f.key)}"]
    elif f.convert == "nested":
        lines += ["  for k, x in v.items():", f"   if type(k) is not int or type(x) is not dict: {_wrong(f.key)}",
                  f"  v = {{k: decode_as(E{i}, x, f\"{{where}}{f.key}[{{k}}]\") for k, x in v.items()}}"]
    lines.append(f"  a{i} = v")
    return lines


def _compile_decode(cls: type, fields: list[_Field], rest: tuple[str, frozenset[str]] | None,
                    ) -> Callable[[Mapping[str, Any], str], Any]:
    """The decoder of `cls`: straight-line Python generated from its field table once, as dataclasses generates
    `__init__`. It sets the slots itself: the frozen dataclass's `__init__` costs twice as much."""
    space: dict[str, Any] = {"cls": cls, "new": object.__new__, "BadMessage": BadMessage, "decode_as": decode_as}
    lines = ["def decode(body, where):", " get = body.get", " dropped = 0"]
    for i, f in enumerate(fields):
        space.update({f"T{i}": f.types, f"D{i}": f.default, f"F{i}": f.factory, f"E{i}": f.element, f"R{i}": f.rows})
        lines += _field_lines(cls, i, f)
    lines.append(" o = new(cls)")
    values = {f.attr: f"a{i}" for i, f in enumerate(fields)}
    if rest is not None:
        space["KNOWN"] = frozenset(f.key for f in fields) | rest[1]
        values[rest[0]] = "{k: v for k, v in body.items() if k not in KNOWN}"
    for d in dataclasses.fields(cls):
        value = values.get(d.name)
        if value is None:  # a field that never travels: `dropped` counts the rows left out
            space[f"L_{d.name}"] = d.default_factory if d.default is dataclasses.MISSING else (lambda v=d.default: v)
            value = "dropped" if d.name == "dropped" else f"L_{d.name}()"
        slot = next(k.__dict__[d.name] for k in cls.__mro__ if d.name in k.__dict__)  # a base class's, maybe
        space[f"S_{d.name}"] = slot.__set__  # the slot's own setter
        lines.append(f" S_{d.name}(o, {value})")
    lines.append(" return o")
    exec("\n".join(lines), space)  # the source is built above from the class's own fields
    decode: Callable[[Mapping[str, Any], str], Any] = space["decode"]
    return decode


def _compile_encode(fields: list[_Field]) -> Callable[[Any], dict[str, Any]]:
    """The encoder: the fields that travel and are set, nested messages encoded one by one."""
    lines = ["def encode(message):", " body = {}"]
    for f in fields:
        value = "{k: _encode(m) for k, m in v.items()}" if f.convert == "nested" else "v"
        lines += [f" v = message.{f.attr}", " if v is not None:", f"  body[{f.key!r}] = {value}"]
    lines.append(" return body")
    space: dict[str, Any] = {"_encode": encode}
    exec("\n".join(lines), space)
    encoder: Callable[[Any], dict[str, Any]] = space["encode"]
    return encoder


def type_ok(value: Any, accepted: frozenset[type] | None) -> bool:
    """Whether `value` is of one of the exact types (bools are not ints, and ints are floats)."""
    return accepted is None or type(value) in accepted


def decode_as(cls: type[M], body: Mapping[str, Any], kind: str | None = None) -> M:
    """`body` as a `cls`, checked field by field; BadMessage (`bad-request`) names the first bad field."""
    name = kind or cls.KIND
    message: M = field_table(cls).decode(body, f"{name}: " if name else "")  # client requests name only the field
    message.check(name)
    return message


def encode(message: WireMessage) -> dict[str, Any]:
    """The wire body; optional fields left unset (nil) are not sent. Rows and maps are not copied."""
    return field_table(type(message)).encode(message)
