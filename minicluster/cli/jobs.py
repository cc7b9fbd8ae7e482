"""mc jobs (list jobs, failed array indices) and mc cancel."""
from __future__ import annotations

import sys
import time

from minicluster.cli.common import Parser, job_id
from minicluster.cli.format import alloc_table, dumps, job_json, jobs_table, print_table
from minicluster.cli.options import positive_int
from minicluster.client import Client

HELP = "list jobs: active ones, all with -a, or the given IDs"
CANCEL_HELP = "cancel jobs"


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc jobs", description=HELP, epilog=(
        "--json prints {\"jobs\": [JOB, ...]}, JOB being {id, name, uid, user, state, result, urgency, "
        "t_submit, t_run, t_inactive, runtime, ntasks, nnodes, ranks, status, exception, counts: "
        "{pending, running, succeeded, failed, cancelled}, est_start, reason} (with -o alloc also alloc: "
        "[{path, ranks}]); with --failed: "
        "{\"jobs\": [{id, failed}]}, failed being an idset of array indices."))
    parser.add_argument("-a", "--all", action="store_true", help="include inactive jobs")
    parser.add_argument("--json", action="store_true", help="machine-readable output (shape below)")
    parser.add_argument("--failed", action="store_true", help="print the failed indices of array job IDs")
    parser.add_argument("-L", "--limit", type=positive_int, metavar="N", help="at most N jobs")
    parser.add_argument("-o", "--format", choices=("default", "alloc"), default="default",
                        help="alloc: which topology vertices (racks, zones) each job's ranks are in")
    parser.add_argument("ids", nargs="*", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    if args.failed and not args.ids:
        parser.error("--failed needs job IDs")
    with Client() as client:
        if args.failed:
            return _failed(client, args.ids, args.json)
        alloc = args.format == "alloc"
        summaries = client.jobs(all=args.all or bool(args.ids), ids=args.ids or None, limit=args.limit,
                                alloc=alloc)
    now = time.time()
    if args.json:
        print(dumps({"jobs": [job_json(s, now) for s in summaries]}))
    elif summaries:
        print_table(alloc_table(summaries, now) if alloc else jobs_table(summaries, now))
    missing = sorted(set(args.ids) - {s["id"] for s in summaries})
    for job in missing:
        sys.stderr.write(f"mc jobs: error: job {job} not found\n")
    return 1 if missing else 0


def _failed(client: Client, ids: list[int], as_json: bool) -> int:
    """One line per job: the idset of its failed array indices (empty line if none)."""
    failed = {job: client.job(job).get("failed") or "" for job in ids}
    if as_json:
        print(dumps({"jobs": [{"id": job, "failed": f} for job, f in failed.items()]}))
    elif len(ids) == 1:
        print(failed[ids[0]])
    else:
        for job, f in failed.items():
            print(f"{job}: {f}")
    return 0


def cancel(argv: list[str]) -> int:
    parser = Parser(prog="mc cancel", description=CANCEL_HELP)
    parser.add_argument("ids", nargs="+", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        _cancelled, errors = client.cancel(args.ids)
    for job, reason in sorted(errors.items()):
        # The broker's reasons usually name the job already ("job 5 has already ended").
        text = reason if reason.startswith(f"job {job} ") else f"job {job}: {reason}"
        sys.stderr.write(f"mc cancel: error: {text}\n")
    return 1 if errors else 0
