"""Usage reports (`mc usage`, `mc job eff`; protocol.md §3.10) read from the journal's accounting tables.

`usage_hours` holds finished jobs' usage per hour, user, bank and queue and is never purged; a report sums the
hours that start at or after `since` (so `since` is rounded down to the hour).  Jobs still running are not in it
yet: they are charged when they end.
"""
from __future__ import annotations

import sqlite3
from typing import Any

from broker.share.accounting import HOUR, UsageRecord

MAX_ROWS = 100_000


def usage_rows(c: sqlite3.Connection, uid: int | None, project: str | None, since: float | None,
               until: float | None, by_queue: bool) -> list[dict[str, Any]]:
    where: list[str] = []
    params: list[Any] = []
    if uid is not None:
        where.append("uid=?")
        params.append(uid)
    if project is not None:
        where.append("project=?")
        params.append(project)
    if since is not None:
        where.append("hour>=?")
        params.append(int(since // HOUR))
    if until is not None:
        where.append("hour<?")
        params.append(int(-(-until // HOUR)))
    group = "uid, project, queue" if by_queue else "uid, project"
    sql = (f"SELECT {group}, SUM(jobs), SUM(core_seconds), SUM(gpu_seconds), SUM(wall_seconds), "
           f"SUM(cpu_seconds) FROM usage_hours {'WHERE ' + ' AND '.join(where) if where else ''} "
           f"GROUP BY {group} ORDER BY {group} LIMIT {MAX_ROWS}")
    rows = []
    for row in c.execute(sql, params):
        keys = row[:3] if by_queue else row[:2]
        jobs, core_s, gpu_s, wall_s, cpu_s = row[len(keys):]
        item: dict[str, Any] = {"uid": keys[0], "project": keys[1]}
        if by_queue:
            item["queue"] = keys[2]
        item.update(jobs=jobs, core_hours=core_s / HOUR, gpu_hours=gpu_s / HOUR, wall_hours=wall_s / HOUR,
                    cpu_hours=cpu_s / HOUR)
        rows.append(item)
    return rows


def job_usage_row(c: sqlite3.Connection, job_id: int) -> dict[str, Any] | None:
    row = c.execute("SELECT job, uid, project, queue, t_start, t_end, ntasks, cores, gpus, mem_mb, wall, "
                    "core_seconds, gpu_seconds, cpu_seconds, max_rss, status FROM job_usage WHERE job=?",
                    (job_id,)).fetchone()
    if row is None:
        return None
    record = UsageRecord(*row[4:15])
    return efficiency(record) | {"job": row[0], "uid": row[1], "project": row[2], "queue": row[3],
                                  "status": row[15]}


def efficiency(record: UsageRecord) -> dict[str, Any]:
    """A usage record as `mc job eff` reports it (seff): what was held, what was used, and their ratios."""
    return {"t_start": record.t_start, "t_end": record.t_end, "ntasks": record.ntasks, "cores": record.cores,
            "gpus": record.gpus, "mem_per_task_mb": record.mem_mb, "wall": record.wall,
            "core_seconds": record.core_seconds, "gpu_seconds": record.gpu_seconds,
            "cpu_seconds": record.cpu_seconds, "max_rss_kb": record.max_rss,
            "cpu_efficiency": record.cpu_efficiency, "memory_efficiency": record.memory_efficiency}
