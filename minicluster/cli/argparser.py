"""argparse for every user command: one-line usage errors (exit 2), and the parser a command builds, for completion.

Apart from common.py so that a command that parses its line without argparse (mc-submit's plain calls,
minicluster/cli/quickparse.py) does not import it.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from minicluster.cli.common import EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, NoReturn


class ParserBuilt(Exception):
    """Raised instead of parsing while `capture_parser` runs: carries the command's parser."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


_capturing = False


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, told its width so that it does not import shutil (with zlib, bz2 and lzma) to ask: argparse
    makes one per add_argument, so every command, mc-submit in shell loops too, would pay that at start-up."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)


def _columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`prog: error: ...`) and exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        if _capturing:
            raise ParserBuilt(self)
        return super().parse_args(args, namespace)


def capture_parser(command: Callable[[list[str]], int]) -> argparse.ArgumentParser | None:
    """The parser a subcommand builds, without running it (shell completion reads its options)."""
    global _capturing
    _capturing = True
    try:
        command([])
    except ParserBuilt as built:
        return built.parser
    finally:
        _capturing = False
    return None
