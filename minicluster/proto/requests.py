"""Typed client requests (protocol.md §3.3): a dataclass per operation, its fields checked once, where the broker
reads the request (broker/api/ops.py registers each operation with its class).

The field table is the one overlay messages use (minicluster/proto/schema.py) in the client dialect of §3.2:
`missing field 'job'`, `field 'limit' has the wrong type`, `field 'job' is out of range (a signed 64-bit
integer)`, all `bad-request`. What a field means beyond its type (a jobspec, a queue action, a user's name) is
checked by the operation. Lists of job ids stay lists of anything: each id is answered on its own. No I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from minicluster.proto.schema import WireMessage, decode_as, rest, wire

ENVELOPE = ("v", "id", "op")


class Request(WireMessage):
    """A client request's operation fields (the envelope `v`, `id`, `op` is clientapi.py's)."""

    __slots__ = ()
    STRICT_NIL: ClassVar[bool] = True
    INT64: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Empty(Request):
    """`hello`, `status`, `queues`, `banks`: no fields."""


@dataclass(frozen=True, slots=True)
class Submit(Request):
    jobspec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SubmitMany(Request):
    jobspecs: list[Any]


@dataclass(frozen=True, slots=True)
class Jobs(Request):
    all: bool = False
    ids: list[Any] | None = None
    limit: int = 1000
    alloc: bool = False
    priority: bool = False
    before: int | None = None  # keyset pagination: only ids below it (§3.3)


@dataclass(frozen=True, slots=True)
class OneJob(Request):
    """`job`, `job-usage`."""
    job: int


@dataclass(frozen=True, slots=True)
class ManyJobs(Request):
    """`cancel`, `wait`, `hold`, `release`, `requeue`."""
    jobs: list[Any]


@dataclass(frozen=True, slots=True)
class Eventlog(Request):
    job: int
    start: int = field(default=0, metadata=wire("from"))
    follow: bool = False


@dataclass(frozen=True, slots=True)
class Output(Request):
    job: int
    follow: bool = False
    index: int | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class TaskResults(Request):
    job: int
    start: int = field(default=0, metadata=wire("from"))
    limit: int = 10_000
    errors: bool = False


@dataclass(frozen=True, slots=True)
class Attempts(Request):
    job: int
    index: int | None = None
    start: int = field(default=0, metadata=wire("from"))
    limit: int = 10_000
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Stdin(Request):
    job: int
    data: bytes = b""
    eof: bool = False


@dataclass(frozen=True, slots=True)
class Update(Request):
    """`changes`: every other field of the request (`urgency`, `time_limit`, `name`), checked by the workflow."""
    job: int
    changes: dict[str, Any] = field(default_factory=dict, metadata=rest(*ENVELOPE))


@dataclass(frozen=True, slots=True)
class Resources(Request):
    tree: bool = False


@dataclass(frozen=True, slots=True)
class Drain(Request):
    ranks: list[Any]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Undrain(Request):
    ranks: list[Any]


@dataclass(frozen=True, slots=True)
class Shutdown(Request):
    """What becomes of the running jobs: `requeue`, `cancel` or `drain` (checked by the operation)."""
    mode: str = "requeue"


@dataclass(frozen=True, slots=True)
class QueueControl(Request):
    action: str
    queues: list[Any] = field(default_factory=list)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BankAdd(Request):
    """`user` (a uid or a login name, checked by the operation) adds a member; without it, a bank under `parent`."""
    bank: str
    user: Any = None
    shares: int = 1
    default: bool = False
    parent: str = "root"


@dataclass(frozen=True, slots=True)
class BankRemove(Request):
    bank: str
    user: Any = None


@dataclass(frozen=True, slots=True)
class Usage(Request):
    user: Any = None
    project: str | None = None
    since: float | None = None
    until: float | None = None
    by_queue: bool = False


def decode(cls: type[Request], body: Mapping[str, Any]) -> Request:
    """The request's fields as a `cls`; BadMessage (code `bad-request`) names the first bad field."""
    return decode_as(cls, body)
