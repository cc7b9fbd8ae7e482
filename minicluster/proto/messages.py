"""Typed overlay messages (protocol.md §2.5): a dataclass per kind, built by its sender, checked once by its receiver.

Each direction has its table: TO_RANK0 (what a worker sends rank 0, decoded by the broker's dispatch) and
TO_WORKER (what rank 0 sends a worker, and worker ↔ worker kinds, decoded by the worker agent's `handle`).
`decode(kind, body)` turns a body into its dataclass, or raises BadMessage (code `bad-request`, naming the
field) so the sender can be told; handlers then read attributes, never `.get()` with a guess. Senders build the
dataclass and `send(sender, dst, message)`. Field checks are one generic decoder over the dataclass fields
(minicluster/proto/schema.py). Rows (`done` results, `out` chunks, `join.running`, `run` tasks, `kill` and
`done-ack` keys) stay lists, for speed, but each is checked here: a malformed row is dropped and counted in
`dropped`, the rest of the message counts; `done` and `run` rows are read through their records (rows.py). No I/O.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from minicluster.proto.envelope import BadMessage
from minicluster.proto.rows import result_row_ok as _result_row, task_row_ok as _task_row
from minicluster.proto.schema import LOCAL, WireMessage, decode_as, encode, rows, wire

Send = Callable[[str, int, dict[str, Any]], None]


def _chunk_row(row: Any) -> bool:
    """[job, task, stream, data] (§2.5 `out`)."""
    return (type(row) is list and len(row) == 4 and type(row[0]) is int and type(row[1]) is int
            and row[2] in (1, 2) and type(row[3]) is bytes)


def _running_row(row: Any) -> bool:
    """[job, task, cores, gpus, (attempt)] (§2.5 `join`)."""
    return (type(row) is list and 4 <= len(row) <= 5 and type(row[0]) is int and type(row[1]) is int
            and type(row[2]) is list and type(row[3]) is list)


def _beat_row(row: Any) -> bool:
    """[rank, seq, running] (§2.5 `hbs`)."""
    return type(row) is list and len(row) == 3 and type(row[0]) is int and type(row[1]) is int and type(row[2]) is int


def _key_row(row: Any) -> bool:
    """[job, task, (attempt)] (§2.5 `kill`, `done-ack`)."""
    # No generator over the row: a `done-ack` carries a key per task.
    return (type(row) is list and 2 <= len(row) <= 3 and type(row[0]) is int and type(row[1]) is int
            and (len(row) < 3 or type(row[2]) is int))


# --- worker → rank 0 ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Heartbeat(WireMessage):
    """`hb` (§2.5, §2.6)."""
    KIND: ClassVar[str] = "hb"
    seq: int = 0
    running: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeats(WireMessage):
    """`hbs` (§2.5, §2.6): the beats of ranks below the sender, relayed together."""
    KIND: ClassVar[str] = "hbs"
    beats: list[Any] = field(metadata=rows(_beat_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Join(WireMessage):
    """`join` (§2.5, §2.6): `resources` is §2.7, checked by broker/nodes.py against the graph."""
    KIND: ClassVar[str] = "join"
    pid: int | None = None
    hostname: str = ""
    resources: dict[str, Any] = field(default_factory=dict)
    running: list[Any] = field(default_factory=list, metadata=rows(_running_row))
    results: list[Any] = field(default_factory=list, metadata=rows(_result_row))
    epoch: int = 0
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Done(WireMessage):
    """`done` (§2.5, §2.9, §3.10)."""
    KIND: ClassVar[str] = "done"
    results: list[Any] = field(metadata=rows(_result_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Output(WireMessage):
    """`out` (§2.5): chunks of whole lines."""
    KIND: ClassVar[str] = "out"
    chunks: list[Any] = field(metadata=rows(_chunk_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class _Exchange(WireMessage):
    """A PMI exchange's body (§2.8): a PMI-1 barrier's `kvs`, or a PMIx fence's `data`, never both."""
    job: int
    seq: int
    kvs: dict[str, str] | None = None
    data: bytes | None = None

    def check(self, kind: str) -> None:
        if (self.kvs is None) == (self.data is None):
            raise BadMessage(f"{kind}: exactly one of 'kvs' and 'data' is expected", "bad-request")


@dataclass(frozen=True, slots=True)
class PmiPut(_Exchange):
    """`pmi-put` (§2.8): one rank's part of barrier or fence `seq`."""
    KIND: ClassVar[str] = "pmi-put"


@dataclass(frozen=True, slots=True)
class PmixGroup(WireMessage):
    """`pmix-group` (§2.8): this worker's part of PMIx group operation `seq` on `group` of `job`."""
    KIND: ClassVar[str] = "pmix-group"
    job: int
    group: str
    seq: int
    op: str
    nodes: list[int]
    ctxid: bool = False
    status: int = 0
    data: bytes = b""

    def check(self, kind: str) -> None:
        if self.op not in ("construct", "destruct"):
            raise BadMessage(f"{kind}: 'op' must be 'construct' or 'destruct'", "bad-request")


@dataclass(frozen=True, slots=True)
class PmiInit(WireMessage):
    """`pmi-init` (§2.5, §3.6)."""
    KIND: ClassVar[str] = "pmi-init"
    job: int


@dataclass(frozen=True, slots=True)
class StdinAck(WireMessage):
    """`stdin-ack` (§2.5, §3.8)."""
    KIND: ClassVar[str] = "stdin-ack"
    job: int
    seq: int
    open: bool = False


@dataclass(frozen=True, slots=True)
class Abort(WireMessage):
    """`abort` (§2.5, §2.8): `t` is when, on the worker's clock; None if an older worker did not say."""
    KIND: ClassVar[str] = "abort"
    job: int
    task: int
    code: int
    message: str = ""
    t: float | None = None


# --- any → any ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Refusal(WireMessage):
    """`error` (§2.5): the message of kind `ref` was refused."""
    KIND: ClassVar[str] = "error"
    code: str = ""
    message: str = ""
    ref: str = ""


# --- rank 0 → worker ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Welcome(WireMessage):
    """`welcome` (§2.5, §2.6): answers `join`."""
    KIND: ClassVar[str] = "welcome"
    epoch: int = 0
    size: int = 0


@dataclass(frozen=True, slots=True)
class Rejoin(WireMessage):
    """`rejoin` (§2.5, §2.6)."""
    KIND: ClassVar[str] = "rejoin"
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class JobInfo(WireMessage):
    """`jobinfo` of a `run` (§2.5): `mpi` true is an older rank 0's "pmi1"; `layout` is [[rank, ntasks], ...]."""
    KIND: ClassVar[str] = "jobinfo"
    argv: list[str]
    env: dict[str, str]
    ntasks: int
    layout: list[Any]
    uid: int
    gid: int
    cwd: str | None = None
    output: str | None = None
    mpi: str | bool | None = None
    array: bool = False
    stdin: list[int] = field(default_factory=list)
    mem_per_task: int = 0
    umask: int | None = None  # nil: the worker's own
    kvsname: str | None = None  # nil: the worker names it (an older rank 0)

    def check(self, kind: str) -> None:
        if not self.argv:
            raise BadMessage(f"{kind}: 'argv' is empty", "bad-request")
        for r in self.layout:  # `type(v) is int` refuses bools
            if type(r) is not list or len(r) != 2 or type(r[0]) is not int or type(r[1]) is not int:
                raise BadMessage(f"{kind}: field 'layout' has the wrong type", "bad-request")


@dataclass(frozen=True, slots=True)
class Run(WireMessage):
    """`run` (§2.5, §2.9): start tasks; `jobs` holds the info of every job `tasks` names."""
    KIND: ClassVar[str] = "run"
    jobs: dict[int, JobInfo] = field(default_factory=dict)
    tasks: list[Any] = field(default_factory=list, metadata=rows(_task_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class DoneAck(WireMessage):
    """`done-ack` (§2.5, §2.9): keys [job, task, attempt] of durable results."""
    KIND: ClassVar[str] = "done-ack"
    keys: list[Any] = field(metadata=rows(_key_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Kill(WireMessage):
    """`kill` (§2.5): keys [job, task]; `grace > 0` means SIGKILL after `grace` s."""
    KIND: ClassVar[str] = "kill"
    keys: list[Any] = field(metadata=rows(_key_row))
    signal: int
    grace: float = 0.0
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class PmiKvs(_Exchange):
    """`pmi-kvs` (§2.8): the merged set of barrier or fence `seq`."""
    KIND: ClassVar[str] = "pmi-kvs"


@dataclass(frozen=True, slots=True)
class PmixGroupDone(WireMessage):
    """`pmix-group-done` (§2.8): the end of group operation `seq`; `ctxid` when one was asked."""
    KIND: ClassVar[str] = "pmix-group-done"
    job: int
    group: str
    seq: int
    status: int
    ctxid: int | None = None
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Stdin(WireMessage):
    """`stdin` (§2.5, §3.8)."""
    KIND: ClassVar[str] = "stdin"
    job: int
    seq: int
    tasks: list[int] = field(default_factory=list)
    data: bytes = b""
    eof: bool = False


@dataclass(frozen=True, slots=True)
class Shutdown(WireMessage):
    """`shutdown` (§2.5): travels down the tree."""
    KIND: ClassVar[str] = "shutdown"


# --- worker → worker ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DmodexRequest(WireMessage):
    """`pmix-dmodex` (§2.5, §2.8): send rank `sender` what task `task` of `job` committed."""
    KIND: ClassVar[str] = "pmix-dmodex"
    job: int
    task: int
    id: int
    sender: int = field(metadata=wire("from"))


@dataclass(frozen=True, slots=True)
class DmodexReply(WireMessage):
    """`pmix-dmodex-data` (§2.5, §2.8): the answer to request `id`; `status` is a PMIx status, 0 = success."""
    KIND: ClassVar[str] = "pmix-dmodex-data"
    job: int
    id: int
    status: int
    data: bytes = b""


def _pair_row(row: Any) -> bool:
    """[job, task] (§2.10 `recall`, `returned`)."""
    return type(row) is list and len(row) == 2 and type(row[0]) is int and type(row[1]) is int


def _ahead_row(row: Any) -> bool:
    """[job, task, index, cores, gpus, attempt, after, after_job?] (§2.10 `ahead`)."""
    return (type(row) is list and 7 <= len(row) <= 8 and _task_row(row[:6]) and type(row[6]) is int
            and (len(row) == 7 or type(row[7]) is int))


# --- the dispatch window (§2.10) ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Returned(WireMessage):
    """`returned` (§2.10, worker → rank 0): entries sent ahead that the worker dropped unstarted."""
    KIND: ClassVar[str] = "returned"
    keys: list[Any] = field(metadata=rows(_pair_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Ahead(WireMessage):
    """`ahead` (§2.10, rank 0 → worker): elements to start each when the task it follows (`after`) ends."""
    KIND: ClassVar[str] = "ahead"
    jobs: dict[int, JobInfo] = field(default_factory=dict)
    tasks: list[Any] = field(default_factory=list, metadata=rows(_ahead_row))
    dropped: int = field(default=0, metadata=LOCAL)


@dataclass(frozen=True, slots=True)
class Recall(WireMessage):
    """`recall` (§2.10, rank 0 → worker): drop these entries sent ahead if they have not started."""
    KIND: ClassVar[str] = "recall"
    keys: list[Any] = field(metadata=rows(_pair_row))
    dropped: int = field(default=0, metadata=LOCAL)


WorkerMessage = (Heartbeat | Heartbeats | Join | Done | Output | PmiPut | PmixGroup | PmiInit | StdinAck | Abort
                 | Refusal | Returned)
WorkerOrder = (Welcome | Rejoin | Run | DoneAck | Kill | PmiKvs | PmixGroupDone | Stdin | Shutdown | DmodexRequest
               | DmodexReply | Refusal | Ahead | Recall)

TO_RANK0: dict[str, type[WorkerMessage]] = {cls.KIND: cls for cls in (
    Heartbeat, Heartbeats, Join, Done, Output, PmiPut, PmixGroup, PmiInit, StdinAck, Abort, Refusal, Returned)}
TO_WORKER: dict[str, type[WorkerOrder]] = {cls.KIND: cls for cls in (
    Welcome, Rejoin, Run, DoneAck, Kill, PmiKvs, PmixGroupDone, Stdin, Shutdown, DmodexRequest, DmodexReply, Refusal,
    Ahead, Recall)}
# Kinds one worker sends another (rank 0's agent included), not only rank 0 its workers.
PEER_KINDS = frozenset({DmodexRequest.KIND, DmodexReply.KIND})


def decode(kind: str, body: dict[str, Any]) -> WorkerMessage:
    """The typed message of a kind in TO_RANK0 (KeyError for others); BadMessage when the body is wrong."""
    return decode_as(TO_RANK0[kind], body)


def decode_order(kind: str, body: dict[str, Any]) -> WorkerOrder:
    """The typed message of a kind in TO_WORKER (KeyError for others); BadMessage when the body is wrong."""
    return decode_as(TO_WORKER[kind], body)


def to_body(message: WireMessage) -> dict[str, Any]:
    """The wire body; optional fields left unset are not sent. Rows are not copied."""
    return encode(message)


def send(sender: Send, dst: int, message: WireMessage) -> None:
    """Hand `message` to an overlay `send(kind, dst, body)`."""
    sender(message.KIND, dst, encode(message))


def refusal(ref: str, exc: BadMessage) -> Refusal:
    """The `error` answering a message of kind `ref` that was refused with `exc`."""
    return Refusal(exc.code, str(exc), ref)
