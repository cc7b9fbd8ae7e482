"""Workflow parts of a jobspec (protocol.md §3.4, §3.9): dependencies, failure and success policies, holds.

Validation of the wire form; the command-line forms (`afterok:12:13`, `42=fail-job,3-5=retry`, `KILL=retry`,
`+10m`) are parsed in workflowforms.py, and re-exported here. Pure: no I/O; the clock is an argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minicluster.model.idset import IdSet
from minicluster.model.jobterms import MAX_RETRIES as MAX_RETRIES
# The command-line forms live in workflowforms.py (light, for mc-submit); they are workflow's API too.
from minicluster.model.workflowforms import ACTIONS as ACTIONS
from minicluster.model.workflowforms import DEP_ALIASES as DEP_ALIASES
from minicluster.model.workflowforms import DEP_TYPES as DEP_TYPES
from minicluster.model.workflowforms import MAX_RETRY_DELAY as MAX_RETRY_DELAY
from minicluster.model.workflowforms import MAX_SECONDS as MAX_SECONDS
from minicluster.model.workflowforms import MAX_SIGNAL as MAX_SIGNAL
from minicluster.model.workflowforms import WorkflowError as WorkflowError
from minicluster.model.workflowforms import idset_of, last_id
from minicluster.model.workflowforms import parse_begin_time as parse_begin_time
from minicluster.model.workflowforms import parse_dependencies as parse_dependencies
from minicluster.model.workflowforms import parse_duration as parse_duration
from minicluster.model.workflowforms import parse_exit_rules as parse_exit_rules
from minicluster.model.workflowforms import parse_signal_rules as parse_signal_rules

MAX_DEPENDENCY_JOBS = 100_000


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
        if last_id(idset_of(name, codes)) > top:
            raise WorkflowError(f"{name}: {codes} goes beyond {top}")
        out.append((codes, action))
    return tuple(out)


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
    ids = idset_of("success_indexes", value)
    missing = [i for i in ids if i not in array]
    if missing:
        raise WorkflowError(f"success_indexes: {IdSet.from_ints(missing[:1000])} not in the array {array}")
    return ids
