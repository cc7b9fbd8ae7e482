"""mc jobs (list jobs, failed array indices) and mc cancel."""
from __future__ import annotations

import sys
import time
from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.common import job_id
from minicluster.cli.format import (alloc_table, attempt_text, dumps, eff_table, job_json, jobs_table, print_table,
                                     priority_table)
from minicluster.cli.options import positive_int
from minicluster.client import Client
from minicluster.model.text import printable

HELP = "list jobs: active ones, all with -a, or the given IDs"
CANCEL_HELP = "cancel jobs"


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc jobs", description=HELP, epilog=(
        "--json prints {\"jobs\": [JOB, ...]}, JOB being {id, name, uid, user, state, result, urgency, "
        "t_submit, t_run, t_inactive, runtime, ntasks, nnodes, ranks, status, exception, counts: "
        "{pending, running, succeeded, failed, cancelled}, est_start, reason, waiting, held, retries, queue, "
        "project, priority, pending_reason, eff: {cpu, mem}} (with -o alloc also alloc: [{path, ranks}]; with "
        "--priority also priority_components: {factors, weighted, priority}); with --failed: "
        "{\"jobs\": [{id, failed, attempts}]}, failed being an idset of array indices and attempts (when some "
        "index ran more than once) {INDEX: [{attempt, rank, status, exit_code, signal, error, outcome}, ...]} for "
        "the indices that failed or ran more than once."))
    parser.add_argument("-a", "--all", action="store_true", help="include inactive jobs")
    parser.add_argument("--json", action="store_true", help="machine-readable output (shape below)")
    parser.add_argument("--failed", action="store_true",
                        help="print the failed indices of array job IDs, then the attempts of each index that "
                             "failed or was retried")
    parser.add_argument("-L", "--limit", type=positive_int, metavar="N", help="at most N jobs")
    parser.add_argument("-o", "--format", choices=("default", "alloc", "eff"), default="default",
                        help="alloc: which topology vertices (racks, zones) each job's ranks are in; "
                             "eff: CPU and memory efficiency of finished jobs (with -a)")
    parser.add_argument("--priority", action="store_true",
                        help="pending jobs' priority and its weighted parts (fair share, queue, urgency, age, size)")
    parser.add_argument("ids", nargs="*", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    if args.failed and not args.ids:
        parser.error("--failed needs job IDs")
    with Client() as client:
        if args.failed:
            return _failed(client, args.ids, args.json)
        alloc = args.format == "alloc"
        summaries = client.jobs(all=args.all or bool(args.ids), ids=args.ids or None, limit=args.limit,
                                alloc=alloc, priority=args.priority)
    now = time.time()
    if args.json:
        print(dumps({"jobs": [job_json(s, now) for s in summaries]}))
    elif args.priority:
        print_table(priority_table(summaries))
    elif summaries:
        tables = {"alloc": alloc_table, "eff": eff_table}
        print_table(tables.get(args.format, jobs_table)(summaries, now))
    missing = sorted(set(args.ids) - {s["id"] for s in summaries})
    for job in missing:
        sys.stderr.write(f"mc jobs: error: job {job} not found\n")
    return 1 if missing else 0


def _failed(client: Client, ids: list[int], as_json: bool) -> int:
    """Per job: the idset of its failed array indices (empty line if none), then one line per index that
    failed or ran more than once, with its attempts."""
    failed = {job: client.job(job).get("failed") or "" for job in ids}
    histories = {job: _attempts_by_index(client.attempts(job, failed=True, limit=100_000)) for job in ids}
    # Attempts are worth showing only when some index ran more than once.
    retried = {job: any(len(rows) > 1 for rows in history.values()) for job, history in histories.items()}
    if as_json:
        print(dumps({"jobs": [{"id": job, "failed": f, **({"attempts": {
            str(index): [_attempt_json(r) for r in rows] for index, rows in histories[job].items()}}
            if retried[job] else {})} for job, f in failed.items()]}))
        return 0
    for job, f in failed.items():
        print(f if len(ids) == 1 else f"{job}: {f}")
        if retried[job]:
            for index, rows in histories[job].items():
                print(f"  index {index}: " + ", ".join(attempt_text(r) for r in rows))
    return 0


def _attempts_by_index(rows: list[list[Any]]) -> dict[int, list[list[Any]]]:
    out: dict[int, list[list[Any]]] = {}
    for row in rows:
        out.setdefault(row[1], []).append(row)
    return {index: attempts for index, attempts in out.items() if len(attempts) > 1 or attempts[-1][4] != 0}


def _attempt_json(row: list[Any]) -> dict[str, Any]:
    keys = ("attempt", "rank", "status", "exit_code", "signal", "error")
    return {**dict(zip(keys, row[2:8], strict=True)), "outcome": row[10]}


def cancel(argv: list[str]) -> int:
    parser = Parser(prog="mc cancel", description=CANCEL_HELP)
    parser.add_argument("ids", nargs="+", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        _cancelled, errors = client.cancel(args.ids)
    for job, reason in sorted(errors.items()):
        # The broker's reasons usually name the job already ("job 5 has already ended").
        text = reason if reason.startswith(f"job {job} ") else f"job {job}: {reason}"
        sys.stderr.write(f"mc cancel: error: {printable(text)}\n")
    return 1 if errors else 0
