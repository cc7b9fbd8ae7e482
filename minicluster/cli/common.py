"""What every user command shares: one-line errors instead of tracebacks, and the exit codes."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from minicluster.cli.options import int_at_least
from minicluster.client import ClientError
from minicluster.model.idset import IdSet, IdSetError
from minicluster.model.jobterms import InvalidJobspec
from minicluster.proto.frames import FrameError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input noticed after option parsing; exits 2 like an argparse error."""


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


def guarded(prog: str, func: Callable[[], int]) -> int:
    """Run `func`, turning user-facing failures into one line on stderr and an exit code.

    Set MC_DEBUG=1 to see the traceback instead.
    """
    try:
        return func()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`mc jobs | head`); don't let the final flush complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UsageError, InvalidJobspec) as exc:
        _report(prog, exc)
        return EXIT_USAGE
    except (ClientError, FrameError, OSError) as exc:
        _report(prog, exc)
        return 1
    except ValueError as exc:
        if not _is_config_error(exc):
            raise
        _report(prog, exc)
        return EXIT_USAGE


def _is_config_error(exc: ValueError) -> bool:
    # Looked up, not imported: a command that never loaded the config (mc-submit) cannot have raised its error,
    # and importing it only to compare would cost every such command the import of tomllib and the config model.
    config = sys.modules.get("minicluster.config")
    return config is not None and isinstance(exc, config.ConfigError)


def _report(prog: str, exc: BaseException) -> None:
    if os.environ.get("MC_DEBUG"):
        raise exc
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {text}"
    sys.stderr.write(f"{prog}: error: {text}\n")


# argparse type of a job id: a positive integer.
job_id = int_at_least(1, "a job id")


def ranks(items: list[str]) -> list[int]:
    """Ranks given as idsets on the command line (`mc drain 1-3 7`)."""
    out: list[int] = []
    for item in items:
        try:
            out.extend(IdSet.parse(item))
        except IdSetError as exc:
            raise UsageError(str(exc)) from None
    return sorted(set(out))


def exit_status(status: int | None, exception: str | None) -> int:
    """The process exit code for a finished job: its status, 1 if it never ran to a status."""
    if status is None:
        return 1 if exception else 0
    return min(int(status), 255)
