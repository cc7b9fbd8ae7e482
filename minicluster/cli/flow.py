"""mc hold, mc release, mc requeue and mc update: change jobs that are waiting or running (docs/workflows.md)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from minicluster.cli.argparser import Parser
from minicluster.cli.common import UsageError, job_id
from minicluster.cli.options import time_limit, urgency
from minicluster.client import Client
from minicluster.model.text import printable

HOLD_HELP = "keep pending jobs from starting (an array's unstarted indexes too)"
RELEASE_HELP = "let held jobs start"
REQUEUE_HELP = "stop running jobs and put them back in the queue (not counted as a retry)"
UPDATE_HELP = "change a job: urgency=0-31, time-limit=TIME (running tasks too), name=NAME"


def _name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a job's name cannot be empty (name=NAME)")
    return text


# key on the command line -> (jobspec field, parser of the value)
_UPDATES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "urgency": ("urgency", urgency),
    "time-limit": ("time_limit", time_limit),
    "time_limit": ("time_limit", time_limit),
    "name": ("name", _name),
}


def _jobs_command(prog: str, description: str, call: Callable[[Client, list[int]], tuple[list[int], dict[int, str]]],
                  argv: list[str]) -> int:
    parser = Parser(prog=prog, description=description)
    parser.add_argument("ids", nargs="+", type=job_id, metavar="ID")
    args = parser.parse_args(argv)
    with Client() as client:
        _done, errors = call(client, args.ids)
    for job, reason in sorted(errors.items()):
        text = reason if f"job {job} " in reason else f"job {job}: {reason}"
        sys.stderr.write(f"{prog}: error: {printable(text)}\n")
    return 1 if errors else 0


def hold(argv: list[str]) -> int:
    return _jobs_command("mc hold", HOLD_HELP, Client.hold, argv)


def release(argv: list[str]) -> int:
    return _jobs_command("mc release", RELEASE_HELP, Client.release, argv)


def requeue(argv: list[str]) -> int:
    return _jobs_command("mc requeue", REQUEUE_HELP, Client.requeue, argv)


def update(argv: list[str]) -> int:
    parser = Parser(prog="mc update", description=UPDATE_HELP,
                    epilog="Example: mc update 42 urgency=31 time-limit=2h name=rerun. All or nothing.")
    parser.add_argument("id", type=job_id, metavar="ID")
    parser.add_argument("changes", nargs="+", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    changes = parse_updates(args.changes)
    with Client() as client:
        updated = client.update(args.id, **changes)
    for key, value in updated.items():
        print(printable(f"{key}={value}"))
    return 0


def parse_updates(items: list[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or key not in _UPDATES:
            raise UsageError(f"{item!r}: expected KEY=VALUE with KEY one of urgency, time-limit, name")
        field, parse = _UPDATES[key]
        try:
            changes[field] = parse(text)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"{key}: {exc}") from None
    return changes
