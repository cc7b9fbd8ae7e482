"""`mc`: one entry point dispatching to subcommands.

Each subcommand's module is imported only when it runs, so `mc jobs` stays fast and a subcommand
whose module (or its dependencies) is missing fails alone.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from minicluster.cli.argparser import Parser
from minicluster.cli.common import EXIT_USAGE, guarded

# name -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("minicluster.cli.submit", "run", "run a job in the foreground, streaming its output"),
    "submit": ("minicluster.cli.submit", "submit", "submit a job, print its id (same as mc-submit)"),
    "bulksubmit": ("minicluster.cli.bulk", "main", "submit one job per line of a file or stdin"),
    "jobs": ("minicluster.cli.jobs", "main", "list jobs (-a: with inactive ones; --json)"),
    "cancel": ("minicluster.cli.jobs", "cancel", "cancel jobs"),
    "hold": ("minicluster.cli.flow", "hold", "keep pending jobs from starting"),
    "release": ("minicluster.cli.flow", "release", "let held jobs start"),
    "requeue": ("minicluster.cli.flow", "requeue", "stop running jobs and queue them again"),
    "update": ("minicluster.cli.flow", "update", "change a job's urgency, time limit or name"),
    "attach": ("minicluster.cli.logs", "attach", "replay and follow a job's output and events"),
    "logs": ("minicluster.cli.logs", "logs", "print a job's output (--follow, --index)"),
    "eventlog": ("minicluster.cli.logs", "eventlog", "print a job's event log"),
    "resources": ("minicluster.cli.instance", "resources", "show nodes and their free resources"),
    "status": ("minicluster.cli.instance", "status", "show the instance: ranks, states, queue"),
    "drain": ("minicluster.cli.instance", "drain", "stop scheduling on ranks"),
    "undrain": ("minicluster.cli.instance", "undrain", "schedule on drained ranks again"),
    "shutdown": ("minicluster.cli.instance", "shutdown", "stop the instance"),
    "start": ("minicluster.cli.launcher", "main", "start a local instance and run a command in it"),
    "broker": ("minicluster.cli.boot", "broker_main", "run the rank-0 broker (used by pods and mc start)"),
    "worker": ("minicluster.cli.boot", "worker_main", "run a worker rank (used by pods and mc start)"),
    "boot": ("minicluster.cli.boot", "boot_main", "run this pod's rank: broker or worker"),
    "operator": ("minicluster.cli.main", "operator", "run the Kubernetes operator"),
    "top": ("minicluster.cli.top", "main", "live view: queue by state, tasks/s, ranks and their health, busiest jobs"),
    "completion": ("minicluster.cli.completion", "completion", "print the shell completion script (bash, zsh)"),
    "queue": ("minicluster.cli.queues", "main", "queues: list, status, start|stop|enable|disable"),
    "bank": ("minicluster.cli.banks", "main", "banks (projects) and fair share: list, add, remove"),
    "usage": ("minicluster.cli.usage", "usage", "core-, GPU- and wall-hours per user and bank"),
    "job": ("minicluster.cli.usage", "job", "about one job: eff ID (CPU and memory efficiency)"),
    "report": ("minicluster.cli.report", "main", "write an HTML report of jobs, a workflow or a time span"),
    "runtime": ("minicluster.cli.runtime", "main", "the injected runtime: install DEST (init container), info"),
}


def operator(argv: list[str]) -> int:
    parser = Parser(prog="mc operator", description="run the MiniCluster Kubernetes operator")
    parser.add_argument("--namespace", action="append",
                        help="watch only this namespace; repeat or separate by commas for several "
                             "(default: MC_OPERATOR_NAMESPACES, else all)")
    args = parser.parse_args(argv)
    try:
        from minicluster.operator import run
    except ImportError as exc:
        raise OSError(f"the operator needs its extra: pip install 'minicluster[operator]' ({exc})") from None
    try:
        run(namespace=",".join(args.namespace or ()))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mc COMMAND [ARGS...] | mc --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_m, _f, help_) in COMMANDS.items()]
    lines += ["", "`mc COMMAND --help` describes a command. MC_URI=unix:///PATH selects the instance."]
    return "\n".join(lines) + "\n"


def resolve(name: str) -> Callable[[list[str]], int]:
    module_name, func_name, _help = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OSError(f"`mc {name}` is unavailable here: {exc}") from None
    return getattr(module, func_name)


def version() -> str:
    import importlib.metadata  # here: it imports email, zipfile and pathlib, which no other command needs

    try:
        return importlib.metadata.version("minicluster")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        (sys.stdout if args else sys.stderr).write(_usage())
        return 0 if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        print(f"mc (minicluster) {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name == "__complete":  # asked by the completion scripts on TAB; not a user command
        from minicluster.cli.completion import complete

        return complete(rest)
    if name not in COMMANDS:
        sys.stderr.write(f"mc: error: unknown command {name!r}; `mc --help` lists them\n")
        return EXIT_USAGE
    return guarded(f"mc {name}", lambda: int(resolve(name)(rest) or 0))
