"""What every user command shares: one-line errors instead of tracebacks, and the exit codes."""
from __future__ import annotations

import os
import sys

from minicluster.cli.options import int_at_least
from minicluster.client import ClientError
from minicluster.model.idset import IdSet, IdSetError
from minicluster.model.jobterms import InvalidJobspec
from minicluster.model.text import printable
from minicluster.proto.frames import FrameError, NotText

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from collections.abc import Callable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input noticed after option parsing; exits 2 like an argparse error."""


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
    except (UsageError, InvalidJobspec, NotText) as exc:
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
    sys.stderr.write(f"{prog}: error: {printable(text)}\n")


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
