"""mc logs, mc eventlog and mc attach: a job's output and events, so far or followed."""
from __future__ import annotations

import sys

from minicluster.cli.argparser import Parser
from minicluster.cli.common import job_id
from minicluster.cli.format import eventlog_json, eventlog_line
from minicluster.cli.options import non_negative_int
from minicluster.cli.output import OutputWriter, task_labels
from minicluster.cli.reasons import report, task_errors
from minicluster.cli.watch import follow, leave_on_ending_signals, output_files_note, truncated_note
from minicluster.client import Client

LOGS_HELP = "print a job's output so far (stdout to stdout, stderr to stderr); --follow for more"
EVENTLOG_HELP = "print a job's event log, one `SEQ TIME NAME key=value...` line per event (TIME is local)"
ATTACH_HELP = "replay and follow a job's output and events; exit with its status (Ctrl-C detaches)"
LABEL_HELP = "put the task rank (array: the index) before each output line"


def logs(argv: list[str]) -> int:
    parser = Parser(prog="mc logs", description=LOGS_HELP, epilog=(
        "Afterwards, on stderr: the tasks that could not run and why, where the output went for a job "
        "submitted with --output, and whether the output was truncated at the instance's output_cap."))
    parser.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
    parser.add_argument("--index", type=non_negative_int, metavar="N", help="only array index N")
    parser.add_argument("--attempt", type=non_negative_int, metavar="K",
                        help="only attempt K (0 the first run, 1 the first retry or requeue, ...)")
    parser.add_argument("-l", "--label", action="store_true", help=LABEL_HELP)
    parser.add_argument("id", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        summary = client.job(args.id)
        array = summary.get("array")
        writer = OutputWriter(sys.stdout.buffer, sys.stderr.buffer, task_labels(array) if args.label else None)
        notes = []
        fields = {"job": args.id, "follow": args.follow}
        if args.index is not None:
            fields["index"] = args.index
        if args.attempt is not None:
            fields["attempt"] = args.attempt
        for msg in client.stream("output", **fields):
            for task, stream, data in msg.get("chunks", ()):
                writer.write(task, stream, data)
            if msg.get("files"):
                notes.append(output_files_note(args.id, msg["files"]))
            if msg.get("truncated"):
                notes.append(truncated_note(msg["truncated"]))
        report("mc logs", args.id, notes + task_errors(client, args.id, array is not None, args.index))
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
    parser.add_argument("-l", "--label", action="store_true", help=LABEL_HELP)
    parser.add_argument("id", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    leave_on_ending_signals()  # not its job to cancel: SIGTERM or SIGHUP detaches, 128 + the signal
    with Client() as client:
        array = client.job(args.id).get("array")
        return follow(client, args.id, prog="mc attach", events=not args.quiet, ctrl_c_cancels=False,
                      label=args.label, array=array)
