"""Commands about the instance rather than a job: resources, status, drain, undrain, shutdown."""
from __future__ import annotations

import time

from minicluster.cli.argparser import Parser
from minicluster.cli.common import ranks
from minicluster.cli.format import (dumps, print_table, resources_table, status_lines, status_table,
                                   tree_lines)
from minicluster.client import Client

RESOURCES_HELP = ("per node: state, free/total cores, GPUs and memory, properties, drain reason;"
                  " --tree: the topology hierarchy")
STATUS_HELP = "the instance: size, fanout, each rank's state, pid and endpoint; queue counts"
DRAIN_HELP = "stop scheduling on ranks (running jobs go on)"
UNDRAIN_HELP = "schedule on drained ranks again"
SHUTDOWN_HELP = ("stop the instance, the workers and the broker; running jobs go back to the queue (not counted "
                 "as failed, no retry used) and run again when an instance starts on the same state directory; "
                 "queued jobs stay queued")


def resources(argv: list[str]) -> int:
    parser = Parser(prog="mc resources", description=RESOURCES_HELP,
                    epilog='--json prints {"ranks": [rankresources, ...]} as the broker reports them;'
                           ' with --tree, {"tree": vertex} (protocol.md §3.3).')
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--tree", action="store_true",
                        help="the hierarchy (cluster > zone > rack > node > socket), free/used per vertex")
    args = parser.parse_args(argv)
    with Client() as client:
        if args.tree:
            hierarchy = client.resource_tree()
            print(dumps({"tree": hierarchy}) if args.json else "\n".join(tree_lines(hierarchy)))
            return 0
        rows = client.resources()
    if args.json:
        print(dumps({"ranks": rows}))
    else:
        print_table(resources_table(rows))
    return 0


def status(argv: list[str]) -> int:
    parser = Parser(prog="mc status", description=STATUS_HELP,
                    epilog="--json prints {name, size, fanout, epoch, ranks: [{rank, state, pid, hostname, "
                           "endpoint, since}], queue: {state: count}, tasks: {started, ended}, journal: {stalled}}.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    with Client() as client:
        info = client.status()
    if args.json:
        print(dumps(info))
        return 0
    for line in status_lines(info):
        print(line)
    print_table(status_table(info.get("ranks") or [], time.time()))
    return 0


def drain(argv: list[str]) -> int:
    parser = Parser(prog="mc drain", description=DRAIN_HELP)
    parser.add_argument("--reason", default="", metavar="TEXT", help="why (shown by mc resources)")
    parser.add_argument("ranks", nargs="+", metavar="RANK", help="ranks or idsets (1-3,7)")
    args = parser.parse_args(argv)
    targets = ranks(args.ranks)
    with Client() as client:
        client.drain(targets, args.reason)
    return 0


def undrain(argv: list[str]) -> int:
    parser = Parser(prog="mc undrain", description=UNDRAIN_HELP)
    parser.add_argument("ranks", nargs="+", metavar="RANK", help="ranks or idsets (1-3,7)")
    args = parser.parse_args(argv)
    targets = ranks(args.ranks)
    with Client() as client:
        client.undrain(targets)
    return 0


def shutdown(argv: list[str]) -> int:
    parser = Parser(prog="mc shutdown", description=SHUTDOWN_HELP)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--cancel", dest="mode", action="store_const", const="cancel",
                      help="cancel the running jobs instead (as mc cancel: their afterok dependants fail)")
    mode.add_argument("--drain", dest="mode", action="store_const", const="drain",
                      help="start nothing new and refuse submissions; stop once the running jobs ended")
    args = parser.parse_args(argv)
    with Client() as client:
        client.shutdown(args.mode or "requeue")
    return 0
