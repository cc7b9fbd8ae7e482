"""`mc`: one entry point dispatching to subcommands.

Each subcommand's module is imported only when it runs, so `mc jobs` stays fast and a subcommand
whose module (or its dependencies) is missing fails alone.
"""
from __future__ import annotations

import sys

from minicluster.cli.argparser import Parser
from minicluster.cli.commands import COMMANDS, resolve
from minicluster.cli.common import EXIT_USAGE, guarded


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
