"""Shell completion for `mc` and `mc-submit` (bash and zsh): subcommands, options, option values, job ids.

`mc completion bash|zsh` prints a small script; on TAB it asks `mc __complete`, which reads the options from the
subcommands' own parsers (so completion never falls behind them) and job ids from the broker, as `mc jobs`
lists them. Where nothing fits (a file name, the command of `mc run`) the shell completes files.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from minicluster.cli.argparser import Parser, capture_parser
from minicluster.cli.commands import COMMANDS, resolve

# Subcommands whose positional arguments are job ids, and whether finished jobs are worth offering.
JOB_ARGUMENTS = {"cancel": False, "attach": True, "logs": True, "eventlog": True, "jobs": True, "hold": False,
                 "release": False, "requeue": False, "update": False}
RANK_ARGUMENTS = ("drain", "undrain")
# Process entry points: no options worth completing.
INTERNAL = ("broker", "worker", "boot")
MAX_JOB_IDS = 200

BASH = """\
# bash completion for mc and mc-submit (minicluster). Load with:  source <(mc completion bash)
_mc_complete() {
    local IFS=$'\\n'
    COMPREPLY=($(mc __complete --shell bash --line "${COMP_LINE:0:$COMP_POINT}" 2>/dev/null))
}
complete -o default -F _mc_complete mc mc-submit
"""

ZSH = """\
#compdef mc mc-submit
# zsh completion for mc and mc-submit (minicluster). Load with:  source <(mc completion zsh)
# (after compinit), or save as _mc in a directory of $fpath.
_mc() {
    local -a found
    found=("${(@f)$(mc __complete --shell zsh -- "${(@)words[1,CURRENT]}" 2>/dev/null)}")
    if [[ -z "${found[1]}" ]]; then
        _files
    else
        compadd -Q -- "${found[@]}"
    fi
}
if (( $+functions[compdef] )); then
    compdef _mc mc mc-submit
fi
"""


def completion(argv: list[str]) -> int:
    parser = Parser(prog="mc completion", description="print the shell completion script for bash or zsh",
                    epilog="bash: source <(mc completion bash) in ~/.bashrc; zsh: source <(mc completion zsh) "
                           "in ~/.zshrc after compinit.")
    parser.add_argument("shell", choices=("bash", "zsh"))
    args = parser.parse_args(argv)
    sys.stdout.write(BASH if args.shell == "bash" else ZSH)
    return 0


def complete(argv: list[str]) -> int:
    """`mc __complete --shell S (--line TEXT | -- WORDS...)`: candidates for the last word, one per line."""
    parser = argparse.ArgumentParser(prog="mc __complete")
    parser.add_argument("--shell", choices=("bash", "zsh"), default="bash")
    parser.add_argument("--line")
    parser.add_argument("words", nargs="*")
    args = parser.parse_args(argv)
    words = split_line(args.line) if args.line is not None else list(args.words)
    for candidate in candidates(words, bare_values=args.shell == "bash"):
        print(candidate)
    return 0


def split_line(line: str) -> list[str]:
    """The words of a command line up to the cursor; the last one is being completed ("" after a blank)."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unclosed quote: the word being typed
        words = line.split()
    if not line or line[-1].isspace():
        words.append("")
    return words


def candidates(words: list[str], bare_values: bool = True) -> list[str]:
    """Completions of `words[-1]`, the command being `words[0]` (mc or mc-submit).

    `bare_values`: for `--opt=va`, offer `value` (bash completes the part after `=`), else `--opt=value`.
    """
    if not words:
        return []
    rest = words[1:]
    if words[0].rsplit("/", 1)[-1] == "mc-submit":
        rest = ["submit", *rest]
    if len(rest) <= 1:
        current = rest[0] if rest else ""
        return [c for c in [*COMMANDS, "--help", "--version"] if c.startswith(current)]
    name, done, current = rest[0], rest[1:-1], rest[-1]
    if name not in COMMANDS or name in INTERNAL:
        return []
    parser = capture_parser(resolve(name))
    if parser is None:
        return []
    return _for_parser(parser, name, done, current, bare_values)


def _for_parser(parser: argparse.ArgumentParser, name: str, done: list[str], current: str,
                bare_values: bool) -> list[str]:
    options = parser._option_string_actions
    expecting: argparse.Action | None = None
    for word in done:
        if expecting is not None:
            expecting = None
        elif word in options and options[word].nargs != 0:
            expecting = options[word]
        elif not word.startswith("-") and _takes_command(parser):
            return []  # the command has begun: its arguments are the shell's to complete
    if expecting is not None:
        return _values(expecting, current)
    if current.startswith("--") and "=" in current:
        option, _, value = current.partition("=")
        action = options.get(option)
        values = _values(action, value) if action is not None else []
        return values if bare_values else [f"{option}={v}" for v in values]
    if current.startswith("-"):
        return sorted(o for o in options if o.startswith(current))
    if name in JOB_ARGUMENTS:
        return [j for j in _job_ids(JOB_ARGUMENTS[name]) if j.startswith(current)]
    if name in RANK_ARGUMENTS:
        return [r for r in _ranks() if r.startswith(current)]
    return []


def _takes_command(parser: argparse.ArgumentParser) -> bool:
    return any(a.nargs == argparse.REMAINDER for a in parser._actions)


def _values(action: argparse.Action, current: str) -> list[str]:
    choices = list(action.choices or ())
    if action.dest == "input":
        choices = ["none", "all", "0"]
    return [str(c) for c in choices if str(c).startswith(current)]


def _job_ids(finished_too: bool) -> list[str]:
    try:
        from minicluster.client import Client

        with Client() as client:
            return [str(j["id"]) for j in client.jobs(all=finished_too, limit=MAX_JOB_IDS)]
    except Exception:  # no instance, no permission: nothing to offer, and never a traceback on TAB
        return []


def _ranks() -> list[str]:
    try:
        from minicluster.client import Client

        with Client() as client:
            return [str(r["rank"]) for r in client.status()["ranks"]]
    except Exception:
        return []
