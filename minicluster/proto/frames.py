"""Client protocol framing (protocol.md §3.1): 4-byte big-endian length + msgpack map.

No asyncio here: every `mc` command imports this, and start-up time is what a shell loop of them pays.
The broker's asynchronous reader lives in broker/api/clientapi.py.  The client's side (pack_request, read_blocking)
encodes and decodes small frames with smallpack.py, so that `mc-submit` does not import msgpack; the broker
(pack, unpack_body) and large frames use msgpack.
"""
from __future__ import annotations

import struct

from minicluster.proto import smallpack

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
HEADER = struct.Struct(">I")


class FrameError(ValueError):
    pass


class NotText(FrameError):
    """A string of the request is not UTF-8 text: the protocol carries text (protocol.md §3.1), and a byte
    that is not UTF-8 (in argv, a name, the environment) reaches Python as a lone surrogate."""


# Up to these sizes the client's frames go through smallpack.  A jobspec is a few KiB (its environment; tens in
# some), quick to encode in Python; a submit's answer is 20 bytes, while `mc jobs` pages or `mc top`'s status,
# many objects each, decode much faster in msgpack.
SMALL_REQUEST = 64 * 1024
SMALL_ANSWER = 4 * 1024


def pack(message: dict[str, Any]) -> bytes:
    import msgpack  # here: a client that sends only small frames never imports it (pack_request)

    return _framed(msgpack.packb(message, use_bin_type=True))


def pack_request(message: dict[str, Any]) -> bytes:
    """pack(), for a client: a small message is encoded without importing msgpack; NotText names the field of
    a string that is not UTF-8."""
    try:
        try:
            return _framed(smallpack.packb(message, SMALL_REQUEST))
        except smallpack.Unsupported:
            return pack(message)
    except UnicodeEncodeError:
        raise not_text(message, "") from None


def not_text(value: Any, where: str) -> NotText:
    """The error for a `value` that failed to encode: it names the first string in it that is not UTF-8."""
    return NotText(f"{_not_text(value, where) or 'a field'} is not valid UTF-8; minicluster carries text only"
                   " (arbitrary bytes in argv or names are not supported)")


def _not_text(value: Any, where: str) -> str | None:
    """Where in `value` the first string that does not encode as UTF-8 is, with the string, or None."""
    if isinstance(value, str):
        return None if _is_text(value) else f"{where} {_shown(value)}"
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and not _is_text(key):
                return f"a key of {where or 'the request'} {_shown(key)}"
            items.append((f"{where}.{key}" if where else str(key), item))
    elif isinstance(value, (list, tuple)):
        items = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    for name, item in items:
        found = _not_text(item, name)
        if found is not None:
            return found
    return None


def _is_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """`text` quoted, cut at 60 characters, each byte that was not UTF-8 (a lone surrogate) as `\\xff`."""
    cut = text if len(text) <= 60 else text[:60] + "…"
    return "'" + "".join(f"\\x{ord(c) - 0xdc00:02x}" if 0xdc80 <= ord(c) <= 0xdcff else repr(c)[1:-1]
                         for c in cut) + "'"


def _framed(body: bytes) -> bytes:
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit")
    return HEADER.pack(len(body)) + body


def unpack_body(body: bytes) -> dict[str, Any]:
    import msgpack  # here: see pack()

    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise FrameError(f"undecodable frame: {exc}") from None
    if not isinstance(value, dict):
        raise FrameError("frame does not hold a map")
    return value


def read_blocking(sock: Any) -> dict[str, Any] | None:
    """Blocking variant for the synchronous Client."""
    header = _recv_exactly(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    body = _recv_exactly(sock, length)
    if body is None:
        raise FrameError("connection closed inside a frame")
    if length <= SMALL_ANSWER:
        try:
            value = smallpack.unpackb(body)
        except smallpack.Unsupported:
            pass  # msgpack decodes it, or says what is wrong with it
        else:
            if isinstance(value, dict):
                return value
    return unpack_body(body)


def _recv_exactly(sock: Any, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise FrameError("connection closed inside a frame")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
