"""Saying why a job failed, for `mc run`, `mc-submit --wait/--watch`, `mc attach` and `mc logs`.

A task that could not run (command not found, a bad cwd, out of memory, its node lost) leaves its reason in
the job's task results only; without this, the user would see a bare 127 or 126.
"""
from __future__ import annotations

import sys
from typing import Any

from minicluster.client import Client
from minicluster.model.text import printable

# Tasks listed by name; beyond that a count (an array of 100,000 elements can fail the same way everywhere).
SHOWN = 5


def task_errors(client: Client, job: int, array: bool, index: int | None = None) -> list[str]:
    """One line per task of `job` that could not run: `task 0 on rank 1: nosuch: command not found (status
    127)`; `index` keeps one task (array index, or task rank)."""
    rows = client.task_results(job, errors=True, limit=10_000)
    if index is not None:
        rows = [r for r in rows if r[1] == index]
    lines = [_task_line(row, array) for row in rows[:SHOWN]]
    if len(rows) > SHOWN:
        lines.append(f"{len(rows) - SHOWN}{'+' if len(rows) >= 10_000 else ''} more task(s) could not run")
    return lines


def _task_line(row: list[Any], array: bool) -> str:
    task, index, rank, status, _code, _signal, error, *_attempt = row
    who = f"index {index}" if array else f"task {task}"
    return f"{who} on rank {rank}: {error} (status {status})"


def report(prog: str, job: int, lines: list[str]) -> None:
    for line in lines:
        sys.stderr.write(f"{prog}: job {job}: {printable(line)}\n")
    sys.stderr.flush()


def explain(client: Client, prog: str, job: int, with_exception: bool) -> None:
    """After a failed job: the exception that ended it (`with_exception`, when no event showed it) and the tasks
    that could not run."""
    summary = client.job(job)
    lines = []
    if with_exception and summary.get("exception"):
        reason = summary.get("reason")
        lines.append(f"ended by {summary['exception']}" + (f": {reason}" if reason else ""))
    report(prog, job, lines + task_errors(client, job, array=summary.get("array") is not None))
