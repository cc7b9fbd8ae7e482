"""mc logs, mc eventlog and mc attach: a job's output and events, so far or followed."""
from __future__ import annotations

import sys

from minicluster.cli.common import Parser, job_id
from minicluster.cli.format import eventlog_json, eventlog_line
from minicluster.cli.options import non_negative_int
from minicluster.cli.watch import follow, write_chunk
from minicluster.client import Client

LOGS_HELP = "print a job's output so far (stdout to stdout, stderr to stderr); --follow for more"
EVENTLOG_HELP = "print a job's event log, one `SEQ TIME NAME key=value...` line per event (TIME is local)"
ATTACH_HELP = "replay and follow a job's output and events; exit with its status (Ctrl-C detaches)"


def logs(argv: list[str]) -> int:
    parser = Parser(prog="mc logs", description=LOGS_HELP)
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
    parser.add_argument("--index", type=non_negative_int, metavar="N", help="only array index N")
    parser.add_argument("id", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        for _task, stream, data in client.output(args.id, follow=args.follow, index=args.index):
            write_chunk(stream, data, sys.stdout.buffer, sys.stderr.buffer)
    return 0


def eventlog(argv: list[str]) -> int:
    parser = Parser(prog="mc eventlog", description=EVENTLOG_HELP,
                    epilog='--json prints one {"seq", "time", "name", "context"} object per line, time in '
                           'seconds since the epoch.')
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the job is clean")
    parser.add_argument("--json", action="store_true", help="machine-readable: JSON lines, raw times")
    parser.add_argument("--from", dest="from_", type=non_negative_int, default=0, metavar="SEQ",
                        help="start at event SEQ")
    parser.add_argument("id", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        for event in client.eventlog(args.id, from_=args.from_, follow=args.follow):
            print(eventlog_json(event) if args.json else eventlog_line(event), flush=True)
    return 0


def attach(argv: list[str]) -> int:
    parser = Parser(prog="mc attach", description=ATTACH_HELP)
    parser.add_argument("-q", "--quiet", action="store_true", help="output only, no events")
    parser.add_argument("id", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        return follow(client, args.id, events=not args.quiet, ctrl_c_cancels=False)
