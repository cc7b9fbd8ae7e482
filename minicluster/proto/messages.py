"""Typed overlay messages a worker sends rank 0 (protocol.md §2.5): checked once, where rank 0 reads them.

`decode(kind, body)` turns a body into its dataclass, or raises BadMessage (code `bad-request`, naming the field)
so the sender can be told; the broker's handlers then read attributes, never `.get()` with a guess. Workers
build their bodies with `to_body()`. Rows (`done` results, `out` chunks, `join.running`) stay lists, for speed,
but each is checked here: a malformed row is dropped and counted in `dropped`, the rest of the message counts.
No I/O.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from minicluster.proto.envelope import BadMessage


def _get(body: dict[str, Any], kind: str, name: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in body or body[name] is None:
        if default is ...:
            raise BadMessage(f"{kind}: missing field {name!r}", "bad-request")
        return default
    value = body[name]
    if isinstance(value, bool) and types in (int, float, (int, float)):
        raise BadMessage(f"{kind}: field {name!r} has the wrong type", "bad-request")
    if not isinstance(value, types):
        raise BadMessage(f"{kind}: field {name!r} has the wrong type", "bad-request")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _result_row(row: Any) -> bool:
    """[job, task, status, exit_code, signal, error, started, ended, (attempt, (usage))] (§2.5 `done`)."""
    return (isinstance(row, list) and 8 <= len(row) <= 10 and _is_int(row[0]) and _is_int(row[1])
            and _is_int(row[2]) and (len(row) < 9 or _is_int(row[8])))


def _chunk_row(row: Any) -> bool:
    """[job, task, stream, data] (§2.5 `out`)."""
    return (isinstance(row, list) and len(row) == 4 and _is_int(row[0]) and _is_int(row[1])
            and row[2] in (1, 2) and isinstance(row[3], bytes))


def _running_row(row: Any) -> bool:
    """[job, task, cores, gpus, (attempt)] (§2.5 `join`)."""
    return (isinstance(row, list) and 4 <= len(row) <= 5 and _is_int(row[0]) and _is_int(row[1])
            and isinstance(row[2], list) and isinstance(row[3], list))


def _rows(rows: list[Any], valid: Callable[[Any], bool]) -> tuple[list[Any], int]:
    kept = [row for row in rows if valid(row)]
    return kept, len(rows) - len(kept)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """`hb` (§2.5, §2.6)."""
    seq: int
    running: int

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Heartbeat:
        return cls(_get(body, "hb", "seq", int, 0), _get(body, "hb", "running", int, 0))


@dataclass(frozen=True, slots=True)
class Join:
    """`join` (§2.5, §2.6): `resources` is §2.7, checked by broker/nodes.py against the graph."""
    pid: int | None
    hostname: str
    resources: dict[str, Any]
    running: list[Any]
    results: list[Any]
    epoch: int
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Join:
        running, bad_running = _rows(_get(body, "join", "running", list, []), _running_row)
        results, bad_results = _rows(_get(body, "join", "results", list, []), _result_row)
        return cls(_get(body, "join", "pid", int, None), _get(body, "join", "hostname", str, ""),
                   _get(body, "join", "resources", dict, {}), running, results, _get(body, "join", "epoch", int, 0),
                   bad_running + bad_results)


@dataclass(frozen=True, slots=True)
class Done:
    """`done` (§2.5, §2.9, §3.10)."""
    results: list[Any]
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Done:
        return cls(*_rows(_get(body, "done", "results", list), _result_row))


@dataclass(frozen=True, slots=True)
class Output:
    """`out` (§2.5): chunks of whole lines."""
    chunks: list[Any]
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Output:
        return cls(*_rows(_get(body, "out", "chunks", list), _chunk_row))


@dataclass(frozen=True, slots=True)
class PmiPut:
    """`pmi-put` (§2.8): a PMI-1 barrier's `kvs`, or a PMIx fence's `data`."""
    job: int
    seq: int
    kvs: dict[str, str] | None = None
    data: bytes | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> PmiPut:
        put = cls(_get(body, "pmi-put", "job", int), _get(body, "pmi-put", "seq", int),
                  _get(body, "pmi-put", "kvs", dict, None), _get(body, "pmi-put", "data", bytes, None))
        if (put.kvs is None) == (put.data is None):
            raise BadMessage("pmi-put: exactly one of 'kvs' and 'data' is expected", "bad-request")
        if put.kvs is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in put.kvs.items()):
            raise BadMessage("pmi-put: 'kvs' maps strings to strings", "bad-request")
        return put


@dataclass(frozen=True, slots=True)
class PmiInit:
    """`pmi-init` (§2.5, §3.6)."""
    job: int

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> PmiInit:
        return cls(_get(body, "pmi-init", "job", int))


@dataclass(frozen=True, slots=True)
class StdinAck:
    """`stdin-ack` (§2.5, §3.8)."""
    job: int
    seq: int
    open: bool

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> StdinAck:
        return cls(_get(body, "stdin-ack", "job", int), _get(body, "stdin-ack", "seq", int),
                   _get(body, "stdin-ack", "open", bool, False))


@dataclass(frozen=True, slots=True)
class Abort:
    """`abort` (§2.5, §2.8): `t` is when, on the worker's clock; None if an older worker did not say."""
    job: int
    task: int
    code: int
    message: str
    t: float | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Abort:
        t = _get(body, "abort", "t", (int, float), None)
        return cls(_get(body, "abort", "job", int), _get(body, "abort", "task", int), _get(body, "abort", "code", int),
                   _get(body, "abort", "message", str, ""), None if t is None else float(t))


@dataclass(frozen=True, slots=True)
class Refusal:
    """`error` (§2.5): the message of kind `ref` was refused."""
    code: str
    message: str
    ref: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Refusal:
        return cls(_get(body, "error", "code", str, ""), _get(body, "error", "message", str, ""),
                   _get(body, "error", "ref", str, ""))


def _key_row(row: Any) -> bool:
    """[job, task] (§2.10 `recall`, `returned`)."""
    return isinstance(row, list) and len(row) == 2 and _is_int(row[0]) and _is_int(row[1])


def _ahead_row(row: Any) -> bool:
    """[job, task, index, cores, gpus, attempt, after] (§2.10 `ahead`)."""
    return (isinstance(row, list) and len(row) == 7 and _is_int(row[0]) and _is_int(row[1]) and _is_int(row[2])
            and isinstance(row[3], list) and isinstance(row[4], list) and _is_int(row[5]) and _is_int(row[6]))


@dataclass(frozen=True, slots=True)
class Returned:
    """`returned` (§2.10): entries sent ahead that the worker dropped unstarted."""
    keys: list[Any]
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Returned:
        return cls(*_rows(_get(body, "returned", "keys", list), _key_row))


@dataclass(frozen=True, slots=True)
class Ahead:
    """`ahead` (§2.10, rank 0 -> worker): elements to start when the task each follows (`after`) ends."""
    jobs: dict[Any, Any]
    tasks: list[Any]
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Ahead:
        return cls(_get(body, "ahead", "jobs", dict), *_rows(_get(body, "ahead", "tasks", list), _ahead_row))


@dataclass(frozen=True, slots=True)
class Recall:
    """`recall` (§2.10, rank 0 -> worker): drop these entries sent ahead if they have not started."""
    keys: list[Any]
    dropped: int = 0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Recall:
        return cls(*_rows(_get(body, "recall", "keys", list), _key_row))


WorkerMessage = Heartbeat | Join | Done | Output | PmiPut | PmiInit | StdinAck | Abort | Refusal | Returned

TO_RANK0: dict[str, Callable[[dict[str, Any]], WorkerMessage]] = {
    "hb": Heartbeat.from_body, "join": Join.from_body, "done": Done.from_body, "out": Output.from_body,
    "pmi-put": PmiPut.from_body, "pmi-init": PmiInit.from_body, "stdin-ack": StdinAck.from_body,
    "abort": Abort.from_body, "error": Refusal.from_body, "returned": Returned.from_body,
}


def decode(kind: str, body: dict[str, Any]) -> WorkerMessage:
    """The typed message of a kind in TO_RANK0 (KeyError for others); BadMessage when the body is wrong."""
    return TO_RANK0[kind](body)


def to_body(message: WorkerMessage) -> dict[str, Any]:
    """The wire body; optional fields left unset are not sent. Rows are not copied."""
    return {f.name: value for f in fields(message)
            if f.name != "dropped" and (value := getattr(message, f.name)) is not None}
