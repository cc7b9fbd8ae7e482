"""smallpack (minicluster/proto/smallpack.py) encodes and decodes byte for byte as msgpack does, and leaves to
msgpack (Unsupported) whatever it does not handle; the client's framing falls back to msgpack for those."""
from __future__ import annotations

import msgpack
import pytest

from minicluster.proto import frames, smallpack

INTS = [0, 1, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0xFFFFFFFF, 0x100000000, 2**64 - 1, -1, -32, -33, -0x80,
        -0x81, -0x8000, -0x8001, -0x80000000, -0x80000001, -(2**63)]
LENGTHS = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
VALUES = [None, True, False, 0.0, -1.5, 1e300, float("inf"), "", "é", "日本", b"", b"\x00\xff", bytearray(b"ab"),
          *INTS, *("x" * n for n in LENGTHS), *(b"y" * n for n in LENGTHS), *([1] * n for n in LENGTHS),
          *({i: i for i in range(n)} for n in LENGTHS), (1, "a"), {"a": [1, {"b": None}], 2: b"c", None: 1.0},
          {"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "env": {"HOME": "/root"}, "ntasks": 1}}]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:40])
def test_same_bytes_and_values_as_msgpack(value: object) -> None:
    data = smallpack.packb(value, 1 << 30)
    assert data == msgpack.packb(value, use_bin_type=True)
    assert smallpack.unpackb(data) == msgpack.unpackb(data, raw=False, strict_map_key=False)


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [msgpack.ExtType(1, b"x"), 2**64, -(2**63) - 1, {1, 2}, "\ud800", object(),
                                   _nested(70)], ids=lambda v: repr(v)[:40])
def test_what_it_cannot_encode_is_left_to_msgpack(value: object) -> None:
    with pytest.raises(smallpack.Unsupported):
        smallpack.packb(value, 1 << 30)


def test_limit() -> None:
    smallpack.packb("x" * 100, 102)
    with pytest.raises(smallpack.Unsupported):
        smallpack.packb("x" * 100, 101)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\xd4\x01\x00", b"\xc7\x01\x01x", b"\x92\x01", b"\xa2a",
                                  b"\xa2\xff\xfe", b"\x81\x90\x01", b"\x01\x02", b"\xcd\x01", b"\xcb\x00",
                                  b"\x91" * 70 + b"\xc0"], ids=repr)
def test_what_it_cannot_decode_is_left_to_msgpack(data: bytes) -> None:
    with pytest.raises(smallpack.Unsupported):
        smallpack.unpackb(data)


class _Sock:
    """What read_blocking reads from: the bytes of one frame."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def recv(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk


MESSAGES = [{"v": 1, "id": 1, "ok": True, "job": 7}, {"x": msgpack.ExtType(1, b"x")},
            {"big": "x" * (frames.SMALL_REQUEST + 1)}, {"answer": "x" * frames.SMALL_ANSWER}, {"list": [1, 2]}]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: repr(m)[:40])
def test_client_frames_round_trip_through_either_codec(message: dict[str, object]) -> None:
    data = frames.pack_request(message)
    assert data == frames.pack(message)
    assert frames.read_blocking(_Sock(data)) == message


@pytest.mark.parametrize("body", [msgpack.packb([1, 2]), b"\xc1", msgpack.packb({"a": 1}) + b"\x00"], ids=repr)
def test_client_frame_errors_are_msgpacks(body: bytes) -> None:
    with pytest.raises(frames.FrameError) as raised:
        frames.read_blocking(_Sock(frames.HEADER.pack(len(body)) + body))
    with pytest.raises(frames.FrameError) as direct:
        frames.unpack_body(body)
    assert str(raised.value) == str(direct.value)
