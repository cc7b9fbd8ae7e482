"""The interior ranks' heartbeat relay (minicluster/overlay/relay.py, protocol.md §2.6), with a recorded timer."""
from __future__ import annotations

from typing import Any

import pytest

from minicluster.overlay import relay as relay_mod
from minicluster.overlay.relay import HeartbeatRelay
from minicluster.proto.envelope import BadMessage, Message


class Timers:
    """`call_later` that only records: the test fires the timer itself."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Any]] = []
        self.cancelled = 0

    def __call__(self, delay: float, callback: Any) -> Any:
        self.pending.append((delay, callback))
        return self

    def cancel(self) -> None:
        self.cancelled += 1

    def fire(self) -> None:
        (_, callback), = self.pending
        self.pending.clear()
        callback()


def relay_with(timers: Timers, sent: list[tuple[str, int, dict[str, Any]]]) -> HeartbeatRelay:
    return HeartbeatRelay(lambda kind, dst, body: sent.append((kind, dst, body)), 0.1, timers)


def test_beats_from_below_go_up_as_one_hbs_after_the_delay() -> None:
    timers, sent = Timers(), []
    relay = relay_with(timers, sent)
    relay.add(Message("hb", 3, 0, {"seq": 7, "running": 2}))
    relay.add(Message("hbs", 4, 0, {"beats": [[9, 1, 0], [10, 4, 1]]}))
    relay.add(Message("hb", 4, 0, {"seq": 5, "running": 0}))
    assert sent == [] and [delay for delay, _ in timers.pending] == [0.1]  # one timer for the batch
    timers.fire()
    assert sent == [("hbs", 0, {"beats": [[3, 7, 2], [9, 1, 0], [10, 4, 1], [4, 5, 0]]})]

    relay.add(Message("hb", 3, 0, {"seq": 8, "running": 2}))  # the next batch gets a timer of its own
    timers.fire()
    assert sent[-1] == ("hbs", 0, {"beats": [[3, 8, 2]]})


def test_more_beats_than_one_message_holds_go_as_several(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_mod, "MAX_BEATS", 3)
    timers, sent = Timers(), []
    relay = relay_with(timers, sent)
    relay.add(Message("hbs", 4, 0, {"beats": [[r, 1, 0] for r in range(10, 17)]}))
    timers.fire()
    assert [len(body["beats"]) for _, _, body in sent] == [3, 3, 1]
    assert [b[0] for _, _, body in sent for b in body["beats"]] == list(range(10, 17))


def test_a_bad_beat_is_refused_and_nothing_is_queued() -> None:
    timers, sent = Timers(), []
    relay = relay_with(timers, sent)
    with pytest.raises(BadMessage):
        relay.add(Message("hb", 3, 0, {"seq": "x"}))
    relay.add(Message("hbs", 3, 0, {"beats": [[1, "x", 0]]}))  # a malformed row is dropped, as rank 0 would
    assert timers.pending == [] and sent == []
    with pytest.raises(ValueError):
        relay.add(Message("done", 3, 0, {"results": []}))


def test_close_cancels_what_waits() -> None:
    timers, sent = Timers(), []
    relay = relay_with(timers, sent)
    relay.add(Message("hb", 3, 0, {}))
    relay.close()
    assert timers.cancelled == 1
