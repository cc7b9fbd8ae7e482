"""`mc report`: one self-contained HTML file about jobs, an array, a workflow or a span of the instance.

The data comes through the requests `mc jobs`, `mc jobs --failed`, `mc job eff` and `mc eventlog` already use
(protocol.md §3.3): `jobs` for the summaries, `attempts` page by page for every run of every task (folded into
time bins as they arrive, reportdata.py), `job-usage` for what each finished job held and used, the first events
of `eventlog` for each job's dependencies, and `resources` for the cores each rank has. Drawing is
reporthtml.py's.
"""
from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterable
from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.common import UsageError, job_id
from minicluster.cli.format import job_json
from minicluster.cli.reportdata import (JobInfo, Report, Timeline, dependency_targets, rank_groups,
                                         usage_by_user)
from minicluster.cli.reporthtml import page
from minicluster.cli.usage import when
from minicluster.client import Client, ClientError

HELP = "write one self-contained HTML report (Gantt, cores busy, dependencies, efficiency) of jobs or a time span"
# Attempts asked for per request: the broker's default page.
ATTEMPTS_PAGE = 10_000
# Events after which a job's dependencies are all known (protocol.md §3.7: they are posted right after submit).
_PAST_DEPENDENCIES = frozenset({"depend", "alloc", "start", "exception", "finish", "clean"})
# `--deps` looks for dependents among at most this many later jobs, one short eventlog read each.
DEPENDENT_SCAN = 20_000


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc report", description=HELP, epilog=(
        "Select jobs by ID (a job or an array), by --name, with --deps the IDs' whole workflow (the jobs linked "
        "to them by dependencies), or every job that ran between --since and --until. The file needs no "
        "network: inline CSS, SVG and a few lines of script for tooltips."))
    parser.add_argument("ids", nargs="*", type=job_id, metavar="ID")
    parser.add_argument("--name", action="append", metavar="NAME", help="the jobs of this name (repeatable)")
    parser.add_argument("--deps", action="store_true",
                        help="add their whole workflow: every job linked to them by dependencies, either way, "
                             f"transitively (dependents are looked for among the {DEPENDENT_SCAN:,} newest jobs)")
    parser.add_argument("--since", type=when, metavar="TIME", help="jobs that ran from TIME on (2025-06-01, 2h)")
    parser.add_argument("--until", type=when, metavar="TIME", help="jobs that ran before TIME (default: now)")
    parser.add_argument("-o", "--output", default="report.html", metavar="FILE",
                        help="where to write the report (report.html; - for standard output)")
    args = parser.parse_args(argv)
    if not (args.ids or args.name or args.since is not None or args.until is not None):
        parser.error("give job IDs, --name or a time span (--since/--until)")
    now = time.time()
    since, until = args.since, args.until if args.until is not None else now
    if since is not None and since >= until:
        parser.error(f"--since ({since:.0f}) must be before --until ({until:.0f})")
    command = shlex.join(["mc", "report", *argv])
    with Client() as client:
        jobs = select(client, args.ids, args.name or [], args.deps, since, until, now)
        report = gather(client, jobs, command, since, until, now)
    text = page(report)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{args.output}: {len(jobs)} jobs, {report.timeline.count} attempts, {len(text.encode()):,} bytes")
    return 0


def select(client: Client, ids: list[int], names: list[str], deps: bool, since: float | None, until: float,
           now: float) -> dict[int, JobInfo]:
    """The jobs the arguments name, each with its `mc jobs --json` record and its dependencies."""
    records: dict[int, dict[str, Any]] = {}
    for job in ids:  # one by one: a missing job is named, in one line, as bad input
        try:
            records[job] = client.job(job)
        except ClientError as exc:
            if exc.code != "not-found":
                raise
            raise UsageError(f"job {job} not found") from None
    if names or since is not None or (not ids and until is not None):
        for s in client.jobs(all=True):
            if (s.get("name") in names) or (not names and _ran_between(s, since, until, now)):
                records.setdefault(s["id"], s)
    if (names or since is not None) and not records:
        raise UsageError("no job matches" + (f" the name {names[0]!r}" if names else " that time span"))
    jobs = {job: JobInfo(job_json(s, now), _dependencies(client, job)) for job, s in records.items()}
    if deps:
        _close(client, jobs, now)
    return dict(sorted(jobs.items()))


def _ran_between(summary: dict[str, object], since: float | None, until: float, now: float) -> bool:
    start, end = summary.get("t_run"), summary.get("t_inactive") or now
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return False
    return start < until and (since is None or end >= since)


def _dependencies(client: Client, job: int) -> list[int]:
    """The jobs `job` depends on, from its `dependency-add` events (read only until they are all past)."""
    out: list[int] = []
    for _seq, _t, name, context in client.eventlog(job):
        if name == "dependency-add":
            out += dependency_targets(str((context or {}).get("description", "")))
        elif name in _PAST_DEPENDENCIES:
            break
    return sorted(set(out))


def _close(client: Client, jobs: dict[int, JobInfo], now: float) -> None:
    """Add, transitively, what the jobs depend on and the later jobs that depend on them."""
    todo = [d for info in jobs.values() for d in info.depends if d not in jobs]
    while todo:
        job = todo.pop()
        if job in jobs:
            continue
        found = client.jobs(all=True, ids=[job])
        if not found:
            continue  # purged: the graph shows the edge's end as missing
        jobs[job] = JobInfo(job_json(found[0], now), _dependencies(client, job))
        todo += [d for d in jobs[job].depends if d not in jobs]
    later = [s for s in client.jobs(all=True, limit=DEPENDENT_SCAN) if s["id"] > min(jobs)]
    for s in sorted(later, key=lambda s: s["id"]):  # ascending: a dependent's dependents come after it
        if s["id"] in jobs:
            continue
        depends = _dependencies(client, s["id"])
        if any(d in jobs for d in depends):
            jobs[s["id"]] = JobInfo(job_json(s, now), depends)


def gather(client: Client, jobs: dict[int, JobInfo], command: str, since: float | None, until: float,
           now: float) -> Report:
    for job, info in jobs.items():
        info.usage = _usage(client, job) if info.record.get("state") == "INACTIVE" else None
    # The jobs' span, cut to the asked one: a report of the last day about jobs of the last minute draws a minute.
    ran = [i.record for i in jobs.values() if i.record.get("t_run")]
    t0 = max(since or 0.0, min((float(r["t_run"]) for r in ran), default=now))
    t1 = min(until, max((float(r.get("t_inactive") or now) for r in ran), default=now))
    timeline = Timeline(t0, t1)
    for job, info in jobs.items():
        if info.record.get("t_run"):
            per_task = info.cores_per_task()
            for row in attempts(client, job):
                timeline.add(job, per_task, row, now)
    cores = {int(r["rank"]): int(r.get("cores_total") or 0) for r in client.resources()}
    title = (f"Jobs {_idlist(jobs)}" if since is None else f"Jobs that ran from {time.ctime(t0)} to {time.ctime(t1)}")
    return Report(command, title, now, list(jobs.values()), timeline, cores, usage_by_user(list(jobs.values())),
                  rank_groups(client.resource_tree()))


def attempts(client: Client, job: int) -> Iterable[list[object]]:
    """Every recorded attempt of every task of `job`, one page at a time. A page cut short by the limit may end
    inside a task's attempts, so the next page starts again at that task."""
    start = 0
    while True:
        rows = client.attempts(job, from_=start, limit=ATTEMPTS_PAGE)
        if len(rows) < ATTEMPTS_PAGE:
            yield from rows
            return
        last = rows[-1][0]
        whole = [r for r in rows if r[0] != last] or rows  # a single task with a full page: take it as it is
        yield from whole
        start = last if whole is not rows else last + 1


def _usage(client: Client, job: int) -> dict[str, object] | None:
    try:
        return client.job_usage(job)
    except ClientError:
        return None  # purged, or no usage kept (sharing off): the report shows "-"


def _idlist(jobs: dict[int, JobInfo]) -> str:
    ids = list(jobs)
    return " ".join(map(str, ids)) if len(ids) <= 6 else f"{ids[0]} … {ids[-1]} ({len(ids)})"

