"""Overlay message envelope (protocol.md §2.3): [version, kind, src, dst, body] in one msgpack frame. No I/O."""
from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

VERSION = 1
MAX_FRAME = 64 * 1024 * 1024


class BadMessage(ValueError):
    """A frame that does not follow §2.3; `src` is set when it could be read, so the sender can be told."""

    def __init__(self, message: str, code: str = "bad-frame", src: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.src = src


class Message(NamedTuple):
    kind: str
    src: int
    dst: int
    body: dict[str, Any]


def encode(msg: Message) -> bytes:
    return msgpack.packb([VERSION, msg.kind, msg.src, msg.dst, msg.body], use_bin_type=True)


def decode(frame: bytes) -> Message:
    if len(frame) > MAX_FRAME:
        raise BadMessage(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    try:
        value = msgpack.unpackb(frame, raw=False, strict_map_key=False, max_bin_len=MAX_FRAME)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise BadMessage(f"undecodable frame: {exc}") from None
    if not isinstance(value, list) or len(value) != 5:
        raise BadMessage("frame is not a 5-element array")
    version, kind, src, dst, body = value
    src_ok = isinstance(src, int) and not isinstance(src, bool)
    if version != VERSION:
        raise BadMessage(f"protocol version {version!r}, expected {VERSION}", "version", src if src_ok else None)
    if not (isinstance(kind, str) and src_ok and isinstance(dst, int) and isinstance(body, dict)):
        raise BadMessage("envelope fields have the wrong types", src=src if src_ok else None)
    return Message(kind, src, dst, body)


def peek(frame: bytes) -> tuple[str, int, int]:
    """(kind, src, dst) without decoding the body: interior ranks forward most frames unread."""
    if len(frame) > MAX_FRAME:
        raise BadMessage(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_FRAME)
    unpacker.feed(frame)
    try:
        if unpacker.read_array_header() != 5:
            raise BadMessage("frame is not a 5-element array")
        version, kind, src, dst = (unpacker.unpack() for _ in range(4))
    except BadMessage:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise BadMessage(f"undecodable frame: {exc}") from None
    src_ok = isinstance(src, int) and not isinstance(src, bool)
    if version != VERSION:
        raise BadMessage(f"protocol version {version!r}, expected {VERSION}", "version", src if src_ok else None)
    if not (isinstance(kind, str) and src_ok and isinstance(dst, int) and not isinstance(dst, bool)):
        raise BadMessage("envelope fields have the wrong types", src=src if src_ok else None)
    return kind, src, dst
