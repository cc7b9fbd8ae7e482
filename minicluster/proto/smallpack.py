"""MessagePack for the small frames of short-lived clients, in pure Python.

Importing the msgpack package (its C extension, which imports datetime, and msgpack.ext, which imports
collections) costs a one-shot `mc-submit` about as much as the rest of its imports together (issue 17 item 6),
to encode one jobspec and decode a 30-byte answer.  This module does those in pure Python, byte for byte as
`msgpack.packb(obj, use_bin_type=True)` and `msgpack.unpackb(data, raw=False, strict_map_key=False)` do
(tests/unit/test_smallpack.py holds it to them).  It handles nil, bool, int, float, str, bin, array and map; for
anything else (ext types, other Python types, malformed or deeply nested data, more than `limit` bytes) it raises
Unsupported, and the caller uses msgpack itself (minicluster/proto/frames.py), which gives the real answer or
the real error.  Long-lived processes (the broker) and large frames use msgpack: it is much faster per object.
"""
from __future__ import annotations

import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from typing import Any

_DOUBLE = struct.Struct(">d")
_FLOAT = struct.Struct(">f")
_MAX_DEPTH = 64  # deeper data is left to msgpack (whose own limit is 511)


class Unsupported(Exception):
    """Not for this codec: use msgpack."""


def packb(obj: Any, limit: int) -> bytes:
    """`obj` as msgpack.packb(obj, use_bin_type=True) would encode it; Unsupported past `limit` bytes."""
    out = bytearray()
    _pack(obj, out, limit, 0)
    return bytes(out)


def _pack(obj: Any, out: bytearray, limit: int, depth: int) -> None:
    kind = type(obj)
    if obj is None:
        out.append(0xC0)
    elif kind is bool:
        out.append(0xC3 if obj else 0xC2)
    elif kind is int:
        _pack_int(obj, out)
    elif kind is float:
        out.append(0xCB)
        out += _DOUBLE.pack(obj)
    elif kind is str:
        try:
            data = obj.encode("utf-8")
        except UnicodeEncodeError:
            raise Unsupported("not UTF-8") from None
        _pack_header(len(data), out, 0xA0, 32, (0xD9, 0xDA, 0xDB))
        out += data
    elif kind is bytes or kind is bytearray:
        _pack_header(len(obj), out, None, 0, (0xC4, 0xC5, 0xC6))
        out += obj
    elif kind is list or kind is tuple or kind is dict:
        if depth >= _MAX_DEPTH:
            raise Unsupported("nested too deeply")
        if kind is dict:
            _pack_header(len(obj), out, 0x80, 16, (None, 0xDE, 0xDF))
            for key, value in obj.items():
                _pack(key, out, limit, depth + 1)
                _pack(value, out, limit, depth + 1)
        else:
            _pack_header(len(obj), out, 0x90, 16, (None, 0xDC, 0xDD))
            for item in obj:
                _pack(item, out, limit, depth + 1)
    else:
        raise Unsupported(f"type {kind.__name__}")
    if len(out) > limit:
        raise Unsupported("too large")


def _pack_int(n: int, out: bytearray) -> None:
    if 0 <= n < 0x80 or -32 <= n < 0:
        out += n.to_bytes(1, "big", signed=n < 0)
    elif n >= 0:
        for code, size in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
            if n < 1 << (8 * size):
                out.append(code)
                out += n.to_bytes(size, "big")
                return
        raise Unsupported("integer too large")
    else:
        for code, size in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
            if n >= -(1 << (8 * size - 1)):
                out.append(code)
                out += n.to_bytes(size, "big", signed=True)
                return
        raise Unsupported("integer too small")


def _pack_header(length: int, out: bytearray, fix: int | None, fix_below: int,
                 codes: tuple[int | None, int | None, int]) -> None:
    """The type byte and length of a str, bin, array or map: its fix form below `fix_below`, else the smallest of
    the 8-, 16- and 32-bit forms it has (`codes`)."""
    if fix is not None and length < fix_below:
        out.append(fix | length)
        return
    for code, size in zip(codes, (1, 2, 4), strict=True):
        if code is not None and length < 1 << (8 * size):
            out.append(code)
            out += length.to_bytes(size, "big")
            return
    raise Unsupported("too long")


def unpackb(data: bytes) -> Any:
    """msgpack.unpackb(data, raw=False, strict_map_key=False), or Unsupported."""
    try:
        obj, end = _unpack(data, 0, 0)
    except (IndexError, ValueError, TypeError, UnicodeDecodeError, struct.error) as exc:
        # Truncated or malformed data, an unhashable map key: msgpack tells what is wrong with it.
        raise Unsupported(str(exc)) from None
    if end != len(data):
        raise Unsupported("extra data")
    return obj


def _unpack(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    code = data[pos]
    pos += 1
    if code < 0x80:
        return code, pos
    if code >= 0xE0:
        return code - 0x100, pos
    if 0xA0 <= code < 0xC0:
        return _text(data, pos, code & 0x1F)
    if code < 0xA0:  # fixmap 0x80-0x8f, fixarray 0x90-0x9f
        return _container(data, pos, code & 0x0F, code < 0x90, depth)
    if code == 0xC0:
        return None, pos
    if code in (0xC2, 0xC3):
        return code == 0xC3, pos
    if 0xCC <= code <= 0xD3:
        size = 1 << ((code - 0xCC) & 3)
        end = pos + size
        if end > len(data):
            raise IndexError("truncated integer")
        return int.from_bytes(data[pos:end], "big", signed=code >= 0xD0), end
    if code in (0xCA, 0xCB):
        fmt = _FLOAT if code == 0xCA else _DOUBLE
        return fmt.unpack_from(data, pos)[0], pos + fmt.size
    sized = _SIZED.get(code)
    if sized is None:
        raise Unsupported(f"type byte 0x{code:02x}")  # ext types, and 0xc1 which is never used
    kind, size = sized
    end = pos + size
    if end > len(data):
        raise IndexError("truncated length")
    length = int.from_bytes(data[pos:end], "big")
    if kind == "str":
        return _text(data, end, length)
    if kind == "bin":
        if end + length > len(data):
            raise IndexError("truncated bin")
        return bytes(data[end:end + length]), end + length
    return _container(data, end, length, kind == "map", depth)


# Type byte -> (what, bytes of its length) for the str, bin, array and map forms with a length field.
_SIZED = {0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4), 0xC4: ("bin", 1), 0xC5: ("bin", 2),
          0xC6: ("bin", 4), 0xDC: ("array", 2), 0xDD: ("array", 4), 0xDE: ("map", 2), 0xDF: ("map", 4)}


def _text(data: bytes, pos: int, length: int) -> tuple[str, int]:
    end = pos + length
    if end > len(data):
        raise IndexError("truncated str")
    return data[pos:end].decode("utf-8"), end


def _container(data: bytes, pos: int, length: int, is_map: bool, depth: int) -> tuple[Any, int]:
    if depth >= _MAX_DEPTH:
        raise Unsupported("nested too deeply")
    if length > len(data) - pos:
        raise IndexError("truncated container")  # every item takes a byte at least
    if is_map:
        out: dict[Any, Any] = {}
        for _ in range(length):
            key, pos = _unpack(data, pos, depth + 1)
            out[key], pos = _unpack(data, pos, depth + 1)
        return out, pos
    items = []
    for _ in range(length):
        item, pos = _unpack(data, pos, depth + 1)
        items.append(item)
    return items, pos
