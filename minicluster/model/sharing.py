"""Sharing a MiniCluster (docs/scheduling.md, "Queues, limits and fair share"): named queues, banks and the
priority weights, parsed from the instance config with messages that name the offending key. No I/O.

The config holds plain TOML tables (`queues`, `banks`, `default_projects`, `priority`); `parse()` turns them into
frozen values the broker uses, and `InstanceConfig` calls it at load, so a bad table is a one-line config error.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ROOT_BANK = "root"
DEFAULT_QUEUE = "default"
PREEMPT_MODES = ("requeue", "cancel")
MAX_QUEUES = 64
MAX_BANKS = 10_000
MAX_SHARES = 1_000_000_000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-$]{0,63}\Z")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)\Z")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SharingError(ValueError):
    """A queue, bank or priority setting is invalid; the message starts with its key."""


@dataclass(frozen=True, slots=True)
class Limits:
    """At most this much at once (0 = no limit). Array elements count as jobs, as Slurm's array tasks do."""

    running_jobs: int = 0
    cores: int = 0
    gpus: int = 0
    queued_jobs: int = 0

    def to_wire(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    # Base priority: the queue factor of a job's priority, and who may preempt whom (higher preempts lower).
    priority: int = 0
    # Node property constraints every job of the queue gets (like a Slurm partition's nodes).
    requires: tuple[str, ...] = ()
    default_time_limit: float = 0.0  # 0: the instance's default_time_limit
    max_time_limit: float = 0.0      # 0: none
    preemptible: bool = False
    preempt_mode: str = "requeue"
    limits: Limits = field(default_factory=Limits)
    user_limits: Limits = field(default_factory=Limits)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "priority": self.priority, "requires": list(self.requires),
                "default_time_limit": self.default_time_limit, "max_time_limit": self.max_time_limit,
                "preemptible": self.preemptible, "preempt_mode": self.preempt_mode,
                "limits": self.limits.to_wire(), "user_limits": self.user_limits.to_wire()}


@dataclass(frozen=True, slots=True)
class BankSpec:
    name: str
    parent: str = ROOT_BANK
    shares: int = 1
    # user (name or decimal uid) -> shares within the bank
    users: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Weights:
    """Multifactor priority (Slurm's priority/multifactor): each factor is in [0, 1], times its weight."""

    fairshare: float = 100_000.0
    queue: float = 10_000.0
    urgency: float = 1_000.0
    age: float = 1_000.0
    jobsize: float = 0.0
    max_age: float = 7 * 86400.0       # the age factor reaches 1 here (PriorityMaxAge)
    half_life: float = 7 * 86400.0     # usage decays by half over this (PriorityDecayHalfLife)
    gpu_weight: float = 1.0            # a GPU-second is charged as this many core-seconds
    interval: float = 60.0             # full recomputation of every pending job's priority (age)
    fairshare_interval: float = 1.0    # fair-share factors from decayed usage


@dataclass(frozen=True)
class Sharing:
    queues: tuple[QueueSpec, ...]
    default_queue: str
    banks: tuple[BankSpec, ...] = ()
    default_projects: tuple[tuple[str, str], ...] = ()
    weights: Weights = field(default_factory=Weights)

    def queue(self, name: str) -> QueueSpec | None:
        return next((q for q in self.queues if q.name == name), None)

    @property
    def max_queue_priority(self) -> int:
        return max((q.priority for q in self.queues), default=0)


def parse(queues: Any, default_queue: Any = "", banks: Any = None, default_projects: Any = None,
          priority: Any = None) -> Sharing:
    """The sharing settings of an instance config; raises SharingError naming the bad key."""
    specs = _queues(_table(queues, "queues"))
    names = [q.name for q in specs]
    if not isinstance(default_queue, str):
        raise SharingError(f"default_queue: must be a queue name, got {default_queue!r}")
    default = default_queue or names[0]
    if default not in names:
        raise SharingError(f"default_queue: {default!r} is not a queue (queues: {', '.join(names)})")
    bank_specs = _banks(_table(banks, "banks"))
    known = {b.name for b in bank_specs} | {ROOT_BANK}
    defaults = []
    for user, bank in _table(default_projects, "default_projects").items():
        if not isinstance(bank, str) or bank not in known:
            raise SharingError(f"default_projects.{user}: {bank!r} is not a bank")
        defaults.append((_user(user, f"default_projects.{user}"), bank))
    return Sharing(tuple(specs), default, tuple(bank_specs), tuple(defaults), _weights(_table(priority, "priority")))


def _table(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SharingError(f"{key}: must be a table, got {value!r}")
    return value


def valid_name(value: Any) -> bool:
    """A queue or bank name: letters, digits, '_', '.', '-', starting with a letter or digit, at most 64."""
    return isinstance(value, str) and _NAME.match(value) is not None


def _name(value: Any, key: str) -> str:
    if not valid_name(value):
        raise SharingError(f"{key}: {value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 64)")
    return str(value)


def _user(value: Any, key: str) -> str:
    """A user as written in the config: a login name or a decimal uid."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if not isinstance(value, str) or not _USER.match(value):
        raise SharingError(f"{key}: {value!r} is not a user name or uid")
    return value


def _int(table: dict[str, Any], name: str, key: str, default: int, low: int = 0, high: int = 1 << 53) -> int:
    value = table.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SharingError(f"{key}.{name}: must be an integer in {low}..{high}, got {value!r}")
    return value


def seconds(value: Any, key: str) -> float:
    """A duration: a number of seconds or `90s`, `30m`, `2h`, `7d`."""
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match is None:
            raise SharingError(f"{key}: {value!r} is not a duration (seconds, or 90s/30m/2h/7d)")
        value = float(match.group(1)) * _UNITS[match.group(2)]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SharingError(f"{key}: must be a duration of at least 0, got {value!r}")
    return float(value)


def _limits(value: Any, key: str) -> Limits:
    table = _table(value, key)
    names = {f.name for f in fields(Limits)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise SharingError(f"{key}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return Limits(**{n: _int(table, n, key, 0) for n in names})


_QUEUE_KEYS = {"priority", "requires", "default_time_limit", "max_time_limit", "preemptible", "preempt_mode",
               "limits", "user_limits"}


def _queues(table: dict[str, Any]) -> list[QueueSpec]:
    if not table:
        return [QueueSpec(DEFAULT_QUEUE)]
    if len(table) > MAX_QUEUES:
        raise SharingError(f"queues: at most {MAX_QUEUES} queues, got {len(table)}")
    return [_queue(_name(name, "queues"), _table(body, f"queues.{name}")) for name, body in table.items()]


def _queue(name: str, body: dict[str, Any]) -> QueueSpec:
    key = f"queues.{name}"
    unknown = sorted(set(body) - _QUEUE_KEYS)
    if unknown:
        raise SharingError(f"{key}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_QUEUE_KEYS))}")
    requires = body.get("requires", [])
    if isinstance(requires, str):
        requires = [requires]
    if not isinstance(requires, list) or not all(isinstance(r, str) and r for r in requires):
        raise SharingError(f"{key}.requires: must be a list of constraints like zone=a")
    preemptible = body.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise SharingError(f"{key}.preemptible: must be true or false")
    mode = body.get("preempt_mode", "requeue")
    if mode not in PREEMPT_MODES:
        raise SharingError(f"{key}.preempt_mode: must be one of {', '.join(PREEMPT_MODES)}, got {mode!r}")
    spec = QueueSpec(
        name=name, priority=_int(body, "priority", key, 0, 0, 1_000_000), requires=tuple(requires),
        default_time_limit=seconds(body.get("default_time_limit", 0), f"{key}.default_time_limit"),
        max_time_limit=seconds(body.get("max_time_limit", 0), f"{key}.max_time_limit"),
        preemptible=preemptible, preempt_mode=mode,
        limits=_limits(body.get("limits"), f"{key}.limits"),
        user_limits=_limits(body.get("user_limits"), f"{key}.user_limits"),
    )
    if spec.max_time_limit and spec.default_time_limit > spec.max_time_limit:
        raise SharingError(f"{key}.default_time_limit: {spec.default_time_limit:g}s exceeds "
                           f"max_time_limit {spec.max_time_limit:g}s")
    return spec


_BANK_KEYS = {"parent", "shares", "users"}


def _banks(table: dict[str, Any]) -> list[BankSpec]:
    if len(table) > MAX_BANKS:
        raise SharingError(f"banks: at most {MAX_BANKS} banks, got {len(table)}")
    specs = []
    for name, body in table.items():
        key = f"banks.{_name(name, 'banks')}"
        if name == ROOT_BANK:
            raise SharingError(f"{key}: {ROOT_BANK!r} is the implicit top of the tree; list its users as "
                               "users of another bank or leave them out (they are charged to root)")
        body = _table(body, key)
        unknown = sorted(set(body) - _BANK_KEYS)
        if unknown:
            raise SharingError(f"{key}: unknown key(s) {', '.join(unknown)}; known: parent, shares, users")
        parent = _name(body.get("parent", ROOT_BANK), f"{key}.parent")
        specs.append(BankSpec(name, parent, _int(body, "shares", key, 1, 0, MAX_SHARES),
                              _bank_users(body.get("users", []), f"{key}.users")))
    check_tree({s.name: s.parent for s in specs})
    return specs


def _bank_users(value: Any, key: str) -> tuple[tuple[str, int], ...]:
    if isinstance(value, list):
        return tuple((_user(u, key), 1) for u in value)
    table = _table(value, key)
    return tuple((_user(u, key), _int(table, u, key, 1, 0, MAX_SHARES)) for u in table)


def check_tree(parents: dict[str, str]) -> None:
    """Every parent exists (or is root) and no bank is its own ancestor."""
    for name, parent in parents.items():
        if parent != ROOT_BANK and parent not in parents:
            raise SharingError(f"banks.{name}.parent: {parent!r} is not a bank")
        seen = {name}
        while parent != ROOT_BANK:
            if parent in seen:
                raise SharingError(f"banks.{name}.parent: its chain of parents loops at {parent!r}")
            seen.add(parent)
            parent = parents[parent]


def _weights(table: dict[str, Any]) -> Weights:
    names = {f.name for f in fields(Weights)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise SharingError(f"priority: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    values: dict[str, float] = {}
    for name in names & set(table):
        value = table[name]
        if name in ("max_age", "half_life", "interval", "fairshare_interval"):
            value = seconds(value, f"priority.{name}")
            if value <= 0:
                raise SharingError(f"priority.{name}: must be positive")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e12:
            raise SharingError(f"priority.{name}: must be a number in 0..1e12, got {value!r}")
        values[name] = float(value)
    return Weights(**values)
