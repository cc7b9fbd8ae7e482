"""Typed records of the `done` result and the `run` task rows (protocol.md §2.5, §2.9, §3.10).

On the wire both stay positional lists, as docs/protocol.md specifies them (a trailing `attempt` absent means 0;
a result's usage map comes only after an `attempt`, 0 included). The checks here are the ones the message
decoder (messages.py) applies to every row; code that reads a row decodes it into its record once and reads
fields by name. No I/O.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from minicluster.proto.envelope import BadMessage


def result_row_ok(row: Any) -> bool:
    """[job, task, status, exit_code, signal, error, started, ended, (attempt, (usage))] (§2.5 `done`)."""
    # `type(v) is int`, not isinstance: as fast as a check gets, and it refuses bools; msgpack makes plain ints.
    return (type(row) is list and 8 <= len(row) <= 10 and type(row[0]) is int and type(row[1]) is int
            and type(row[2]) is int and (len(row) < 9 or type(row[8]) is int))


def task_row_ok(row: Any) -> bool:
    """[job, task, index, cores, gpus, (attempt)] (§2.5 `run`)."""
    return (type(row) is list and 5 <= len(row) <= 6 and type(row[0]) is int and type(row[1]) is int
            and type(row[2]) is int and type(row[3]) is list and type(row[4]) is list
            and (len(row) < 6 or type(row[5]) is int))


_new = tuple.__new__


class Result(NamedTuple):
    """One task's end, a row of `done` (and of `join.results`)."""
    job: int
    task: int
    status: int  # the exit code, or 128 + the signal
    exit_code: int | None
    signal: int | None
    error: str | None  # why it could not run or was ended, if it did not just exit
    started: float | None
    ended: float | None
    attempt: int = 0  # the `run` that started it (§2.9)
    usage: dict[str, Any] | None = None  # {cpu, rss} when measured (§3.10)

    @classmethod
    def from_row(cls, row: Any) -> Result:
        """The record of a `done` row; BadMessage (`bad-request`) when the row is not one."""
        if not result_row_ok(row):
            raise BadMessage(f"done: malformed result row {_shown(row)}: expected [job, task, status, exit_code, "
                             "signal, error, started, ended, (attempt, (usage))] with integer job, task, status "
                             "and attempt", "bad-request")
        return cls.of_checked(row)

    @classmethod
    def of_checked(cls, row: list[Any]) -> Result:
        """The record of a row checked already (the message decoder checks every `done` row): per result, so no
        check again and no Python-level __new__."""
        n = len(row)
        return _new(cls, row if n == 10 else [*row, 0, None] if n == 8 else [*row, None])

    @staticmethod
    def attempt_of(row: list[Any]) -> int:
        """The attempt of a checked row, without decoding the rest (a worker reads it per `done-ack` key)."""
        return row[8] if len(row) > 8 else 0


def result_row(job: int, task: int, status: int, exit_code: int | None, signal: int | None, error: str | None,
               started: float | None, ended: float | None, attempt: int = 0,
               usage: dict[str, Any] | None = None) -> list[Any]:
    """A `done` row as the wire has it: `attempt` only when it is not 0 or usage follows it, usage only when
    measured. A worker builds one per task without a record in between."""
    row: list[Any] = [job, task, status, exit_code, signal, error, started, ended]
    if attempt or usage is not None:
        row.append(attempt)
    if usage is not None:
        row.append(usage)
    return row


class TaskEntry(NamedTuple):
    """One task to start, a row of `run`."""
    job: int
    task: int
    array_index: int  # `index` on the wire (tuple has an `index` method): a plain job's is the task rank
    cores: list[int]
    gpus: list[int]
    attempt: int = 0  # §2.9

    @classmethod
    def from_row(cls, row: Any) -> TaskEntry:
        """The record of a `run` row; BadMessage (`bad-request`) when the row is not one."""
        if not task_row_ok(row):
            raise BadMessage(f"run: malformed task row {_shown(row)}: expected [job, task, index, cores, gpus, "
                             "(attempt)] with integer job, task, index and attempt and lists of cores and gpus",
                             "bad-request")
        return cls.of_checked(row)

    @classmethod
    def of_checked(cls, row: list[Any]) -> TaskEntry:
        """The record of a row checked already (the message decoder checks every `run` row), without a check again
        or a Python-level __new__."""
        return _new(cls, row if len(row) == 6 else [*row, 0])

    def to_row(self) -> list[Any]:
        """The wire row: `attempt` only when it is not 0."""
        row: list[Any] = [self.job, self.task, self.array_index, self.cores, self.gpus]
        if self.attempt:
            row.append(self.attempt)
        return row


def _shown(row: Any) -> str:
    """The row as a message may quote it: cut, so a huge row cannot flood a log line."""
    text = repr(row)
    return text if len(text) <= 80 else text[:77] + "..."
