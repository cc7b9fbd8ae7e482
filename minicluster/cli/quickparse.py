"""Option tables, and a parser of plain command lines that reads them without argparse.

mc-submit runs once per job from shell loops, and importing argparse (with re, enum, functools and collections
that it pulls in) and building its parser cost more than the rest of the call (issue 17 item 6).  Its options
are therefore tables of `option(...)` rows, written with argparse's own keywords: argparse is built from them
(add_options) and `quick_args` parses the same rows directly.  quick_args takes only what it can parse exactly
as argparse would (an exact option name, `--name=value`, a value that does not start with `-`, an accepted
type and choice, a command); for anything else (`--help`, an abbreviation, a bad value, no command) it returns
None, and argparse parses the line and gives its usual message.  tests/unit/test_quickparse.py holds the two
to the same result.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Sequence
    from typing import Any, TypeAlias

    Option: TypeAlias = tuple[tuple[str, ...], dict[str, Any]]
    # Parsed options, from argparse or from quick_args: the commands read their attributes.
    Parsed: TypeAlias = "argparse.Namespace | Args"

# The argparse keywords quick_args understands; a row with any other keyword is left to argparse.
_KEYWORDS = frozenset({"action", "type", "choices", "default", "metavar", "help"})
_ACTIONS = ("store", "store_true", "append")


def option(*flags: str, **kwargs: Any) -> Option:
    """One option: its flags and argparse.add_argument's keywords."""
    return flags, kwargs


def add_options(parser: Any, options: Iterable[Option]) -> None:
    """Give `options` to an argparse parser or argument group."""
    for flags, kwargs in options:
        parser.add_argument(*flags, **kwargs)


class Args:
    """The parsed options as attributes, as on an argparse.Namespace."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Args({self.__dict__!r})"

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...


def dest(flags: Sequence[str]) -> str:
    """argparse's attribute name for an option: its first long flag (else its first flag), without dashes."""
    name = next((f for f in flags if f.startswith("--")), flags[0])
    return name.lstrip("-").replace("-", "_")


def quick_args(options: Sequence[Option], argv: Sequence[str],
               exclusive: Sequence[Sequence[str]] = ()) -> Args | None:
    """What argparse would parse from `argv` (the options, then a REMAINDER `command`), or None if unsure.

    `exclusive`: groups of attribute names argparse keeps mutually exclusive."""
    by_flag = {flag: (dest(flags), kwargs) for flags, kwargs in options for flag in flags}
    if any(set(kwargs) - _KEYWORDS or kwargs.get("action", "store") not in _ACTIONS for _, kwargs in options):
        return None
    values: dict[str, Any] = {dest(flags): _default(kwargs) for flags, kwargs in options}
    given: set[str] = set()
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "--"):
        flag, eq, value = argv[i].partition("=") if argv[i].startswith("--") else (argv[i], "", "")
        if flag not in by_flag:
            return None
        name, kwargs = by_flag[flag]
        action = kwargs.get("action", "store")
        i += 1
        if action == "store_true":
            if eq:
                return None
            values[name] = True
        else:
            if not eq:
                if i == len(argv) or argv[i].startswith("-"):
                    return None
                value, i = argv[i], i + 1
            converted = _converted(kwargs, value)
            if converted is None:
                return None
            if action == "append":
                values[name].append(converted[0])
            else:
                values[name] = converted[0]
        given.add(name)
    if i == len(argv) or any(len(given.intersection(group)) > 1 for group in exclusive):
        return None
    values["command"] = list(argv[i:])
    return Args(values)


def _default(kwargs: dict[str, Any]) -> Any:
    default = kwargs.get("default", False if kwargs.get("action") == "store_true" else None)
    if isinstance(default, str) and "type" in kwargs:
        return kwargs["type"](default)  # argparse passes a string default through the type, too
    return list(default) if isinstance(default, list) else default


def _converted(kwargs: dict[str, Any], text: str) -> tuple[Any] | None:
    """(the option's value,) from `text` through its type and choices, or None where argparse would complain."""
    try:
        value = kwargs["type"](text) if "type" in kwargs else text
    except Exception:  # argparse reports a bad value; it parses the line again for the message
        return None
    if "choices" in kwargs and value not in kwargs["choices"]:
        return None
    return (value,)
