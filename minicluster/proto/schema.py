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
"""
from __future__ import annotations

import dataclasses
import functools
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
    types: frozenset[type] | None  # the exact types accepted (msgpack makes no subclasses); None: anything
    required: bool
    default: Any
    factory: Callable[[], Any] | None
    convert: Callable[[Any, str], Any] | None  # checks elements, decodes nested messages, widens to float
    rows: RowCheck | None
    nested: bool  # holds messages, encoded one by one


@dataclasses.dataclass(frozen=True, slots=True)
class _Table:
    fields: tuple[_Field, ...]
    sent: tuple[tuple[str, str, bool], ...]  # (attr, key, holds nested messages) of the fields that travel
    counts_rows: bool
    rest: tuple[str, frozenset[str]] | None  # (attr, keys it leaves out) of a rest() field


class _WrongType(Exception):
    """Raised by a field's `convert`; decode_as names the field."""


_TABLES: dict[type, _Table] = {}
Convert = Callable[[Any, str], Any]


def _runtime(hint: Any, key: str) -> tuple[frozenset[type] | None, Convert | None]:
    """(exact types accepted, conversion) of one field's annotation."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        accepted: set[type] = set()
        convert = None
        for arm in (a for a in args if a is not type(None)):
            arm_types, arm_convert = _runtime(arm, key)
            if arm_types is None:
                return None, None
            accepted |= arm_types
            convert = convert or arm_convert
        return frozenset(accepted), convert
    origin = typing.get_origin(hint) or hint
    if origin is Any:
        return None, None
    if origin is float:
        return frozenset({int, float}), _to_float
    if origin is list and args and args[0] in (int, str):
        return frozenset({list}), functools.partial(_list_of, args[0])
    if origin is dict and args and isinstance(args[1], type) and issubclass(args[1], WireMessage):
        return frozenset({dict}), functools.partial(_nested, args[1], key)
    if origin is dict and args == (str, str):
        return frozenset({dict}), _str_to_str
    return frozenset({origin}), None


def _to_float(value: Any, _where: str) -> float:
    return float(value)


def _list_of(element: type, value: list[Any], _where: str) -> list[Any]:
    if not all(type(v) is element for v in value):
        raise _WrongType
    return value


def _str_to_str(value: dict[Any, Any], _where: str) -> dict[str, str]:
    if not all(type(k) is str and type(v) is str for k, v in value.items()):
        raise _WrongType
    return value


def _nested(cls: type[WireMessage], key: str, value: dict[Any, Any], where: str) -> dict[int, WireMessage]:
    if not all(type(k) is int and type(v) is dict for k, v in value.items()):
        raise _WrongType
    return {k: decode_as(cls, v, f"{where}{key}[{k}]") for k, v in value.items()}


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
        key = f.metadata.get("wire", f.name)
        accepted, convert = _runtime(hints[f.name], key)
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        required = f.default is dataclasses.MISSING and factory is None
        nested = isinstance(convert, functools.partial) and convert.func is _nested
        built.append(_Field(f.name, key, accepted, required, f.default, factory, convert, f.metadata.get("rows"),
                            nested))
    counts_rows = any(f.name == "dropped" for f in dataclasses.fields(cls))
    table = _TABLES[cls] = _Table(tuple(built), tuple((f.attr, f.key, f.nested) for f in built), counts_rows, rest)
    return table


def type_ok(value: Any, accepted: frozenset[type] | None) -> bool:
    """Whether `value` is of one of the exact types (bools are not ints, and ints are floats)."""
    return accepted is None or type(value) in accepted


def decode_as(cls: type[M], body: Mapping[str, Any], kind: str | None = None) -> M:
    """`body` as a `cls`, checked field by field; BadMessage (`bad-request`) names the first bad field."""
    name = kind or cls.KIND
    where = f"{name}: " if name else ""  # client requests name only the field (protocol.md §3.2)
    table = field_table(cls)
    strict_nil, int64 = cls.STRICT_NIL, cls.INT64
    values: dict[str, Any] = {}
    dropped = 0
    for f in table.fields:
        value: Any = body.get(f.key)
        if value is None and not (strict_nil and f.key in body):
            if f.required:
                raise BadMessage(f"{where}missing field {f.key!r}", "bad-request")
            values[f.attr] = f.factory() if f.factory is not None else f.default
            continue
        if f.types is not None and type(value) not in f.types:
            raise BadMessage(f"{where}field {f.key!r} has the wrong type", "bad-request")
        if int64 and type(value) is int and not -(1 << 63) <= value < 1 << 63:
            raise BadMessage(f"{where}field {f.key!r} is out of range (a signed 64-bit integer)", "bad-request")
        if f.rows is not None:
            kept = [row for row in value if f.rows(row)]
            dropped += len(value) - len(kept)
            value = kept
        elif f.convert is not None:
            try:
                value = f.convert(value, where)
            except _WrongType:
                raise BadMessage(f"{where}field {f.key!r} has the wrong type", "bad-request") from None
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
