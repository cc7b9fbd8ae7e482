"""Every statement on the job tables (meta, jobs, events, tasks, output, output_attempts, attempts, drains).

The rest of the broker never writes SQL (tests/unit/test_sql_owner.py keeps it so;
docs/architecture.md#where-state-lives): it builds statements with the functions below, named after what they
record, and hands them to the journal in the groups that must commit together (a job row with its first events, a
result with its usage row).
Reads go through `JobStore`: the synchronous ones only at start-up, before the event loop serves anyone; the
asynchronous ones on the journal's reader thread.  The sharing tables have their own module, broker/share/store.py.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from broker.durable.journal import Journal, Statement


def pack(value: Any) -> bytes:
    """A jobspec, an event's context or a counts blob as the journal stores it."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)

Row = tuple[Any, ...]

# The purge forgets a job in every table that keys on it.
_JOB_TABLES = (("jobs", "id"), ("events", "job"), ("tasks", "job"), ("output", "job"), ("attempts", "job"),
               ("output_attempts", "job"), ("task_usage", "job"), ("job_usage", "job"))
_PURGE = tuple(f"DELETE FROM {table} WHERE {column}=?" for table, column in _JOB_TABLES)
_EVENT = "INSERT INTO events VALUES (?,?,?,?,?)"
_TASK = "INSERT OR REPLACE INTO tasks VALUES (?,?,?,?,?,?,?,?,?,?)"
_OUTPUT = "INSERT INTO output VALUES (?,?,?,?,?)"
_OUTPUT_ATTEMPT = "INSERT INTO output_attempts VALUES (?,?,?)"
_ATTEMPT = "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
ATTEMPT_COLUMNS = "task, idx, attempt, rank, status, exit_code, signal, error, started, ended, outcome"


# --- statements ---------------------------------------------------------------------------------------------

def job_submitted(job_id: int, uid: int, gid: int, state: str, spec: bytes, t_submit: float,
                  next_id: int) -> list[Statement]:
    """The job's row, and the next id to hand out (ids are never reused, not even after a purge)."""
    return [("INSERT INTO jobs (id, uid, gid, state, spec, t_submit) VALUES (?,?,?,?,?,?)",
             (job_id, uid, gid, state, spec, t_submit)), next_id_kept(next_id)]


def next_id_kept(next_id: int) -> Statement:
    return ("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (next_id,))


def event(job_id: int, seq: int, ts: float, name: str, context: bytes) -> Statement:
    return (_EVENT, (job_id, seq, ts, name, context))


def job_closed(job_id: int, seq: int, status: int | None, exception: str | None, t_run: float | None,
               t_inactive: float | None, counts: bytes) -> Statement:
    """An inactive job's row carries what listing it needs, so a restart does not replay its events."""
    return ("UPDATE jobs SET state='INACTIVE', seq=?, status=?, exception=?, t_run=?, t_inactive=?, counts=? "
            "WHERE id=?", (seq, status, exception, t_run, t_inactive, counts, job_id))


def spec_updated(job_id: int, spec: bytes) -> Statement:
    return ("UPDATE jobs SET spec=? WHERE id=?", (spec, job_id))


def task_result(job_id: int, task: int, idx: int, rank: int, status: int, exit_code: int | None,
                signal: int | None, error: str | None, started: float | None, ended: float | None) -> Statement:
    return (_TASK, (job_id, task, idx, rank, status, exit_code, signal, error, started, ended))


def output_chunk(job_id: int, oseq: int, task: int, stream: int, data: bytes) -> Statement:
    return (_OUTPUT, (job_id, oseq, task, stream, data))


def output_attempt(job_id: int, oseq: int, attempt: int) -> Statement:
    """Output of attempts after the first is tagged (protocol.md §2.9), for `output` by attempt."""
    return (_OUTPUT_ATTEMPT, (job_id, oseq, attempt))


def attempt_recorded(row: Sequence[Any]) -> Statement:
    """An ended attempt that is not final: (job, task, attempt, idx, rank, status, exit_code, signal, error,
    started, ended, outcome, not_before)."""
    return (_ATTEMPT, tuple(row))


def attempt_moved(job_id: int, attempt: int, outcome: str, not_before: float | None) -> list[Statement]:
    """A plain job's whole attempt leaves `tasks` for `attempts`: its next attempt starts with no results."""
    return [("INSERT OR REPLACE INTO attempts SELECT job, task, ?, idx, rank, status, exit_code, signal, error, "
             "started, ended, ?, ? FROM tasks WHERE job=?", (attempt, outcome, not_before, job_id)),
            ("DELETE FROM tasks WHERE job=?", (job_id,))]


def jobs_purged(job_ids: Iterable[int]) -> list[Statement]:
    ids = list(job_ids)
    return [(sql, (j,)) for sql in _PURGE for j in ids]


def rank_drained(rank: int, reason: str) -> Statement:
    return ("INSERT OR REPLACE INTO drains VALUES (?, ?)", (rank, reason))


def rank_undrained(rank: int) -> Statement:
    return ("DELETE FROM drains WHERE rank=?", (rank,))


def _in(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


class JobStore:
    """The reads of the job tables."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    # --- start-up (synchronous) ----------------------------------------------------------------------------

    def next_epoch(self) -> tuple[int, int]:
        """(this life's epoch, recorded durably now; the first job id this life may hand out)."""
        meta = dict(self.journal.query("SELECT key, value FROM meta"))
        epoch = int(meta.get("epoch", 0)) + 1
        self.journal.execute_now([("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (epoch,))])
        max_id = self.journal.query("SELECT COALESCE(MAX(id), 0) FROM jobs")[0][0]
        return epoch, max(int(meta.get("next_id", 1)), max_id + 1)

    def active_job_rows(self) -> list[Row]:
        """JOB_COLUMNS of the jobs not yet inactive, by id (through the state index: the history is not read)."""
        return self.journal.query(f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ({_in(_ACTIVE_STATES)}) "
                                  "ORDER BY id", _ACTIVE_STATES)

    def inactive_counts(self) -> tuple[int, int]:
        """(inactive jobs that ended with status 0 or none, those that did not), from the state index alone."""
        counts = dict(self.journal.query("SELECT COALESCE(status, 0) != 0, COUNT(*) FROM jobs "
                                         "WHERE state='INACTIVE' GROUP BY 1"))
        return counts.get(0, 0), counts.get(1, 0)

    def finished_job(self, job_id: int) -> Row | None:
        """A FINISHED_COLUMNS row of an inactive job, read now on the calling thread (a cache miss)."""
        rows = self.journal.lookup(_FINISHED + " WHERE j.id=? AND j.state='INACTIVE'", (job_id,))
        return rows[0] if rows else None

    def events_of(self, job_ids: Sequence[int], names: Sequence[str] | None = None) -> list[Row]:
        """(job, seq, ts, name, context) of the jobs' events (only those named, if given), in order."""
        named = f" AND name IN ({_in(names)})" if names else ""
        return self.journal.query(f"SELECT job, seq, ts, name, context FROM events WHERE job IN ({_in(job_ids)})"
                                  f"{named} ORDER BY job, seq", [*job_ids, *(names or ())])

    def results_of(self, job_ids: Sequence[int]) -> list[Row]:
        """(job, task, idx, rank, status, exit_code, signal, error, started, ended) in the order they ended."""
        return self.journal.query("SELECT job, task, idx, rank, status, exit_code, signal, error, started, ended "
                                  f"FROM tasks WHERE job IN ({_in(job_ids)}) ORDER BY job, ended", list(job_ids))

    def output_extent(self, job_ids: Sequence[int]) -> list[Row]:
        """(job, last oseq, bytes kept) of the jobs that have output."""
        return self.journal.query(f"SELECT job, MAX(oseq), SUM(LENGTH(data)) FROM output WHERE job IN "
                                  f"({_in(job_ids)}) GROUP BY job", list(job_ids))

    def attempts_of(self, job_ids: Sequence[int]) -> list[Row]:
        """(job, task, attempt, outcome, not_before) of the jobs' earlier attempts."""
        return self.journal.query(f"SELECT job, task, attempt, outcome, not_before FROM attempts WHERE job IN "
                                  f"({_in(job_ids)}) ORDER BY job, task, attempt", list(job_ids))

    def index_results(self, job_id: int) -> list[Row]:
        """(idx, status, exit_code, signal, spec) of the job's final results (broker/flow/workflow.py's aftercorr)."""
        return self.journal.query(_INDEX_RESULTS, (job_id,))

    def drains(self) -> dict[int, str]:
        return dict(self.journal.query("SELECT rank, reason FROM drains"))

    # --- while serving (on the reader thread) --------------------------------------------------------------

    async def finished_jobs_before(self, before: int | None, limit: int) -> list[Row]:
        """FINISHED_COLUMNS rows of the jobs with ids below `before`, highest first, up to `limit` (keyset
        pagination): every state, so that the caller lists its in-memory record of a job still active in place."""
        upper = before if before is not None else 1 << 62
        return await self.journal.read(lambda c: c.execute(
            _FINISHED + " WHERE j.id < ? ORDER BY j.id DESC LIMIT ?", (upper, limit)).fetchall())

    async def purgeable(self, ended_before: float, keep: int, at_most: int) -> list[Row]:
        """(id, status) of inactive jobs that ended before `ended_before`, or beyond the `keep` most recent."""
        return await self.journal.read(lambda c: c.execute(
            "SELECT id, status FROM jobs WHERE state='INACTIVE' AND t_inactive < ? UNION "
            "SELECT id, status FROM (SELECT id, status FROM jobs WHERE state='INACTIVE' ORDER BY t_inactive DESC "
            "LIMIT -1 OFFSET ?) LIMIT ?", (ended_before, keep, at_most)).fetchall())

    async def index_results_now(self, job_id: int) -> list[Row]:
        return await self.journal.read(lambda c: c.execute(_INDEX_RESULTS, (job_id,)).fetchall())

    async def failed_indices(self, job_id: int) -> list[int]:
        return await self.journal.read(lambda c: [r[0] for r in c.execute(
            "SELECT idx FROM tasks WHERE job=? AND status!=0 ORDER BY idx", (job_id,))])

    async def events_since(self, job_id: int, start: int) -> list[Row]:
        """(seq, ts, name, context) of the job's events from `start` on."""
        return await self.journal.read(lambda c: c.execute(
            "SELECT seq, ts, name, context FROM events WHERE job=? AND seq>=? ORDER BY seq",
            (job_id, start)).fetchall())

    async def output_page(self, job_id: int, start: int, attempt: int | None, max_bytes: int) -> list[list[Any]]:
        """[oseq, task, stream, data(, attempt)] from `start` on, until `max_bytes` of data were read."""
        return await self.journal.read(lambda c: _output_page(c, job_id, start, attempt, max_bytes))

    async def spec(self, job_id: int) -> bytes | None:
        rows = await self.journal.read(lambda c: c.execute("SELECT spec FROM jobs WHERE id=?", (job_id,)).fetchall())
        return rows[0][0] if rows else None

    async def truncation(self, job_id: int) -> bytes | None:
        """The context of the job's `output-truncated` event, if it has one."""
        rows = await self.journal.read(lambda c: c.execute(
            "SELECT context FROM events WHERE job=? AND name='output-truncated' LIMIT 1", (job_id,)).fetchall())
        return rows[0][0] if rows else None

    async def task_results(self, job_id: int, start: int, limit: int, errors_only: bool) -> list[list[Any]]:
        """[task, idx, rank, status, exit_code, signal, error, final attempt] from task `start` on."""
        errors = " AND error IS NOT NULL" if errors_only else ""
        # The last column is the final attempt's number: how many earlier attempts the task had (protocol.md §2.9).
        sql = ("SELECT task, idx, rank, status, exit_code, signal, error, "
               "(SELECT COUNT(*) FROM attempts a WHERE a.job = t.job AND a.task = t.task) FROM tasks t "
               f"WHERE job=? AND task>=?{errors} ORDER BY task LIMIT ?")
        return await self.journal.read(lambda c: [list(r) for r in c.execute(sql, (job_id, start, limit))])

    async def attempts(self, job_id: int, start: int, task: int | None,
                       limit: int | None = None) -> tuple[list[list[Any]], list[list[Any]]]:
        """(earlier attempts, final results) from task `start` on (or of `task`), as ATTEMPT_COLUMNS rows; a
        final result's attempt is the number of earlier ones and its outcome 'final'. With `limit`, at most that
        many of each, the first in (task, attempt) order: enough for the first `limit` of both merged, so a page
        never reads the rest of a large array's history."""
        where, params = "job=? AND task>=?", [job_id, start]
        if task is not None:
            where += " AND task=?"
            params.append(task)
        bound, bounded = ("", params) if limit is None else (" LIMIT ?", [*params, limit])

        def query(c: sqlite3.Connection) -> tuple[list[list[Any]], list[list[Any]]]:
            earlier = [list(r) for r in c.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {where} ORDER BY task, attempt{bound}", bounded)]
            final = [list(r) for r in c.execute(
                f"SELECT task, idx, (SELECT COUNT(*) FROM attempts a WHERE a.job=t.job AND a.task=t.task), rank, "
                f"status, exit_code, signal, error, started, ended, 'final' FROM tasks t WHERE {where} "
                f"ORDER BY task{bound}", bounded)]
            return earlier, final
        return await self.journal.read(query)


JOB_COLUMNS = "id, uid, gid, state, spec, t_submit, t_run, t_inactive, status, exception, seq, counts"
_ACTIVE_STATES = ("NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP")
# A finished job as `mc jobs` lists it: its row, its retries and its usage record (None without sharing).
FINISHED_COLUMNS = (", ".join(f"j.{c.strip()}" for c in JOB_COLUMNS.split(",")) +
                    ", (SELECT COUNT(*) FROM attempts a WHERE a.job = j.id AND a.outcome = 'retry'), "
                    "u.t_start, u.t_end, u.ntasks, u.cores, u.gpus, u.mem_mb, u.wall, u.core_seconds, "
                    "u.gpu_seconds, u.cpu_seconds, u.max_rss")
_FINISHED = f"SELECT {FINISHED_COLUMNS} FROM jobs j LEFT JOIN job_usage u ON u.job = j.id"
_INDEX_RESULTS = ("SELECT t.idx, t.status, t.exit_code, t.signal, j.spec FROM tasks t JOIN jobs j ON j.id = t.job "
                  "WHERE t.job=?")


def _output_page(c: sqlite3.Connection, job_id: int, start: int, attempt: int | None,
                 max_bytes: int) -> list[list[Any]]:
    rows: list[list[Any]] = []
    size = 0
    if attempt is None:
        cursor = c.execute("SELECT oseq, task, stream, data FROM output WHERE job=? AND oseq>=? ORDER BY oseq",
                           (job_id, start))
    else:
        cursor = c.execute("SELECT o.oseq, o.task, o.stream, o.data, COALESCE(a.attempt, 0) FROM output o "
                           "LEFT JOIN output_attempts a ON a.job = o.job AND a.oseq = o.oseq "
                           "WHERE o.job=? AND o.oseq>=? AND COALESCE(a.attempt, 0)=? ORDER BY o.oseq",
                           (job_id, start, attempt))
    for row in cursor:
        rows.append(list(row))
        size += len(row[3])
        if size >= max_bytes:
            break
    return rows
