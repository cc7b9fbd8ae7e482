"""mc usage (core-, GPU-, wall- and CPU-hours per user and bank, like `sreport`) and mc job eff (like `seff`)."""
from __future__ import annotations

import argparse
import datetime
import re
import time
from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.common import job_id
from minicluster.cli.format import duration, dumps, percent, print_table, table, user_name
from minicluster.client import Client
from minicluster.model.text import brief, printable
from minicluster.model.workflowforms import MAX_SECONDS

USAGE_HELP = "usage of finished jobs per user and bank: core-, GPU-, wall- and CPU-hours"
JOB_HELP = "about one job: eff ID (CPU and memory efficiency, like seff)"
_AGO = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])\Z")
_EPOCH = re.compile(r"[0-9]+(?:\.[0-9]*)?\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def when(text: str) -> float:
    """A time: epoch seconds, an ISO date or date-time (local time), or an age like 7d, 12h, 30m (ago)."""
    text = text.strip()
    match = _AGO.match(text)
    if match:
        value = time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    elif _EPOCH.match(text):
        value = float(text)
    else:
        try:
            value = datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad time {brief(text)}: use 2025-06-01, 2025-06-01T12:00, epoch "
                                             "seconds, or an age like 7d/12h/30m") from None
    if not 0 <= value < MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"time {brief(text)} is not between 0 (1970-01-01) and {MAX_SECONDS:.0f}"
                                         " (5138-11-16) in epoch seconds")
    return value


def usage(argv: list[str]) -> int:
    parser = Parser(prog="mc usage", description=USAGE_HELP, epilog=(
        "Jobs are counted once they have ended, in the hours they ran; purged jobs still count. --since is "
        "rounded down to the hour. --json prints {\"usage\": [{uid, user, project, [queue,] jobs, core_hours, "
        "gpu_hours, wall_hours, cpu_hours}]}."))
    parser.add_argument("--user", metavar="USER", help="one user (login name or uid)")
    parser.add_argument("--project", metavar="BANK", help="one bank")
    parser.add_argument("--since", type=when, metavar="TIME", help="from TIME (2025-06-01, 7d = 7 days ago)")
    parser.add_argument("--until", type=when, metavar="TIME", help="before TIME")
    parser.add_argument("--by-queue", action="store_true", help="one line per queue too")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    user = int(args.user) if args.user and args.user.isascii() and args.user.isdigit() else args.user
    with Client() as client:
        rows = client.usage(user=user, project=args.project, since=args.since, until=args.until,
                            by_queue=args.by_queue)
    for row in rows:
        row["user"] = user_name(row["uid"])
    if args.json:
        print(dumps({"usage": rows}))
    elif rows:
        print_table(usage_table(rows, args.by_queue))
    return 0


def usage_table(rows: list[dict[str, Any]], by_queue: bool) -> Any:
    headers = ["USER", "PROJECT", *(["QUEUE"] if by_queue else []), "JOBS", "CORE-H", "GPU-H", "WALL-H", "CPU-H",
               "CPU EFF"]
    t = table(*headers)
    totals = {"jobs": 0, "core_hours": 0.0, "gpu_hours": 0.0, "wall_hours": 0.0, "cpu_hours": 0.0}
    for row in rows:
        for key in totals:
            totals[key] += row[key]
        t.add_row(row["user"], row["project"], *([row["queue"]] if by_queue else []), *_numbers(row))
    if len(rows) > 1:
        t.add_row("TOTAL", "", *([""] if by_queue else []), *_numbers(totals))
    return t


def _numbers(row: dict[str, Any]) -> list[str]:
    eff = percent(row["cpu_hours"] / row["core_hours"]) if row["core_hours"] else "-"
    return [str(row["jobs"]), f"{row['core_hours']:.2f}", f"{row['gpu_hours']:.2f}", f"{row['wall_hours']:.2f}",
            f"{row['cpu_hours']:.2f}", eff]


def job(argv: list[str]) -> int:
    parser = Parser(prog="mc job", description=JOB_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    eff = sub.add_parser("eff", help="what a finished job held and used: CPU and memory efficiency (seff)")
    eff.add_argument("id", type=job_id, metavar="ID")
    eff.add_argument("--json", action="store_true", help="the broker's record (protocol.md §3.3 job-usage)")
    args = parser.parse_args(argv)
    with Client() as client:
        record = client.job_usage(args.id)
    if args.json:
        print(dumps(record))
    else:
        print("\n".join(printable(line) for line in eff_lines(record)))
    return 0


def eff_lines(r: dict[str, Any]) -> list[str]:
    """seff's report: who, what was held, what was used, and the two efficiencies."""
    lines = [f"Job ID: {r['job']}", f"User/Project: {user_name(r['uid'])}/{r['project']}", f"Queue: {r['queue']}",
             f"Status: {r['status']}", f"Tasks: {r['ntasks']}",
             f"Cores: {r['cores']}" + (f", GPUs: {r['gpus']}" if r["gpus"] else ""),
             f"Wall time: {duration(r['wall'])} ({r['wall']:.1f}s)",
             f"Core-time held: {r['core_seconds']:.1f} core-seconds",
             f"CPU time used: {r['cpu_seconds']:.1f}s",
             f"CPU Efficiency: {percent(r['cpu_efficiency'])} of {r['core_seconds']:.1f} core-seconds"]
    rss = r["max_rss_kb"]
    peak = f"{rss / 1024:.1f} MiB" if rss else "not measured (below the worker's own size, no memory cgroup)"
    lines.append(f"Peak memory (largest task): {peak}")
    if r["mem_per_task_mb"]:
        lines.append(f"Memory Efficiency: {percent(r['memory_efficiency'])} of {r['mem_per_task_mb']} MiB per task")
    else:
        lines.append("Memory Efficiency: - (the job asked for no memory: --mem)")
    return lines
