"""Typed overlay messages (minicluster/proto/messages.py): what decodes, what is refused and how it is named."""
from __future__ import annotations

from typing import Any

import pytest

from minicluster.proto import messages, schema
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
    ("pmi-put", {"job": 1, "seq": 0, "kvs": {"k": 1}}, "pmi-put: field 'kvs' has the wrong type"),
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
    hbs = messages.decode("hbs", {"beats": [[3, 1, 0], [3, True, 0], [4, 1], "x", [5, 2, 1]]})
    assert hbs == messages.Heartbeats([[3, 1, 0], [5, 2, 1]], dropped=3)


def test_every_kind_a_worker_sends_rank_0_has_a_message() -> None:
    # protocol.md §2.5, "Worker → rank 0", plus `error` (any → any).
    assert set(messages.TO_RANK0) == {"hb", "hbs", "join", "out", "done", "pmi-put", "pmix-group", "pmi-init",
                                      "stdin-ack", "abort", "error", "returned"}


JOBINFO = {"argv": ["true"], "env": {"PATH": "/bin"}, "ntasks": 2, "layout": [[1, 2]], "uid": 1000, "gid": 1000,
           "cwd": "/tmp", "output": "out-{id}", "mpi": "pmix", "array": True, "stdin": [0], "mem_per_task": 64}
# A body with every field set, for each kind in both directions (protocol.md §2.5).
FULL: dict[str, dict[str, Any]] = {
    "hb": {"seq": 3, "running": 2},
    "join": {"pid": 7, "hostname": "n1", "resources": {"gpus": []}, "running": [[1, 0, [0], [], 1]],
             "results": [[1, 0, 0, 0, None, None, 1.0, 2.0, 0, {"cpu": 0.5, "rss": 9}]], "epoch": 2},
    "done": {"results": [[1, 0, 0, 0, None, None, 1.0, 2.0, 0]]},
    "hbs": {"beats": [[3, 7, 1], [4, 2, 0]]},
    "out": {"chunks": [[1, 0, 2, b"err\n"]]},
    "pmi-put": {"job": 1, "seq": 0, "kvs": {"k": "v"}},
    "pmix-group": {"job": 1, "group": "g", "seq": 0, "op": "construct", "nodes": [0, 1], "ctxid": True, "status": 0,
                   "data": b"blob"},
    "pmi-init": {"job": 4},
    "stdin-ack": {"job": 4, "seq": 1, "open": True},
    "abort": {"job": 4, "task": 7, "code": 3, "message": "bye", "t": 12.5},
    "error": {"code": "bad-request", "message": "no", "ref": "run"},
    "welcome": {"epoch": 3, "size": 4},
    "rejoin": {"epoch": 3},
    "run": {"jobs": {7: JOBINFO}, "tasks": [[7, 0, 0, [0, 1], [], 2], [7, 1, 1, [2], [0]]]},
    "done-ack": {"keys": [[7, 0, 2], [7, 1]]},
    "kill": {"keys": [[7, 0]], "signal": 15, "grace": 5.0},
    "pmi-kvs": {"job": 7, "seq": 1, "data": b"blob"},
    "pmix-group-done": {"job": 7, "group": "g", "seq": 0, "status": 0, "ctxid": 5, "data": b"blob"},
    "stdin": {"job": 7, "seq": 0, "tasks": [0, 3], "data": b"line\n", "eof": True},
    "shutdown": {},
    "pmix-dmodex": {"job": 7, "task": 3, "id": 12, "from": 2},
    "pmix-dmodex-data": {"job": 7, "id": 12, "status": -46, "data": b""},
    "ahead": {"jobs": {7: JOBINFO}, "tasks": [[7, 2, 2, [0], [], 0, 0], [7, 3, 3, [0], [], 1, 2]]},
    "recall": {"keys": [[7, 2], [7, 3]]},
    "returned": {"keys": [[7, 3]]},
}
WRONG = [1.5, "text", b"bin", [1], {"k": "v"}, True, 3]


def decode_any(kind: str, body: dict[str, Any]) -> schema.WireMessage:
    return messages.decode_order(kind, body) if kind in messages.TO_WORKER else messages.decode(kind, body)


def test_every_kind_of_both_directions_has_a_full_example() -> None:
    assert set(FULL) == set(messages.TO_RANK0) | set(messages.TO_WORKER)
    assert set(messages.TO_WORKER) >= messages.PEER_KINDS


@pytest.mark.parametrize("kind", sorted(FULL))
def test_every_kind_round_trips(kind: str) -> None:
    decoded = decode_any(kind, FULL[kind])
    assert kind == decoded.KIND and decoded.dropped == 0
    assert messages.to_body(decoded) == FULL[kind]
    assert decode_any(kind, messages.to_body(decoded)) == decoded


def _fields(kind: str) -> list[tuple[str, bool, tuple[type, ...]]]:
    cls = messages.TO_WORKER.get(kind) or messages.TO_RANK0[kind]
    return [(f.key, f.required, f.types) for f in schema.field_table(cls).fields]


@pytest.mark.parametrize(("kind", "key"), [(k, key) for k in sorted(FULL) for key, required, _ in _fields(k)
                                           if required])
def test_each_missing_required_field_is_refused_by_name(kind: str, key: str) -> None:
    body = {name: value for name, value in FULL[kind].items() if name != key}
    with pytest.raises(BadMessage) as refused:
        decode_any(kind, body)
    assert (refused.value.code, str(refused.value)) == ("bad-request", f"{kind}: missing field {key!r}")


@pytest.mark.parametrize(("kind", "key", "value"), [
    (k, key, next(v for v in WRONG if not schema.type_ok(v, types)))
    for k in sorted(FULL) for key, _, types in _fields(k) if object not in types])
def test_each_mistyped_field_is_refused_by_name(kind: str, key: str, value: Any) -> None:
    with pytest.raises(BadMessage) as refused:
        decode_any(kind, {**FULL[kind], key: value})
    assert (refused.value.code, str(refused.value)) == ("bad-request", f"{kind}: field {key!r} has the wrong type")


@pytest.mark.parametrize(("key", "value"), [("argv", "true"), ("env", {"PATH": 1}), ("ntasks", "2"),
                                            ("layout", [[1]]), ("uid", None), ("mpi", 1), ("stdin", ["0"])])
def test_a_bad_jobinfo_refuses_the_run_naming_job_and_field(key: str, value: Any) -> None:
    with pytest.raises(BadMessage) as refused:
        messages.decode_order("run", {"jobs": {7: {**JOBINFO, key: value}}, "tasks": []})
    assert str(refused.value) in (f"run: jobs[7]: field {key!r} has the wrong type",
                                  f"run: jobs[7]: missing field {key!r}")


def test_malformed_rows_from_rank_0_are_dropped_and_counted() -> None:
    run = messages.decode_order("run", {"jobs": {}, "tasks": [[7, 0, 0, [0], []], [7, "1", 1, [1], []], [7, 2]]})
    assert isinstance(run, messages.Run) and (run.tasks, run.dropped) == ([[7, 0, 0, [0], []]], 2)
    kill = messages.decode_order("kill", {"keys": [[7, 0], [7], "x", [7, 1, 0, 0]], "signal": 9})
    assert isinstance(kill, messages.Kill) and (kill.keys, kill.dropped, kill.grace) == ([[7, 0]], 3, 0.0)


def test_pmi_kvs_carries_exactly_one_of_kvs_and_data() -> None:
    with pytest.raises(BadMessage, match="pmi-kvs: exactly one of 'kvs' and 'data' is expected"):
        messages.decode_order("pmi-kvs", {"job": 1, "seq": 0})
    with pytest.raises(BadMessage, match=r"run: jobs\[7\]: 'argv' is empty"):
        messages.decode_order("run", {"jobs": {7: {**JOBINFO, "argv": []}}})


def test_job_ids_of_a_run_are_integers() -> None:
    with pytest.raises(BadMessage, match="run: field 'jobs' has the wrong type"):
        messages.decode_order("run", {"jobs": {"7": JOBINFO}})
