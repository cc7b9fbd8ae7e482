"""Usage accounting (docs/scheduling.md, "Accounting and efficiency"): what each job held and used.

Per task, the worker reports the CPU time (utime + stime of the task's processes) and the peak RSS with its
result; rank 0 adds them up per job as results come in (`Acct.span`/`note_usage`, a few float operations per
task) and keeps
the ones that carry something in `task_usage`, so a restart can add them up again (`restore`).  When the job
finishes, one `job_usage` row and its share of the hourly per-(user, bank, queue) totals in `usage_hours` are
written in the same transaction as its `finish` event: the totals are never purged, so `mc usage` still counts a
job after the job itself is gone.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from broker.durable.journal import Journal, Statement
from broker.share import store

HOUR = 3600.0


class Acct:
    """Running sums of one active job's results."""

    __slots__ = ("first_start", "last_end", "element_seconds", "cpu", "rss")

    def __init__(self) -> None:
        self.first_start = math.inf
        self.last_end = 0.0
        self.element_seconds = 0.0  # sum over tasks of (ended - started): arrays charge per element
        self.cpu = 0.0
        self.rss = 0                # KiB, the largest of any task

    def add(self, started: float | None, ended: float | None, cpu: float = 0.0, rss: int = 0) -> None:
        if started is not None and ended is not None and ended >= started:
            self.span(started, ended)
        self.used(cpu, rss)

    def span(self, started: float, ended: float) -> None:
        """One task ran from `started` to `ended` (the per-result hot path: keep it this small)."""
        self.element_seconds += ended - started
        if ended > self.last_end:
            self.last_end = ended
        if started < self.first_start:
            self.first_start = started

    def used(self, cpu: float, rss: int) -> None:
        self.cpu += cpu
        if rss > self.rss:
            self.rss = rss


class UsageRecord(NamedTuple):
    """What a finished job held and used: a `job_usage` row without its ids."""

    t_start: float | None
    t_end: float
    ntasks: int
    cores: int           # held at once: the job's cores, or one element's for an array
    gpus: int
    mem_mb: int          # asked per task
    wall: float          # first start to last end
    core_seconds: float
    gpu_seconds: float
    cpu_seconds: float
    max_rss: int         # KiB

    @property
    def cpu_efficiency(self) -> float | None:
        return self.cpu_seconds / self.core_seconds if self.core_seconds > 0 else None

    @property
    def memory_efficiency(self) -> float | None:
        """The largest task's peak RSS over the memory a task asked for; None when it asked for none."""
        return (self.max_rss / 1024.0) / self.mem_mb if self.mem_mb > 0 else None


def usage_of_result(row: list[Any]) -> tuple[float, int]:
    """(cpu seconds, peak RSS KiB) of a `done` result: its trailing `{cpu, rss}` map, after the attempt, if any
    (protocol.md §2.5)."""
    last = row[-1] if len(row) > 9 else None
    if not isinstance(last, dict):
        return 0.0, 0
    cpu, rss = last.get("cpu", 0.0), last.get("rss", 0)
    cpu = float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and cpu >= 0 else 0.0
    rss = int(rss) if isinstance(rss, int) and not isinstance(rss, bool) and rss >= 0 else 0
    return cpu, rss


def record(acct: Acct, array: bool, ntasks: int, cores: int, gpus: int, mem_per_task: int, t_run: float | None,
           now: float) -> UsageRecord:
    """The usage record of a job that ended now.  A plain job holds its cores from start to last end; an array
    holds one element's cores per element for that element's run."""
    start = acct.first_start if acct.first_start != math.inf else t_run
    end = acct.last_end or now
    wall = max(0.0, end - start) if start is not None else 0.0
    held = acct.element_seconds if array else wall
    return UsageRecord(start, end, ntasks, cores, gpus, mem_per_task, wall, cores * held, gpus * held, acct.cpu,
                       acct.rss)


def finish_statements(job_id: int, uid: int, project: str, queue: str, usage: UsageRecord,
                      status: int | None) -> list[Statement]:
    """The job's `job_usage` row and its hourly shares in `usage_hours` (one job counted in its last hour)."""
    statements = [store.job_usage(job_id, uid, project, queue, usage, status)]
    last_hour = int(usage.t_end // HOUR)
    for hour, part in _hour_parts(usage.t_start, usage.t_end):
        statements.append(store.usage_hour_added(hour, uid, project, queue, int(hour == last_hour),
                                                 usage.core_seconds * part, usage.gpu_seconds * part,
                                                 usage.wall * part, usage.cpu_seconds * part))
    return statements


def _hour_parts(start: float | None, end: float) -> list[tuple[int, float]]:
    """(hour, fraction of [start, end] in that hour) for each hour the interval touches."""
    if start is None or end <= start:
        return [(int(end // HOUR), 1.0)]
    parts = []
    hour = int(start // HOUR)
    span = end - start
    while hour * HOUR < end:
        low, high = max(start, hour * HOUR), min(end, (hour + 1) * HOUR)
        if high > low:
            parts.append((hour, (high - low) / span))
        hour += 1
    return parts


def restore(journal: Journal, jobs: Iterable[Any]) -> None:
    """Add up again the results of active jobs after a restart (tasks rows and their task_usage)."""
    active = {job.id: job for job in jobs}
    if not active:
        return
    for job_id, started, ended in store.task_spans(journal, list(active)):
        _acct(active[job_id]).add(started, ended)
    for job_id, cpu, rss in store.task_usages(journal, list(active)):
        _acct(active[job_id]).add(None, None, cpu, rss)


def efficiencies(usage: UsageRecord) -> tuple[float | None, float | None]:
    """(CPU, memory) efficiency: what a finished job keeps in memory for `mc jobs -o eff`, 100 bytes or so."""
    return (usage.cpu_efficiency, usage.memory_efficiency)


def load_records(journal: Journal, active: Iterable[Any]) -> None:
    """The efficiencies of the jobs a restart found ending (in CLEANUP: their usage row is written); a finished
    job's come with it from the journal (broker/history.py)."""
    jobs = {job.id: job for job in active}
    if not jobs:
        return
    for row in store.job_usages(journal, list(jobs)):
        job = jobs[row[0]]
        if job.acct is None:
            job.acct = efficiencies(UsageRecord(*row[1:]))


def _acct(job: Any) -> Acct:
    if job.acct is None:
        job.acct = Acct()
    return job.acct


def note_usage(job: Any, acct: Acct, row: list[Any]) -> Statement | None:
    """Count the CPU time and memory a result of `job` carries; the `task_usage` row to write, if any."""
    cpu, rss = usage_of_result(row)
    if not (cpu or rss):
        return None
    acct.used(cpu, rss)
    return store.task_usage(job.id, row[1], cpu, rss)
