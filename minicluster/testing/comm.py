"""RecordingSender: an overlay `send` for tests that records what a component sends, as the wire carries it.

Every message is encoded with the real envelope codec (protocol.md §2.3) and decoded again before it is kept,
like HyperQueue's TestComm: a body the codec cannot carry fails the test where it is sent, and the test reads
exactly what the receiver would (tuples arrive as lists, and so on). The body is then checked against its
kind's dataclass (minicluster/proto/messages.py), so a body its receiver would refuse fails where it is sent.
"""
from __future__ import annotations

from typing import Any

from minicluster.proto import envelope, messages
from minicluster.proto.envelope import Message


class RecordingSender:
    """Pass `sender.send` where a component takes the overlay's `send(kind, dst, body)`."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.sent: list[Message] = []

    def send(self, kind: str, dst: int, body: dict[str, Any]) -> None:
        frame = envelope.encode(Message(kind, self.rank, dst, body))  # TypeError for what msgpack cannot carry
        received = envelope.decode(frame)
        if kind in messages.TO_WORKER:
            messages.decode_order(kind, received.body)  # BadMessage: its receiver would refuse it
        elif kind in messages.TO_RANK0:
            messages.decode(kind, received.body)
        self.sent.append(received)

    def kinds(self) -> list[str]:
        return [m.kind for m in self.sent]

    def take(self, kind: str | None = None) -> list[Message]:
        """The messages sent so far (only those of `kind` if given), removed from the record."""
        taken = [m for m in self.sent if kind is None or m.kind == kind]
        self.sent = [m for m in self.sent if kind is not None and m.kind != kind]
        return taken

    def only(self, kind: str) -> Message:
        """The one message of `kind` sent so far (removed); AssertionError if there is not exactly one."""
        found = self.take(kind)
        assert len(found) == 1, f"expected one {kind!r}, sent {[m.kind for m in found] or 'none'}"
        return found[0]
