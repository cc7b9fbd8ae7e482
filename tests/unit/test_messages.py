"""Typed overlay messages (minicluster/proto/messages.py): what decodes, what is refused and how it is named."""
from __future__ import annotations

from typing import Any

import pytest

from minicluster.proto import messages
from minicluster.proto.envelope import BadMessage

VALID: list[tuple[str, dict[str, Any], messages.WorkerMessage]] = [
    ("hb", {"seq": 3, "running": 2}, messages.Heartbeat(3, 2)),
    ("hb", {}, messages.Heartbeat(0, 0)),
    ("join", {"pid": 7, "hostname": "n1", "resources": {"cores": 2}, "running": [[1, 0, [0], [], 0]],
              "results": [], "epoch": 2},
     messages.Join(7, "n1", {"cores": 2}, [[1, 0, [0], [], 0]], [], 2)),
    ("join", {}, messages.Join(None, "", {}, [], [], 0)),
    ("done", {"results": [[1, 0, 0, 0, None, None, 1.0, 2.0, 0]]},
     messages.Done([[1, 0, 0, 0, None, None, 1.0, 2.0, 0]])),
    ("out", {"chunks": [[1, 0, 1, b"hi\n"]]}, messages.Output([[1, 0, 1, b"hi\n"]])),
    ("pmi-put", {"job": 1, "seq": 0, "kvs": {"k": "v"}}, messages.PmiPut(1, 0, kvs={"k": "v"})),
    ("pmi-put", {"job": 1, "seq": 2, "data": b"\x00"}, messages.PmiPut(1, 2, data=b"\x00")),
    ("pmi-init", {"job": 4}, messages.PmiInit(4)),
    ("stdin-ack", {"job": 4, "seq": 1, "open": True}, messages.StdinAck(4, 1, True)),
    ("abort", {"job": 4, "task": 7, "code": 3, "message": "bye", "t": 12}, messages.Abort(4, 7, 3, "bye", 12.0)),
    ("abort", {"job": 4, "task": 7, "code": 3}, messages.Abort(4, 7, 3, "", None)),
    ("error", {"code": "unknown-kind", "message": "no", "ref": "x"}, messages.Refusal("unknown-kind", "no", "x")),
]


@pytest.mark.parametrize(("kind", "body", "expected"), VALID)
def test_valid_bodies_decode_and_encode_back(kind: str, body: dict[str, Any],
                                             expected: messages.WorkerMessage) -> None:
    decoded = messages.decode(kind, body)
    assert decoded == expected
    assert messages.decode(kind, messages.to_body(decoded)) == decoded


REFUSED = [
    ("hb", {"seq": "1"}, "hb: field 'seq' has the wrong type"),
    ("join", {"pid": True}, "join: field 'pid' has the wrong type"),
    ("join", {"running": {}}, "join: field 'running' has the wrong type"),
    ("done", {}, "done: missing field 'results'"),
    ("done", {"results": "rows"}, "done: field 'results' has the wrong type"),
    ("out", {"chunks": None}, "out: missing field 'chunks'"),
    ("pmi-put", {"job": 1, "seq": 0}, "pmi-put: exactly one of 'kvs' and 'data' is expected"),
    ("pmi-put", {"job": 1, "seq": 0, "kvs": {}, "data": b""}, "pmi-put: exactly one of 'kvs' and 'data' is expected"),
    ("pmi-put", {"job": 1, "seq": 0, "kvs": {"k": 1}}, "pmi-put: 'kvs' maps strings to strings"),
    ("pmi-put", {"seq": 0, "kvs": {}}, "pmi-put: missing field 'job'"),
    ("pmi-init", {"job": 1.5}, "pmi-init: field 'job' has the wrong type"),
    ("stdin-ack", {"job": 1, "seq": 0, "open": 1}, "stdin-ack: field 'open' has the wrong type"),
    ("abort", {"job": 1, "task": 0}, "abort: missing field 'code'"),
    ("abort", {"job": 1, "task": 0, "code": 1, "t": True}, "abort: field 't' has the wrong type"),
    ("error", {"code": 3}, "error: field 'code' has the wrong type"),
]


@pytest.mark.parametrize(("kind", "body", "says"), REFUSED)
def test_bad_bodies_are_refused_naming_the_field(kind: str, body: dict[str, Any], says: str) -> None:
    with pytest.raises(BadMessage) as refused:
        messages.decode(kind, body)
    assert (refused.value.code, str(refused.value)) == ("bad-request", says)


def test_malformed_rows_are_dropped_and_counted_the_rest_kept() -> None:
    good = [1, 0, 0, 0, None, None, 1.0, 2.0, 0]
    done = messages.decode("done", {"results": [good, [1, 0], "x", [1, "0", 0, 0, None, None, 1.0, 2.0], good]})
    assert done == messages.Done([good, good], dropped=3)
    out = messages.decode("out", {"chunks": [[1, 0, 1, b"a\n"], [1, 0, 3, b"b"], [1, 0, 2, "text"], [1, 0, 2]]})
    assert out == messages.Output([[1, 0, 1, b"a\n"]], dropped=3)
    join = messages.decode("join", {"running": [[1, 0, [0], []], [1, 0, 0, 0]], "results": [good, []]})
    assert isinstance(join, messages.Join) and (join.running, join.results, join.dropped) == ([[1, 0, [0], []]],
                                                                                              [good], 2)
    assert "dropped" not in messages.to_body(done)


def test_every_kind_a_worker_sends_rank_0_has_a_message() -> None:
    # protocol.md §2.5, "Worker → rank 0", plus `error` (any → any).
    assert set(messages.TO_RANK0) == {"hb", "join", "out", "done", "pmi-put", "pmi-init", "stdin-ack", "abort",
                                      "error", "returned"}
