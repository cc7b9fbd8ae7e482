"""Every statement on the sharing tables (their DDL: broker/durable/schema.py): banks, their members, queue states,
fair-share usage and accounting.  The job tables are broker/durable/store.py's; nothing else in the broker writes SQL.

Statements are built here and committed by their callers together with what must commit with them (a job's usage
rows with its `finish` event).  The reads that take a Journal run at start-up only; those that take a connection
are coroutines run on the journal's reader thread.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.durable.journal import Journal, Statement

Row = tuple[Any, ...]
_USAGE_HOUR = ("INSERT INTO usage_hours VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (hour, uid, project, queue) DO UPDATE "
               "SET jobs=jobs+excluded.jobs, core_seconds=core_seconds+excluded.core_seconds, "
               "gpu_seconds=gpu_seconds+excluded.gpu_seconds, wall_seconds=wall_seconds+excluded.wall_seconds, "
               "cpu_seconds=cpu_seconds+excluded.cpu_seconds")
_USAGE_COLUMNS = ("t_start, t_end, ntasks, cores, gpus, mem_mb, wall, core_seconds, gpu_seconds, cpu_seconds, "
                  "max_rss")


# --- statements ---------------------------------------------------------------------------------------------

def bank_saved(name: str, parent: str, shares: int) -> Statement:
    return ("INSERT OR REPLACE INTO banks VALUES (?,?,?)", (name, parent, shares))


def member_saved(bank: str, uid: int, shares: int) -> Statement:
    return ("INSERT OR REPLACE INTO bank_users VALUES (?,?,?,?)", (bank, uid, shares, 0))


def default_bank_set(uid: int, bank: str) -> list[Statement]:
    return [("UPDATE bank_users SET is_default=0 WHERE uid=?", (uid,)),
            ("UPDATE bank_users SET is_default=1 WHERE uid=? AND bank=?", (uid, bank))]


def bank_removed(name: str) -> list[Statement]:
    """The bank, its members and their usage."""
    return [("DELETE FROM banks WHERE name=?", (name,)), ("DELETE FROM bank_users WHERE bank=?", (name,)),
            ("DELETE FROM fairshare_usage WHERE bank=?", (name,))]


def member_removed(bank: str, uid: int) -> Statement:
    return ("DELETE FROM bank_users WHERE bank=? AND uid=?", (bank, uid))


def queue_state_saved(name: str, enabled: bool, started: bool, reason: str) -> Statement:
    return ("INSERT OR REPLACE INTO queue_state VALUES (?,?,?,?)", (name, int(enabled), int(started), reason))


def fairshare_usage_saved(bank: str, uid: int, value: float, t: float) -> Statement:
    return ("INSERT OR REPLACE INTO fairshare_usage VALUES (?,?,?,?)", (bank, uid, value, t))


def task_usage(job_id: int, task: int, cpu: float, rss: int) -> Statement:
    return ("INSERT INTO task_usage VALUES (?,?,?,?)", (job_id, task, cpu, rss))


def job_usage(job_id: int, uid: int, project: str, queue: str, usage: Sequence[Any],
              status: int | None) -> Statement:
    """A finished job's usage record; `usage` is a UsageRecord (broker/share/accounting.py), in its order."""
    return ("INSERT OR REPLACE INTO job_usage VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (job_id, uid, project, queue, *usage, status))


def usage_hour_added(hour: int, uid: int, project: str, queue: str, jobs: int, core_seconds: float,
                     gpu_seconds: float, wall_seconds: float, cpu_seconds: float) -> Statement:
    """Adds to the hour's sums (a job is counted in `jobs` of its last hour only)."""
    return (_USAGE_HOUR, (hour, uid, project, queue, jobs, core_seconds, gpu_seconds, wall_seconds, cpu_seconds))


# --- reads at start-up --------------------------------------------------------------------------------------

def banks(journal: Journal) -> list[Row]:
    """(name, parent, shares)"""
    return journal.query("SELECT name, parent, shares FROM banks")


def members(journal: Journal) -> list[Row]:
    """(bank, uid, shares, is_default)"""
    return journal.query("SELECT bank, uid, shares, is_default FROM bank_users")


def queue_states(journal: Journal) -> list[Row]:
    """(name, enabled, started, reason)"""
    return journal.query("SELECT name, enabled, started, reason FROM queue_state")


def fairshare_usage(journal: Journal) -> list[Row]:
    """(bank, uid, value, t)"""
    return journal.query("SELECT bank, uid, value, t FROM fairshare_usage")


def task_spans(journal: Journal, job_ids: Sequence[int]) -> list[Row]:
    """(job, started, ended) of the jobs' recorded results."""
    return journal.query(f"SELECT job, started, ended FROM tasks WHERE job IN ({_in(job_ids)})", list(job_ids))


def task_usages(journal: Journal, job_ids: Sequence[int]) -> list[Row]:
    """(job, cpu, rss) of the jobs' recorded task usage."""
    return journal.query(f"SELECT job, cpu, rss FROM task_usage WHERE job IN ({_in(job_ids)})", list(job_ids))


def job_usages(journal: Journal, job_ids: Sequence[int]) -> list[Row]:
    """(job, *UsageRecord) of those of the jobs that have a usage record."""
    return journal.query(f"SELECT job, {_USAGE_COLUMNS} FROM job_usage WHERE job IN ({_in(job_ids)})",
                         list(job_ids))


def _in(ids: Sequence[int]) -> str:
    return ",".join("?" * len(ids))


# --- reads while serving (on the reader thread) -------------------------------------------------------------

async def usage_sums(journal: Journal, uid: int | None, project: str | None, first_hour: int | None,
                     end_hour: int | None, by_queue: bool, max_rows: int) -> list[Row]:
    """(uid, project[, queue], jobs, core_seconds, gpu_seconds, wall_seconds, cpu_seconds) summed over the hours
    in [first_hour, end_hour)."""
    where: list[str] = []
    params: list[Any] = []
    for clause, value in (("uid=?", uid), ("project=?", project), ("hour>=?", first_hour), ("hour<?", end_hour)):
        if value is not None:
            where.append(clause)
            params.append(value)
    group = "uid, project, queue" if by_queue else "uid, project"
    sql = (f"SELECT {group}, SUM(jobs), SUM(core_seconds), SUM(gpu_seconds), SUM(wall_seconds), "
           f"SUM(cpu_seconds) FROM usage_hours {'WHERE ' + ' AND '.join(where) if where else ''} "
           f"GROUP BY {group} ORDER BY {group} LIMIT {int(max_rows)}")
    return await journal.read(lambda c: c.execute(sql, params).fetchall())


async def job_usage_of(journal: Journal, job_id: int) -> Row | None:
    """(job, uid, project, queue, *UsageRecord, status) of a finished job."""
    sql = f"SELECT job, uid, project, queue, {_USAGE_COLUMNS}, status FROM job_usage WHERE job=?"
    row: Row | None = await journal.read(lambda c: c.execute(sql, (job_id,)).fetchone())
    return row
