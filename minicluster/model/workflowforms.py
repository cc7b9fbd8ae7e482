"""The command-line forms of a jobspec's workflow fields (`afterok:12:13`, `42=fail-job,3-5=retry`, `KILL=retry`,
`+10m`) and what they share with its wire validation (workflow.py): the dependency types, the actions, the error.

Apart from workflow.py, whose wire validation needs dataclasses and typing: mc-submit parses these forms on every
call of a shell loop, and imports re, datetime and signal (all three pull in enum) only for the forms that need
them, a clock time or a signal name (tests/unit/test_client_imports.py).  Pure: no I/O; the clock is an argument.
"""
from __future__ import annotations

from minicluster.model.idset import IdSet, IdSetError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from typing import Any

DEP_TYPES = ("afterstart", "afterany", "afterok", "afternotok", "aftercorr", "singleton")
# Slurm's spelling of afterstart.
DEP_ALIASES = {"after": "afterstart"}
ACTIONS = ("retry", "ignore", "fail", "fail-job")
MAX_SIGNAL = 64
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class WorkflowError(ValueError):
    """A workflow field breaks a rule; the message names the field."""


def idset_of(name: str, text: str) -> IdSet:
    try:
        ids = IdSet.parse(text)
    except IdSetError as exc:
        raise WorkflowError(f"{name}: {exc}") from None
    if not len(ids):
        raise WorkflowError(f"{name}: the idset {text!r} is empty")
    return ids


def last_id(ids: IdSet) -> int:
    return ids[len(ids) - 1]


# --- command-line forms ----------------------------------------------------------------------------------------

def parse_dependencies(items: list[str]) -> list[dict[str, Any]]:
    """`--dependency` values (each `TYPE:ID[:ID...]`, comma-separated, or `singleton`) to wire dependencies."""
    by_type: dict[str, list[int]] = {}
    for item in (part for text in items for part in text.split(",")):
        kind, _, rest = item.strip().partition(":")
        kind = DEP_ALIASES.get(kind, kind)
        if kind not in DEP_TYPES:
            raise WorkflowError(f"dependency: unknown type {kind!r} in {item!r}; one of {', '.join(DEP_TYPES)}")
        if kind == "singleton":
            if rest:
                raise WorkflowError("dependency: singleton takes no job ids")
            by_type.setdefault(kind, [])
            continue
        if not rest:
            raise WorkflowError(f"dependency: {item!r} names no job; write {kind}:ID[:ID...]")
        ids = by_type.setdefault(kind, [])
        for text in rest.split(":"):
            if not text.isdigit() or int(text) < 1:
                raise WorkflowError(f"dependency: {text!r} in {item!r} is not a job id")
            if int(text) not in ids:
                ids.append(int(text))
    return [{"type": kind, "jobs": jobs} for kind, jobs in by_type.items()]


def parse_exit_rules(text: str) -> list[list[str]]:
    """`42=fail-job,3-5=retry,0=ignore` to [["42", "fail-job"], ["3-5", "retry"], ["0", "ignore"]]."""
    return [[codes, action] for codes, action in _pairs("on-exit", text, _exit_codes)]


def parse_signal_rules(text: str) -> list[list[str]]:
    """`KILL=retry,SIGSEGV=fail,15=ignore` to [["9", "retry"], ["11", "fail"], ["15", "ignore"]]."""
    return [[codes, action] for codes, action in _pairs("on-signal", text, _signal_numbers)]


def _pairs(name: str, text: str, codes_of: Any) -> list[tuple[str, str]]:
    out = []
    for item in text.split(","):
        codes, eq, action = item.strip().partition("=")
        if not eq or not codes or action not in ACTIONS:
            raise WorkflowError(f"{name}: {item!r} must be CODES=ACTION, ACTION one of {', '.join(ACTIONS)}")
        out.append((codes_of(name, codes), action))
    return out


def _exit_codes(name: str, text: str) -> str:
    if last_id(idset_of(name, text)) > 255:
        raise WorkflowError(f"{name}: exit codes go from 0 to 255, got {text!r}")
    return text


def _signal_numbers(name: str, text: str) -> str:
    numbers = []
    for part in text.split("+"):
        if part.isdigit():
            number = int(part)
        else:
            import signal  # here: it imports enum, and numbers (9=retry) need none of it

            try:
                number = int(signal.Signals["SIG" + part.upper().removeprefix("SIG")])
            except KeyError:
                raise WorkflowError(f"{name}: unknown signal {part!r}") from None
        if not 1 <= number <= MAX_SIGNAL:
            raise WorkflowError(f"{name}: signal numbers go from 1 to {MAX_SIGNAL}, got {part!r}")
        numbers.append(number)
    return str(IdSet.from_ints(numbers))


def parse_duration(text: str) -> float:
    """`90`, `90s`, `1.5h`, `10m`, `2h`, `1d` (plain numbers are seconds) to seconds."""
    # By hand, not with re (see the module's docstring); isdecimal() is what re's \d matches in a str.
    number = text.strip()
    unit = number[-1:] if number[-1:] in ("s", "m", "h", "d") else ""
    number = number[:len(number) - len(unit)]
    whole, dot, fraction = number.partition(".")
    if not decimal_digits(whole) or (dot and not decimal_digits(fraction)):
        raise WorkflowError(f"bad duration {text!r}: use 90, 90s, 10m, 2h or 1d")
    return float(number) * _UNITS[unit]


def decimal_digits(text: str) -> bool:
    """`text` is one or more ASCII decimal digits (str.isdecimal() and re's \\d also take ٣ and other scripts')."""
    return text != "" and text.isascii() and text.isdecimal()


# Begin times and time limits are seconds below this (a begin time: since the epoch, up to 5138-11-16).
MAX_SECONDS = 1e11
MAX_RETRY_DELAY = 86_400.0


def parse_begin_time(text: str, now: float) -> float:
    """`+10m` (from now), `@1700000000` (epoch), `2025-01-31T12:00[:00]`, `2025-01-31` or `12:30` (local time,
    today, or tomorrow once passed) to epoch seconds, from 0 to MAX_SECONDS."""
    when = _begin_time(text.strip(), now)
    if not 0 <= when < MAX_SECONDS:
        raise WorkflowError(f"begin-time: {text.strip()!r} is not between @0 (1970-01-01) and @{MAX_SECONDS:.0f} "
                            "(5138-11-16)")
    return when


def _begin_time(text: str, now: float) -> float:
    if text.startswith("+"):
        return now + parse_duration(text[1:])
    if text.startswith("@"):
        try:
            return float(text[1:])
        except ValueError:
            raise WorkflowError(f"begin-time: bad epoch time {text!r}") from None
    # A clock time or a date: these need re and datetime, the forms above do not.
    import datetime as _dt
    import re

    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text):
        clock = _dt.time.fromisoformat(text.zfill(5) if len(text) == 4 else text)
        today = _dt.datetime.fromtimestamp(now).date()
        when = _dt.datetime.combine(today, clock).timestamp()
        return when if when > now else when + 86400
    try:
        return _dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise WorkflowError(f"begin-time: cannot read {text!r}; use +10m, @EPOCH, YYYY-MM-DD[THH:MM[:SS]] "
                            "or HH:MM") from None
