"""mc-submit (`mc submit`) and `mc run`: submit one job; optionally wait for it or follow it."""
from __future__ import annotations

import sys

from minicluster.cli.common import guarded
from minicluster.cli.options import (JOB_OPTIONS, add_command_argument, add_job_options, check_jobspec, command_of,
                                     jobspec_from_args, parse_job_args, stdin_tasks)
from minicluster.cli.quickparse import add_options, dest, option, quick_args
from minicluster.client import Client, ClientError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from minicluster.cli.argparser import Parser
    from minicluster.cli.quickparse import Parsed

SUBMIT_HELP = "submit a job and print its id (--wait / --watch to stay with it)"
RUN_HELP = ("run a job in the foreground: stream its output, exit with its status (Ctrl-C cancels, a second one "
            "detaches; SIGTERM, SIGHUP and SIGQUIT cancel the job and exit 128+signal)")

# mc submit's own options, mutually exclusive.
SUBMIT_MODES = (
    option("--wait", action="store_true", help="wait for the job and exit with its status (arrays: the largest)"),
    option("--watch", action="store_true",
           help="stream the job's output and events until it ends; exit with its status"),
)
RUN_OPTIONS = (
    option("-v", "--events", action="store_true", help="also show the job's events"),
    option("-i", "--input", type=stdin_tasks, default="0", metavar="TASKS",
           help="send our stdin to these task ranks: 0 (default), all, an idset (0-3), or none"),
)
LABEL = option("-l", "--label", action="store_true",
               help="put the task rank (array: the index) before each output line")


def _parser(prog: str, description: str, run: bool) -> Parser:
    from minicluster.cli.argparser import Parser

    parser = Parser(prog=prog, description=description)
    add_job_options(parser)
    if not run:
        add_options(parser.add_mutually_exclusive_group(), SUBMIT_MODES)
    else:
        add_options(parser, RUN_OPTIONS)
    add_options(parser, [LABEL])
    add_command_argument(parser)
    return parser


def _submit_args(argv: list[str], prog: str) -> Parsed:
    """mc submit's options: a plain line without argparse (quickparse.py), any other through it."""
    quick = quick_args((*JOB_OPTIONS, *SUBMIT_MODES, LABEL), argv, exclusive=[[dest(f) for f, _ in SUBMIT_MODES]])
    return quick or parse_job_args(_parser(prog, SUBMIT_HELP, run=False), argv)


def submit(argv: list[str], prog: str = "mc submit") -> int:
    args = _submit_args(argv, prog)
    spec = jobspec_from_args(args, command_of(args), check=False)
    if args.watch or args.wait:
        from minicluster.cli.watch import leave_on_ending_signals

        leave_on_ending_signals()  # the job is the instance's (as with `flux submit --wait`): not cancelled
    with Client() as client:
        job = _submit_unchecked(client, spec)
        print(job, flush=True)
        if not (args.watch or args.wait):
            return 0
        # Only now: scripts that submit thousands of jobs don't pay for importing rich.
        from minicluster.cli.watch import follow, wait
        if args.watch:
            return follow(client, job, prog=prog, events=True, ctrl_c_cancels=False, label=args.label,
                          array=spec.get("array"))
        return wait(client, [job], progress=bool(args.cc) and sys.stderr.isatty(), prog=prog)


def _submit_unchecked(client: Client, spec: dict[str, Any]) -> int:
    """Submit `spec` with the broker as its only checker: checking it here too would import the jobspec model on
    every call of a shell loop.  Only a refused one is checked here, so that a jobspec wrong on its face still
    exits 2 with the field's message (a usage error), and a refusal by the instance (a queue, a limit) exits 1."""
    try:
        return client.submit(spec, check=False)
    except ClientError as exc:
        if exc.code == "invalid-jobspec":
            check_jobspec(spec)
        raise


def run(argv: list[str]) -> int:
    args = parse_job_args(_parser("mc run", RUN_HELP, run=True), argv)
    spec = jobspec_from_args(args, command_of(args), stdin=_stdin_of(args))
    from minicluster.cli.watch import caught_signals, follow

    # Signals are noted from before the submit: once the job exists, an early Ctrl-C or SIGTERM must cancel it.
    with Client() as client, caught_signals(ending=True) as interrupts:
        job = client.submit(spec)
        return follow(client, job, prog="mc run", events=args.events, ctrl_c_cancels=True, label=args.label,
                      stdin_fd=sys.stdin.fileno() if "stdin" in spec else None, array=spec.get("array"),
                      interrupts=interrupts)


def _stdin_of(args: argparse.Namespace) -> str | None:
    """Which tasks read our stdin: none for arrays (each element reads /dev/null) or `--input none`."""
    if args.input == "none" or args.cc or sys.stdin is None:
        return None
    return str(args.input)


def main(argv: list[str] | None = None) -> int:
    """Console script `mc-submit`."""
    args = sys.argv[1:] if argv is None else argv
    return guarded("mc-submit", lambda: submit(args, prog="mc-submit"))
