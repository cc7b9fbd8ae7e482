"""One decoder for every typed wire body: a field table read off the dataclass, built once per class. No I/O.

A message class is a frozen dataclass deriving from `WireMessage`. Its fields and their annotations are the
schema: a field without a default is required, one with a default may be absent or nil; `int` refuses bools,
`float` takes ints too, `list[int]`/`list[str]`/`dict[str, str]` check their elements, `dict[int, C]` with `C`
another message class decodes each value as a `C`. Field metadata adds what annotations cannot say:
`wire(name)` for a body key that is not a Python name (`from`), `rows(check)` for a list whose rows are checked
one by one (a bad row is dropped and counted in the class's `dropped` field, the rest still counts), and
`LOCAL` for a field that never travels (`dropped` itself). A class may add `check(kind)` for rules across fields.

A missing or mistyped field raises BadMessage with code `bad-request` naming the kind and the field, the form
protocol.md §2.5 gives (`join: field 'pid' has the wrong type`). Client requests (minicluster/proto/requests.py)
speak the client protocol's dialect (§3.2), set by `STRICT_NIL` and `INT64` on the class: their messages name
only the field, a nil is a wrong type rather than an absent field, and integers must fit in 64 signed bits;
`rest()` there gathers the body's other keys (`update`'s changes).
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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    types: tuple[type, ...]
    required: bool
    default: Any
    factory: Callable[[], Any] | None
    element: tuple[type, ...] | None  # list elements, or dict keys and values, checked one by one
    nested: type[WireMessage] | None  # dict[int, C]: values decoded as C
    rows: RowCheck | None
    as_float: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Table:
    fields: tuple[_Field, ...]
    sent: tuple[tuple[str, str, bool], ...]  # (attr, key, holds nested messages) of the fields that travel
    counts_rows: bool
    rest: tuple[str, frozenset[str]] | None  # (attr, keys it leaves out) of a rest() field


_TABLES: dict[type, _Table] = {}


def _runtime(hint: Any) -> tuple[tuple[type, ...], bool, tuple[type, ...] | None, type[WireMessage] | None]:
    """(accepted types, optional, element types, nested class) of one annotation."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        accepted: tuple[type, ...] = ()
        element = nested = None
        for arm in inner:
            arm_types, _, element, nested = _runtime(arm)
            accepted += arm_types
        return accepted, type(None) in args, element, nested
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return (int, float), False, None, None
    if origin is list and args and args[0] in (int, str):
        return (list,), False, (args[0],), None
    if origin is dict and args and isinstance(args[1], type) and issubclass(args[1], WireMessage):
        return (dict,), False, (args[0],), args[1]
    if origin is dict and args and args[0] is str and args[1] is str:
        return (dict,), False, (str,), None
    if origin is Any:
        return (object,), False, None, None
    return (origin,), False, None, None


def field_table(cls: type) -> _Table:
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
        accepted, _optional, element, nested = _runtime(hints[f.name])
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        required = f.default is dataclasses.MISSING and factory is None
        built.append(_Field(f.name, f.metadata.get("wire", f.name), accepted, required, f.default, factory, element,
                            nested, f.metadata.get("rows"), hints[f.name] in (float, float | None)))
    counts_rows = any(f.name == "dropped" for f in dataclasses.fields(cls))
    table = _TABLES[cls] = _Table(tuple(built), tuple((f.attr, f.key, f.nested is not None) for f in built),
                                 counts_rows, rest)
    return table


def _wrong(where: str, name: str) -> BadMessage:
    return BadMessage(f"{where}field {name!r} has the wrong type", "bad-request")


def type_ok(value: Any, accepted: tuple[type, ...]) -> bool:
    return isinstance(value, accepted) and (bool in accepted or not isinstance(value, bool))


def _elements_ok(value: Any, element: tuple[type, ...]) -> bool:
    want = element[0]
    if isinstance(value, dict):
        return all(isinstance(k, want) and isinstance(v, str) for k, v in value.items())
    if want is int:
        return all(is_int(v) for v in value)
    return all(isinstance(v, want) for v in value)


def decode_as(cls: type[M], body: Mapping[str, Any], kind: str | None = None) -> M:
    """`body` as a `cls`, checked field by field; BadMessage (`bad-request`) names the first bad field."""
    name = kind or cls.KIND
    where = f"{name}: " if name else ""  # client requests name only the field (protocol.md §3.2)
    table = field_table(cls)
    values: dict[str, Any] = {}
    dropped = 0
    for f in table.fields:
        value: Any = body.get(f.key)
        if value is None and not (cls.STRICT_NIL and f.key in body):
            if f.required:
                raise BadMessage(f"{where}missing field {f.key!r}", "bad-request")
            values[f.attr] = f.factory() if f.factory is not None else f.default
            continue
        if not type_ok(value, f.types):
            raise _wrong(where, f.key)
        if cls.INT64 and is_int(value) and not -(1 << 63) <= value < 1 << 63:
            raise BadMessage(f"{where}field {f.key!r} is out of range (a signed 64-bit integer)", "bad-request")
        if f.rows is not None:
            kept = [row for row in value if f.rows(row)]
            dropped += len(value) - len(kept)
            value = kept
        elif f.nested is not None:
            if not all(is_int(k) for k in value) or not all(isinstance(v, dict) for v in value.values()):
                raise _wrong(where, f.key)
            value = {k: decode_as(f.nested, v, f"{where}{f.key}[{k}]") for k, v in value.items()}
        elif f.element is not None and not _elements_ok(value, f.element):
            raise _wrong(where, f.key)
        elif f.as_float:
            value = float(value)
        values[f.attr] = value
    if dropped and table.counts_rows:
        values["dropped"] = dropped
    if table.rest is not None:
        known = {f.key for f in table.fields} | table.rest[1]
        values[table.rest[0]] = {k: v for k, v in body.items() if k not in known}
    message = cls(**values)
    message.check(name)
    return message


def encode(message: WireMessage) -> dict[str, Any]:
    """The wire body; optional fields left unset (nil) are not sent. Rows and maps are not copied."""
    body: dict[str, Any] = {}
    for attr, key, nested in field_table(type(message)).sent:
        value = getattr(message, attr)
        if value is not None:
            body[key] = {k: encode(v) for k, v in value.items()} if nested else value
    return body
