"""mc bulksubmit: one command per input line, submitted pipelined in `submit-many` batches."""
from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable
from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.common import UsageError
from minicluster.cli.options import add_job_options, jobspec_from_args, parse_job_args
from minicluster.cli.watch import wait
from minicluster.client import Client, ClientError
from minicluster.model.jobspec import InvalidJobspec
from minicluster.model.text import printable

HELP = "submit one job per line of FILE (or stdin), each line split like a shell would"


def parse_lines(lines: Iterable[str]) -> list[tuple[int, list[str]]]:
    """(line number, argv) of each command; blank lines and `#` comments are skipped."""
    out = []
    for number, line in enumerate(lines, 1):
        try:
            argv = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"line {number}: {exc}") from None
        if argv:
            out.append((number, argv))
    return out


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc bulksubmit", description=HELP)
    add_job_options(parser)
    parser.add_argument("--wait", action="store_true",
                        help="wait for all the jobs; exit with the largest status")
    parser.add_argument("file", nargs="?", default="-", metavar="FILE|-", help="commands (default: stdin)")
    args = parse_job_args(parser, argv)
    if args.file == "-":
        commands = parse_lines(sys.stdin)
    else:
        with open(args.file) as f:
            commands = parse_lines(f)
    specs: list[dict[str, Any]] = []
    for number, command in commands:
        try:
            specs.append(jobspec_from_args(args, command))
        except InvalidJobspec as exc:
            raise UsageError(f"line {number}: {exc}") from None
    failed = False
    submitted = []
    with Client() as client:
        for (number, _command), outcome in zip(commands, client.submit_many(specs), strict=True):
            if isinstance(outcome, ClientError):
                sys.stderr.write(f"mc bulksubmit: error: line {number}: {printable(outcome.message)}\n")
                failed = True
            else:
                submitted.append(outcome)
                print(outcome)
        sys.stdout.flush()
        status = 0
        if args.wait and submitted:
            status = wait(client, submitted, progress=sys.stderr.isatty(), prog="mc bulksubmit")
    return max(status, 1 if failed else 0)
