"""mc-submit (`mc submit`) and `mc run`: submit one job; optionally wait for it or follow it."""
from __future__ import annotations

import sys

from minicluster.cli.common import Parser, guarded
from minicluster.cli.options import add_command_argument, add_job_options, command_of, jobspec_from_args
from minicluster.client import Client

SUBMIT_HELP = "submit a job and print its id (--wait / --watch to stay with it)"
RUN_HELP = "run a job in the foreground: stream its output, exit with its status (Ctrl-C cancels)"


def _parser(prog: str, description: str, run: bool) -> Parser:
    parser = Parser(prog=prog, description=description)
    add_job_options(parser)
    if not run:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--wait", action="store_true",
                          help="wait for the job and exit with its status (arrays: the largest)")
        mode.add_argument("--watch", action="store_true",
                          help="stream the job's output and events until it ends; exit with its status")
    else:
        parser.add_argument("-v", "--events", action="store_true", help="also show the job's events")
    add_command_argument(parser)
    return parser


def submit(argv: list[str], prog: str = "mc submit") -> int:
    args = _parser(prog, SUBMIT_HELP, run=False).parse_args(argv)
    spec = jobspec_from_args(args, command_of(args))
    with Client() as client:
        job = client.submit(spec)
        print(job, flush=True)
        if not (args.watch or args.wait):
            return 0
        # Only now: scripts that submit thousands of jobs don't pay for importing rich.
        from minicluster.cli.watch import follow, wait

        if args.watch:
            return follow(client, job, events=True, ctrl_c_cancels=False)
        return wait(client, [job], progress=bool(args.cc) and sys.stderr.isatty())


def run(argv: list[str]) -> int:
    args = _parser("mc run", RUN_HELP, run=True).parse_args(argv)
    spec = jobspec_from_args(args, command_of(args))
    from minicluster.cli.watch import follow

    with Client() as client:
        job = client.submit(spec)
        return follow(client, job, events=args.events, ctrl_c_cancels=True)


def main(argv: list[str] | None = None) -> int:
    """Console script `mc-submit`."""
    args = sys.argv[1:] if argv is None else argv
    return guarded("mc-submit", lambda: submit(args, prog="mc-submit"))
