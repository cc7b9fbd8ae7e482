"""Per-task PMI-1 protocol state machine.

Implements the operations of Flux RFC 13 "Protocol Definition" (init,
maxes, abort, finalize, universe, appnum, put, kvsname, barrier, get; the
dynamic-process-management requests publish/unpublish/lookup/spawn are
answered with a failure), "Version Negotiation", "Local Process Group
Information" (``PMI_process_mapping``) and the MPICH ``PMI_PORT`` handshake
(``cmd=initack pmiid=N``) that RFC 13 leaves out.

Pure: :meth:`TaskEngine.handle` takes one line and returns effects; the
caller does the I/O, the cross-task barrier and the abort.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from worker.pmi.wire import Request, WireError, format_response, parse_request, unescape

PMI_VERSION = 1
PMI_SUBVERSION = 1
KVSNAME_MAX = 256
KEYLEN_MAX = 256
# MPICH splits longer values itself; larger limits would risk overflowing
# fixed-size line buffers in older PMI-1 client libraries.
VALLEN_MAX = 1024

# What the tasks of one job may put, counted as key plus value bytes and as puts (a put that replaces a key
# counts again): the values stay in the worker's memory until the job ends, and are merged at rank 0, as root.
# MPICH puts a few keys per rank; a job of more ranks gets more room.
JOB_PUT_BYTES = 64 * 1024 * 1024
JOB_PUT_KEYS = 1024 * 1024
RANK_PUT_BYTES = 64 * 1024  # the job's room grows by this much per rank beyond JOB_PUT_BYTES / this
RANK_PUT_KEYS = 1024
TASK_PUT_BYTES = 16 * 1024 * 1024
TASK_PUT_KEYS = 256 * 1024

# Requests defined by RFC 13 that this server declines (no dynamic processes).
_UNSUPPORTED = {
    "publish_name": "publish_result",
    "unpublish_name": "unpublish_result",
    "lookup_name": "lookup_result",
}


@dataclass(frozen=True)
class JobInfo:
    """What every task of one job is told about the job."""

    kvsname: str
    size: int
    appnum: int = 0


@dataclass(frozen=True)
class Reply:
    """Send this text (one or more newline-terminated lines) to the task."""

    text: str


@dataclass(frozen=True)
class EnterBarrier:
    """The task entered the barrier; ``puts`` are its puts since the last one."""

    puts: dict[str, str]


@dataclass(frozen=True)
class Abort:
    """The task asked to abort the whole job."""

    exit_code: int
    message: str


@dataclass(frozen=True)
class ProtocolError:
    """The task broke the protocol; RFC 13 says close and abort the program."""

    message: str


@dataclass(frozen=True)
class PutRefused:
    """A put went past the job's or the task's limit; the task got a failure answer."""

    message: str


Effect = Reply | EnterBarrier | Abort | ProtocolError | PutRefused


class PutBudget:
    """The room one job's local tasks have left for puts (keys and bytes), shared by their engines."""

    def __init__(self, size: int, local_tasks: int) -> None:
        # This worker's share of the job's room: the same per rank wherever the ranks run.
        job_bytes = max(JOB_PUT_BYTES, size * RANK_PUT_BYTES)
        job_keys = max(JOB_PUT_KEYS, size * RANK_PUT_KEYS)
        self.max_bytes = job_bytes * local_tasks // size
        self.max_keys = job_keys * local_tasks // size
        self.task_bytes = min(TASK_PUT_BYTES, self.max_bytes)
        self.task_keys = min(TASK_PUT_KEYS, self.max_keys)
        self.bytes = 0
        self.keys = 0

    def refusal(self, task_keys: int, task_bytes: int, size: int) -> str | None:
        """Why one more put of `size` bytes is refused, after the task's `task_keys` puts of `task_bytes`."""
        if task_keys + 1 > self.task_keys or task_bytes + size > self.task_bytes:
            return f"put limit of a task reached ({self.task_keys} puts, {self.task_bytes} bytes)"
        if self.keys + 1 > self.max_keys or self.bytes + size > self.max_bytes:
            return f"put limit of the job reached ({self.max_keys} puts, {self.max_bytes} bytes on this node)"
        return None

    def take(self, size: int) -> None:
        self.keys += 1
        self.bytes += size


class Phase(enum.Enum):
    NEW = "new"  # connected, init not yet received
    READY = "ready"
    IN_BARRIER = "in_barrier"
    SPAWN_BODY = "spawn_body"  # swallowing the lines of a declined mcmd=spawn
    FINALIZED = "finalized"
    ABORTED = "aborted"


def process_mapping(tasks_per_node: list[int]) -> str:
    """RFC 13 ``PMI_process_mapping`` for ranks laid out in node order.

    Rank 0.. fill node 0 first, then node 1, and so on; runs of nodes with
    the same task count share one ``(start, nnodes, ppn)`` block.
    """
    if not tasks_per_node or any(n < 1 for n in tasks_per_node):
        raise ValueError(f"every node needs at least one task: {tasks_per_node}")
    blocks: list[list[int]] = []
    for node, ppn in enumerate(tasks_per_node):
        if blocks and blocks[-1][2] == ppn:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1, ppn])
    value = "(vector," + ",".join(f"({s},{n},{p})" for s, n, p in blocks) + ")"
    # RFC 13: a mapping that does not fit in a value is sent as "unknown".
    return value if len(value) <= VALLEN_MAX else ""


def parse_initack(line: str) -> int:
    """The rank a ``PMI_PORT`` client announced with ``cmd=initack pmiid=N``."""
    req = parse_request(line)
    if req.cmd != "initack":
        raise WireError(f"expected cmd=initack on a PMI_PORT connection, got cmd={req.cmd}")
    return req.get_int("pmiid")


def initack_reply(rank: int, size: int) -> str:
    """The server's answer to initack: the rank and size the client adopts."""
    return (
        format_response("initack", rc=0)
        + format_response("set", size=size)
        + format_response("set", rank=rank)
        + format_response("set", debug=0)
    )


def failure(cmd: str, message: str) -> Reply:
    """A ``rc=-1`` response whose message is one bare token.

    Spaces become underscores rather than MPICH-style escapes because older
    simple-PMI clients reject a token without ``=`` as a parse error, which
    would turn an expected miss (an absent key) into a failed call.
    """
    return Reply(format_response(cmd, rc=-1, msg=message.replace(" ", "_")))


class TaskEngine:
    """Protocol state of one task's PMI connection.

    ``kvs`` is the job's key-value set as known on this worker; the engine
    only reads it, the job server updates it after each barrier.
    """

    def __init__(self, rank: int, job: JobInfo, kvs: Mapping[str, str], budget: PutBudget | None = None) -> None:
        self.rank = rank
        self.job = job
        self.kvs = kvs
        self.phase = Phase.NEW
        self._puts: dict[str, str] = {}
        self.budget = budget if budget is not None else PutBudget(job.size, 1)
        self.put_keys = 0  # this task's puts and their bytes, over all its barriers
        self.put_bytes = 0

    def handle(self, line: str) -> list[Effect]:
        """Process one request line."""
        if self.phase is Phase.SPAWN_BODY:
            return self._spawn_body(line)
        try:
            req = parse_request(line)
        except WireError as exc:
            return [ProtocolError(f"rank {self.rank}: {exc}")]
        if self.phase is Phase.IN_BARRIER:
            return [ProtocolError(f"rank {self.rank}: cmd={req.cmd} while in barrier")]
        if self.phase is Phase.ABORTED:
            # The task is on its way out; a second abort must not mask the first.
            return []
        if req.cmd == "init":
            return self._init(req)
        if self.phase is not Phase.READY:
            return [ProtocolError(f"rank {self.rank}: cmd={req.cmd} before init")]
        try:
            return self._dispatch(req)
        except WireError as exc:
            return [ProtocolError(f"rank {self.rank}: {exc}")]

    def barrier_done(self, ok: bool) -> Reply:
        """The job-wide barrier finished; the answer to send to this task."""
        if self.phase is not Phase.IN_BARRIER:
            raise RuntimeError(f"rank {self.rank} is not in a barrier")
        self.phase = Phase.READY
        if ok:
            return Reply(format_response("barrier_out", rc=0))
        return failure("barrier_out", "barrier exchange failed")

    def _init(self, req: Request) -> list[Effect]:
        try:
            version = req.get_int("pmi_version")
        except WireError as exc:
            return [ProtocolError(f"rank {self.rank}: {exc}")]
        # Version negotiation: offer 1.1 to any client at least that new;
        # a PMI-2-only client then fails its own init cleanly.
        rc = 0 if version >= PMI_VERSION else -1
        if rc == 0:
            self.phase = Phase.READY
            self._puts = {}
        text = format_response(
            "response_to_init", rc=rc, pmi_version=PMI_VERSION, pmi_subversion=PMI_SUBVERSION
        )
        return [Reply(text)]

    def _dispatch(self, req: Request) -> list[Effect]:
        cmd = req.cmd
        if req.multi:
            if cmd != "spawn":
                return [ProtocolError(f"rank {self.rank}: unknown mcmd={cmd}")]
            self.phase = Phase.SPAWN_BODY
            return []
        if cmd == "get_maxes":
            text = format_response(
                "maxes",
                rc=0,
                kvsname_max=KVSNAME_MAX,
                keylen_max=KEYLEN_MAX,
                vallen_max=VALLEN_MAX,
            )
            return [Reply(text)]
        if cmd == "get_appnum":
            return [Reply(format_response("appnum", rc=0, appnum=self.job.appnum))]
        if cmd == "get_my_kvsname":
            return [Reply(format_response("my_kvsname", rc=0, kvsname=self.job.kvsname))]
        if cmd == "get_universe_size":
            return [Reply(format_response("universe_size", rc=0, size=self.job.size))]
        if cmd == "put":
            return self._put(req)
        if cmd == "get":
            return [self._get(req)]
        if cmd == "barrier_in":
            self.phase = Phase.IN_BARRIER
            puts, self._puts = self._puts, {}
            return [EnterBarrier(puts)]
        if cmd == "finalize":
            self.phase = Phase.FINALIZED
            return [Reply(format_response("finalize_ack", rc=0))]
        if cmd == "abort":
            return [self._abort(req)]
        if cmd in _UNSUPPORTED:
            return [failure(_UNSUPPORTED[cmd], f"{cmd} is not supported")]
        return [ProtocolError(f"rank {self.rank}: unknown cmd={cmd}")]

    def _put(self, req: Request) -> list[Effect]:
        key = req.args.get("key")
        if not key or "value" not in req.args:
            raise WireError("cmd=put needs key= and value=")
        if req.args.get("kvsname") != self.job.kvsname:
            return [failure("put_result", f"unknown kvsname {req.args.get('kvsname')}")]
        value = req.args["value"]
        size = len(key) + len(value)
        refused = self.budget.refusal(self.put_keys, self.put_bytes, size)
        if refused is not None:
            return [failure("put_result", refused), PutRefused(f"rank {self.rank}: {refused}")]
        self.budget.take(size)
        self.put_keys += 1
        self.put_bytes += size
        self._puts[key] = value
        return [Reply(format_response("put_result", rc=0))]

    def _get(self, req: Request) -> Reply:
        key = req.args.get("key")
        if not key:
            raise WireError("cmd=get needs key=")
        if req.args.get("kvsname") != self.job.kvsname:
            return failure("get_result", f"unknown kvsname {req.args.get('kvsname')}")
        # A task sees its own not-yet-exchanged puts; others' only after a barrier.
        value = self._puts.get(key, self.kvs.get(key))
        if value is None:
            return failure("get_result", "not found")
        return Reply(format_response("get_result", rc=0, value=value))

    def _abort(self, req: Request) -> Abort:
        self.phase = Phase.ABORTED
        raw_code = req.args.get("exitcode", req.args.get("code", "1"))
        try:
            code = int(raw_code)
        except ValueError:
            code = 1
        message = req.args.get("message", req.args.get("msg", ""))
        return Abort(exit_code=code, message=unescape(message))

    def _spawn_body(self, line: str) -> list[Effect]:
        if line.strip() != "endcmd":
            return []
        self.phase = Phase.READY
        return [failure("spawn_result", "spawn is not supported")]
