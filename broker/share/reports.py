"""Usage reports (`mc usage`, `mc job eff`; protocol.md §3.10) read from the journal's accounting tables.

`usage_hours` holds finished jobs' usage per hour, user, bank and queue and is never purged; a report sums the
hours that start at or after `since` (so `since` is rounded down to the hour).  Jobs still running are not in it
yet: they are charged when they end.
"""
from __future__ import annotations

from typing import Any

from broker.durable.journal import Journal
from broker.share import store
from broker.share.accounting import HOUR, UsageRecord

MAX_ROWS = 100_000


async def usage_rows(journal: Journal, uid: int | None, project: str | None, since: float | None,
                     until: float | None, by_queue: bool) -> list[dict[str, Any]]:
    first_hour = int(since // HOUR) if since is not None else None
    end_hour = int(-(-until // HOUR)) if until is not None else None
    rows = []
    for row in await store.usage_sums(journal, uid, project, first_hour, end_hour, by_queue, MAX_ROWS):
        keys = row[:3] if by_queue else row[:2]
        jobs, core_s, gpu_s, wall_s, cpu_s = row[len(keys):]
        item: dict[str, Any] = {"uid": keys[0], "project": keys[1]}
        if by_queue:
            item["queue"] = keys[2]
        item.update(jobs=jobs, core_hours=core_s / HOUR, gpu_hours=gpu_s / HOUR, wall_hours=wall_s / HOUR,
                    cpu_hours=cpu_s / HOUR)
        rows.append(item)
    return rows


async def job_usage_row(journal: Journal, job_id: int) -> dict[str, Any] | None:
    row = await store.job_usage_of(journal, job_id)
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
