"""Heartbeats relayed up the tree together (protocol.md §2.6): an interior rank gathers the `hb` and `hbs` its
children send rank 0 and, a tenth of a heartbeat interval after the first, sends them on as one `hbs`.

Without it rank 0 reads one message per rank per interval, each through the whole receive path; at 1,000 ranks
that was a tenth of a core spent on liveness alone (issue 29). The relay needs no clock of its own: `call_later`
is the event loop's (a recorder in unit tests).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minicluster.proto import messages
from minicluster.proto.envelope import Message

# One `hbs` carries at most this many beats (protocol.md §2.5); more go as several.
MAX_BEATS = 10_000
RELAYED = frozenset({messages.Heartbeat.KIND, messages.Heartbeats.KIND})

CallLater = Callable[[float, Callable[[], None]], Any]


class HeartbeatRelay:
    """The beats from below waiting to go up, and the one timer that sends them."""

    def __init__(self, send: messages.Send, delay: float, call_later: CallLater) -> None:
        self._send = send
        self._delay = delay
        self._call_later = call_later
        self._beats: list[list[int]] = []
        self._timer: Any = None

    def add(self, msg: Message) -> None:
        """Take the beats of an `hb` or `hbs` (decoded envelope, for rank 0) into the next `hbs`; BadMessage when
        its body is wrong, as rank 0 would have refused it."""
        typed = messages.decode(msg.kind, msg.body)
        if isinstance(typed, messages.Heartbeat):
            self._beats.append([msg.src, typed.seq, typed.running])
        elif isinstance(typed, messages.Heartbeats):
            self._beats.extend(typed.beats)
        else:
            raise ValueError(f"{msg.kind} is not relayed")
        if self._timer is None and self._beats:
            self._timer = self._call_later(self._delay, self.flush)

    def flush(self) -> None:
        self._timer = None
        beats, self._beats = self._beats, []
        for start in range(0, len(beats), MAX_BEATS):
            messages.send(self._send, 0, messages.Heartbeats(beats[start:start + MAX_BEATS]))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
