"""Workflow parts of a jobspec (protocol.md §3.4, §3.9): dependencies, failure and success policies, holds.

Validation of the wire form, and parsing of the command-line forms (`afterok:12:13`, `42=fail-job,3-5=retry`,
`KILL=retry`, `+10m`). Pure: no I/O; the clock is an argument.
"""
from __future__ import annotations

import datetime as _dt
import re
import signal as _signal
from dataclasses import dataclass
from typing import Any

from minicluster.model.idset import IdSet, IdSetError

DEP_TYPES = ("afterstart", "afterany", "afterok", "afternotok", "aftercorr", "singleton")
# Slurm's spelling of afterstart.
DEP_ALIASES = {"after": "afterstart"}
ACTIONS = ("retry", "ignore", "fail", "fail-job")
MAX_DEPENDENCY_JOBS = 100_000
MAX_RETRIES = 1_000_000
MAX_RETRY_DELAY = 86_400.0
MAX_SIGNAL = 64
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class WorkflowError(ValueError):
    """A workflow field breaks a rule; the message names the field."""


@dataclass(frozen=True, slots=True)
class Dependency:
    type: str
    jobs: tuple[int, ...] = ()

    def descriptions(self) -> list[str]:
        """One `type:job` per target (`singleton` alone): the unit of dependency-add/-remove events."""
        if self.type == "singleton":
            return ["singleton"]
        return [f"{self.type}:{job}" for job in self.jobs]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "jobs": list(self.jobs)}


Rule = tuple[str, str]  # (idset text, action)


# --- wire validation -------------------------------------------------------------------------------------------

def dependencies_from_wire(value: Any) -> tuple[Dependency, ...]:
    if not isinstance(value, (list, tuple)):
        raise WorkflowError("dependencies: must be a list of {type, jobs} maps")
    out: list[Dependency] = []
    total = 0
    for item in value:
        if not isinstance(item, dict) or set(item) - {"type", "jobs"}:
            raise WorkflowError("dependencies: each item must be a map with keys type and jobs")
        kind = item.get("type")
        if kind not in DEP_TYPES:
            raise WorkflowError(f"dependencies: unknown type {kind!r}; one of {', '.join(DEP_TYPES)}")
        jobs = item.get("jobs", [])
        if not isinstance(jobs, (list, tuple)) or not all(
                isinstance(j, int) and not isinstance(j, bool) and j > 0 for j in jobs):
            raise WorkflowError(f"dependencies: {kind} jobs must be a list of positive job ids")
        if kind == "singleton" and jobs:
            raise WorkflowError("dependencies: singleton takes no job ids")
        if kind != "singleton" and not jobs:
            raise WorkflowError(f"dependencies: {kind} needs at least one job id")
        if len(set(jobs)) != len(jobs):
            raise WorkflowError(f"dependencies: {kind} names a job twice")
        total += len(jobs)
        out.append(Dependency(kind, tuple(jobs)))
    if total > MAX_DEPENDENCY_JOBS:
        raise WorkflowError(f"dependencies: {total} job ids, at most {MAX_DEPENDENCY_JOBS}")
    kinds = [d.type for d in out]
    if kinds.count("singleton") > 1:
        raise WorkflowError("dependencies: singleton given twice")
    return tuple(out)


def rules_from_wire(name: str, value: Any, top: int) -> tuple[Rule, ...]:
    if not isinstance(value, (list, tuple)):
        raise WorkflowError(f"{name}: must be a list of [idset, action] pairs")
    out: list[Rule] = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not all(isinstance(x, str) for x in item):
            raise WorkflowError(f"{name}: each rule must be [idset, action], e.g. [\"3-5\", \"retry\"]")
        codes, action = item
        if action not in ACTIONS:
            raise WorkflowError(f"{name}: unknown action {action!r}; one of {', '.join(ACTIONS)}")
        if _last(_idset(name, codes)) > top:
            raise WorkflowError(f"{name}: {codes} goes beyond {top}")
        out.append((codes, action))
    return tuple(out)


def _idset(name: str, text: str) -> IdSet:
    try:
        ids = IdSet.parse(text)
    except IdSetError as exc:
        raise WorkflowError(f"{name}: {exc}") from None
    if not len(ids):
        raise WorkflowError(f"{name}: the idset {text!r} is empty")
    return ids


def _last(ids: IdSet) -> int:
    return ids[len(ids) - 1]


def optional_int(data: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkflowError(f"{name}: must be an integer from {lo} to {hi}, got {value!r}")
    return value


def optional_seconds(data: dict[str, Any], name: str, hi: float) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= hi:
        raise WorkflowError(f"{name}: must be a number of seconds from 0 to {hi:g}, got {value!r}")
    return float(value)


def success_indexes(value: str | None, array: IdSet | None) -> IdSet | None:
    if value is None:
        return None
    if array is None:
        raise WorkflowError("success_indexes: only for arrays")
    ids = _idset("success_indexes", value)
    missing = [i for i in ids if i not in array]
    if missing:
        raise WorkflowError(f"success_indexes: {IdSet.from_ints(missing[:1000])} not in the array {array}")
    return ids


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
    if _last(_idset(name, text)) > 255:
        raise WorkflowError(f"{name}: exit codes go from 0 to 255, got {text!r}")
    return text


def _signal_numbers(name: str, text: str) -> str:
    numbers = []
    for part in text.split("+"):
        if part.isdigit():
            number = int(part)
        else:
            try:
                number = int(_signal.Signals["SIG" + part.upper().removeprefix("SIG")])
            except KeyError:
                raise WorkflowError(f"{name}: unknown signal {part!r}") from None
        if not 1 <= number <= MAX_SIGNAL:
            raise WorkflowError(f"{name}: signal numbers go from 1 to {MAX_SIGNAL}, got {part!r}")
        numbers.append(number)
    return str(IdSet.from_ints(numbers))


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `1d` (plain numbers are seconds) to seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise WorkflowError(f"bad duration {text!r}: use 90, 90s, 10m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_begin_time(text: str, now: float) -> float:
    """`+10m` (from now), `@1700000000` (epoch), `2025-01-31T12:00[:00]`, `2025-01-31` or `12:30` (local time,
    today, or tomorrow once passed) to epoch seconds."""
    text = text.strip()
    if text.startswith("+"):
        return now + parse_duration(text[1:])
    if text.startswith("@"):
        try:
            return float(text[1:])
        except ValueError:
            raise WorkflowError(f"begin-time: bad epoch time {text!r}") from None
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
