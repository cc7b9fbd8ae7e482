"""The jobspec (protocol.md §3.4): parsing from the wire and validation with clear messages. No I/O."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from minicluster.model import outputpath, restree, workflow
from minicluster.model.idset import IdSet, IdSetError
from minicluster.model.jobterms import INT_RANGES, MPI_MODES
from minicluster.model.jobterms import InvalidJobspec as InvalidJobspec  # where callers have always found it
from minicluster.model.sharing import valid_name
from minicluster.model.text import brief, control_character

MAX_ARGV_BYTES = 1 << 20
MAX_ENV_BYTES = 1 << 20
MAX_MESSAGE = 400


@dataclass(frozen=True, slots=True)
class Jobspec:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    ntasks: int = 1
    nnodes: int = 0
    tasks_per_node: int = 0
    cores_per_task: int = 1
    gpus_per_task: int = 0
    mem_per_task: int = 0
    exclusive: bool = False
    requires: tuple[str, ...] = ()
    time_limit: float | None = None
    name: str = ""
    urgency: int = 16
    output: str | None = None
    array: str | None = None
    policy: str | None = None
    mpi: str | None = None
    stdin: str | None = None
    # A resource tree (restree: canonical list form) replaces the shape fields above.
    resources: list[dict[str, Any]] | None = None
    locality: str | None = None
    spread: str | None = None
    gpu_affinity: bool = False
    # Workflow fields (protocol.md §3.9), stored and sent only when set.
    dependencies: tuple[workflow.Dependency, ...] = ()
    begin_time: float | None = None
    hold: bool = False
    retries: int | None = None
    retry_delay: float = 0.0
    max_retries_per_index: int | None = None
    max_failed_indexes: int | None = None
    on_exit: tuple[workflow.Rule, ...] = ()
    on_signal: tuple[workflow.Rule, ...] = ()
    success_indexes: str | None = None
    success_count: int | None = None
    success_task: int | None = None
    # Sharing: the queue (nil: the instance's default queue) and the bank charged (nil: the user's default).
    queue: str | None = None
    project: str | None = None
    # The tasks' file mode creation mask (nil: the worker's own), sent only when set.
    umask: int | None = None

    @property
    def stdin_tasks(self) -> list[int]:
        """The task ranks whose standard input the client feeds (protocol.md §3.8)."""
        if self.stdin is None:
            return []
        if self.stdin == "all":
            return list(range(self.ntasks))
        return list(IdSet.parse(self.stdin))

    @property
    def array_ids(self) -> IdSet | None:
        return IdSet.parse(self.array) if self.array else None

    def shape(self) -> restree.Shape:
        """The resource request as the chain the matcher works with (valid after from_wire)."""
        if self.resources is not None:
            return restree.shape_of(restree.from_wire(self.resources))
        return restree.shape_from_options(
            self.ntasks, self.nnodes, self.tasks_per_node, self.cores_per_task,
            self.gpus_per_task, self.mem_per_task, self.exclusive, self.locality, self.spread,
            self.gpu_affinity)

    @property
    def plain_shape(self) -> bool:
        """No tree and no topology options: the flat fields say everything."""
        return (self.resources is None and self.locality is None and self.spread is None
                and not self.gpu_affinity)

    @property
    def uses_pmi(self) -> bool:
        return self.pmi_mode is not None

    @property
    def pmi_mode(self) -> str | None:
        """The PMI the workers serve: "pmi1", "pmix" or "auto"; None for none."""
        if self.mpi is None:
            return "pmi1" if self.ntasks > 1 else None
        return None if self.mpi == "none" else self.mpi

    def to_wire(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, and the broker calls this once per submitted job.
        d = {name: getattr(self, name) for name in _FIELD_NAMES}
        d["argv"] = list(self.argv)
        d["requires"] = list(self.requires)
        for name, default in _WORKFLOW_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        if self.dependencies:
            d["dependencies"] = [dep.to_wire() for dep in self.dependencies]
        if self.umask is None:
            del d["umask"]
        for name in ("on_exit", "on_signal"):
            if name in d:
                d[name] = [list(rule) for rule in d[name]]
        return d

    @property
    def failure_policy(self) -> bool:
        """True when the job has a failure policy (protocol.md §3.9.2): disruptions requeue it."""
        return (self.retries is not None or self.max_retries_per_index is not None or bool(self.on_exit)
                or bool(self.on_signal))

    @property
    def workflow(self) -> bool:
        """True when any workflow field is set."""
        return any(getattr(self, name) != default for name, default in _WORKFLOW_DEFAULTS.items())


_FIELD_NAMES = tuple(Jobspec.__dataclass_fields__)
_WORKFLOW_DEFAULTS = {
    name: Jobspec.__dataclass_fields__[name].default
    for name in _FIELD_NAMES[_FIELD_NAMES.index("dependencies"):_FIELD_NAMES.index("success_task") + 1]
}

# Integer fields: (least, most). Counts are bounded as a resource tree's are (restree.MAX_COUNT), memory (MiB)
# at 2^40; urgency's own range is checked with the message users know (0..31).
# urgency's upper end is checked with the others' consistency, for its own message.
_INT_FIELDS = {name: (INT_RANGES[name][0], (1 << 63) - 1 if name == "urgency" else INT_RANGES[name][1])
               for name in ("ntasks", "nnodes", "tasks_per_node", "cores_per_task", "gpus_per_task",
                            "mem_per_task", "urgency")}


def from_wire(data: Any) -> Jobspec:
    """Build a Jobspec from a client's map, raising InvalidJobspec on the first problem.

    The message may quote the client's values; it is cut at MAX_MESSAGE characters, whatever a rule quoted.
    """
    try:
        return _parse(data)
    except InvalidJobspec as exc:
        message = str(exc)
        if len(message) <= MAX_MESSAGE:
            raise
        raise InvalidJobspec(f"{message[:MAX_MESSAGE]}… (message cut)") from None


def _parse(data: Any) -> Jobspec:
    if not isinstance(data, dict):
        raise InvalidJobspec("jobspec must be a map")
    known = set(Jobspec.__dataclass_fields__)
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        shown = ", ".join(brief(k, 30) for k in unknown[:5])
        raise InvalidJobspec(f"unknown jobspec field(s): {shown}{' …' if len(unknown) > 5 else ''}")
    argv = data.get("argv")
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidJobspec("argv: must be a non-empty list of strings")
    if not argv[0]:
        raise InvalidJobspec("argv: the command name is empty")
    if sum(len(a) for a in argv) > MAX_ARGV_BYTES:
        raise InvalidJobspec(f"argv: longer than {MAX_ARGV_BYTES} bytes")
    nul = next((i for i, a in enumerate(argv) if "\0" in a), None)
    if nul is not None:
        raise InvalidJobspec(f"argv: argument {nul} ({brief(argv[nul])}) contains a NUL byte")
    values: dict[str, Any] = {"argv": tuple(argv)}
    for name, (least, most) in _INT_FIELDS.items():
        if name in data:
            values[name] = _int(data, name, least, most)
    values.update(_optional_fields(data))
    if data.get("umask") is not None:
        values["umask"] = _int(data, "umask", *INT_RANGES["umask"])
    values.update(_tree_fields(data))
    try:
        values.update(_workflow_fields(data))
    except workflow.WorkflowError as exc:
        raise InvalidJobspec(str(exc)) from None
    spec = Jobspec(**values)
    _check_consistency(spec)
    try:
        _check_workflow(spec)
    except workflow.WorkflowError as exc:
        raise InvalidJobspec(str(exc)) from None
    if not spec.name:
        spec = replace(spec, name=os.path.basename(spec.argv[0])[:64])
    return spec


def _optional_fields(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidJobspec("env: must be a map of strings to strings")
    _check_env(env)
    out["env"] = env
    for name in ("cwd", "output", "array", "policy", "mpi", "stdin"):
        value = data.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidJobspec(f"{name}: must be a non-empty string or absent")
        out[name] = value
    for name in ("queue", "project"):
        value = data.get(name)
        if value is not None and (not valid_name(value)):
            shown = brief(value) if isinstance(value, str) else repr(value)  # brief() quotes: once only
            raise InvalidJobspec(f"{name}: {shown} is not a {name} name (letters, digits, '_', '.', '-'; "
                                 "at most 64)")
        out[name] = value
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 128:
        raise InvalidJobspec("name: must be a string of at most 128 characters")
    control = control_character(name)
    if control is not None:
        raise InvalidJobspec(f"name: {brief(name)} contains the control character {control}; a name is shown on "
                             "terminals and may hold no NUL, newline, escape or other control character")
    out["name"] = name
    if "exclusive" in data:
        if not isinstance(data["exclusive"], bool):
            raise InvalidJobspec("exclusive: must be true or false")
        out["exclusive"] = data["exclusive"]
    requires = data.get("requires", [])
    if not isinstance(requires, (list, tuple)) or not all(isinstance(r, str) and r for r in requires):
        raise InvalidJobspec("requires: must be a list of constraints like zone=a or gpu=h100|a100")
    out["requires"] = tuple(requires)
    limit = data.get("time_limit")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < workflow.MAX_SECONDS:
            raise InvalidJobspec(f"time_limit: must be a number of seconds above 0 and below "
                                 f"{workflow.MAX_SECONDS:.0f}, got {brief(repr(limit))}")
        out["time_limit"] = float(limit)
    return out


# Shape fields and their defaults: a resource tree replaces them all.
_SHAPE_FIELDS = {"nnodes": 0, "tasks_per_node": 0, "cores_per_task": 1, "gpus_per_task": 0,
                 "mem_per_task": 0, "exclusive": False, "locality": None, "spread": None,
                 "gpu_affinity": False}


def _tree_fields(data: dict[str, Any]) -> dict[str, Any]:
    """resources (a tree; fixes ntasks), locality, spread, gpu_affinity."""
    out: dict[str, Any] = {}
    for name in ("locality", "spread"):
        value = data.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidJobspec(f"{name}: must be a topology level name such as rack or zone")
            try:
                restree.check_level_name(value, name)
            except ValueError as exc:
                raise InvalidJobspec(str(exc)) from None
            out[name] = value
    if "gpu_affinity" in data:
        if not isinstance(data["gpu_affinity"], bool):
            raise InvalidJobspec("gpu_affinity: must be true or false")
        out["gpu_affinity"] = data["gpu_affinity"]
    if data.get("resources") is None:
        return out
    given = [n for n, default in _SHAPE_FIELDS.items() if data.get(n, default) != default]
    if given:
        raise InvalidJobspec(f"resources: a resource tree replaces {', '.join(given)}; give one"
                             " or the other")
    try:
        vertices = restree.from_wire(data["resources"])
        shape = restree.shape_of(vertices)
    except restree.TreeError as exc:
        raise InvalidJobspec(str(exc)) from None
    if "ntasks" in data and data["ntasks"] != shape.total_slots:
        raise InvalidJobspec(f"ntasks: the resource tree has {shape.total_slots} task slots,"
                             f" ntasks says {data['ntasks']} (leave ntasks out)")
    out["resources"] = restree.to_wire(vertices)
    out["ntasks"] = shape.total_slots
    return out


def _workflow_fields(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data.get("dependencies") is not None:
        out["dependencies"] = workflow.dependencies_from_wire(data["dependencies"])
    begin = data.get("begin_time")
    if begin is not None:
        if isinstance(begin, bool) or not isinstance(begin, (int, float)) or not 0 <= begin < workflow.MAX_SECONDS:
            raise workflow.WorkflowError(f"begin_time: must be seconds since the epoch from 0 to "
                                         f"{workflow.MAX_SECONDS:.0f} (5138-11-16), got {brief(repr(begin))}")
        out["begin_time"] = float(begin)
    hold = data.get("hold", False)
    if not isinstance(hold, bool):
        raise workflow.WorkflowError("hold: must be true or false")
    out["hold"] = hold
    for name in ("retries", "max_retries_per_index", "max_failed_indexes", "success_count", "success_task"):
        out[name] = workflow.optional_int(data, name, *INT_RANGES[name])
    out["retry_delay"] = workflow.optional_seconds(data, "retry_delay", workflow.MAX_RETRY_DELAY) or 0.0
    out["on_exit"] = workflow.rules_from_wire("on_exit", data.get("on_exit") or [], 255)
    out["on_signal"] = workflow.rules_from_wire("on_signal", data.get("on_signal") or [], workflow.MAX_SIGNAL)
    indexes = data.get("success_indexes")
    if indexes is not None and (not isinstance(indexes, str) or not indexes):
        raise workflow.WorkflowError("success_indexes: must be an idset such as 0 or 0-9")
    out["success_indexes"] = indexes
    return out


def _check_workflow(spec: Jobspec) -> None:
    """Rules between workflow fields and the job's shape (protocol.md §3.9)."""
    array = spec.array_ids
    for name in ("max_retries_per_index", "max_failed_indexes", "success_count"):
        if getattr(spec, name) is not None and array is None:
            raise workflow.WorkflowError(f"{name}: only for arrays (--cc)")
    if any(dep.type == "aftercorr" for dep in spec.dependencies) and array is None:
        raise workflow.WorkflowError("dependencies: aftercorr is only for arrays (--cc)")
    indexes = workflow.success_indexes(spec.success_indexes, array)
    if array is not None and spec.success_count is not None:
        pool = len(indexes) if indexes is not None else len(array)
        if spec.success_count > pool:
            raise workflow.WorkflowError(f"success_count: {spec.success_count} is more than the {pool} indexes "
                                         "that could succeed")
    if spec.success_task is not None:
        if array is not None or spec.ntasks < 2:
            raise workflow.WorkflowError("success_task: only for jobs of several tasks (-n 2 or more)")
        if spec.success_task >= spec.ntasks:
            raise workflow.WorkflowError(f"success_task: {spec.success_task} is not a task of 0..{spec.ntasks - 1}")
    retries_given = spec.retries is not None or spec.max_retries_per_index is not None
    if not retries_given and any(action == "retry" for _, action in spec.on_exit + spec.on_signal):
        raise workflow.WorkflowError("on_exit/on_signal: a retry rule needs retries or max_retries_per_index")
    if not retries_given and spec.retry_delay:
        raise workflow.WorkflowError("retry_delay: needs retries or max_retries_per_index")


def _check_consistency(spec: Jobspec) -> None:
    if spec.urgency > 31:
        raise InvalidJobspec(f"urgency: must be 0..31, got {spec.urgency}")
    if spec.nnodes and spec.ntasks < spec.nnodes:
        raise InvalidJobspec(f"ntasks: {spec.ntasks} tasks cannot cover {spec.nnodes} nodes")
    if spec.tasks_per_node and spec.nnodes and spec.tasks_per_node * spec.nnodes != spec.ntasks:
        raise InvalidJobspec("tasks_per_node: nnodes x tasks_per_node must equal ntasks")
    if spec.tasks_per_node and spec.ntasks % spec.tasks_per_node:
        raise InvalidJobspec(f"tasks_per_node: ntasks={spec.ntasks} is not a multiple of tasks_per_node="
                             f"{spec.tasks_per_node} (give -n as a multiple of --tasks-per-node)")
    if spec.mpi is not None and spec.mpi not in MPI_MODES:
        raise InvalidJobspec(f"mpi: must be one of {', '.join(MPI_MODES)}, got {brief(spec.mpi)}")
    if spec.array is not None:
        try:
            ids = IdSet.parse(spec.array)
        except IdSetError as exc:
            raise InvalidJobspec(f"array: {exc}") from None
        if not len(ids):
            raise InvalidJobspec("array: the idset is empty")
        if spec.ntasks != 1 or spec.nnodes > 1:
            raise InvalidJobspec("array: each array element is one task; drop -n/-N")
        if spec.resources is not None and spec.ntasks != 1:
            raise InvalidJobspec("array: each array element is one task; the resource tree"
                                 f" has {spec.ntasks} slots")
    if spec.stdin is not None:
        _check_stdin(spec)
    if spec.cwd is not None:
        _check_cwd(spec.cwd)
    if spec.output is not None:
        try:
            outputpath.check(spec.output)
        except outputpath.TemplateError as exc:
            raise InvalidJobspec(f"output: {exc}") from None
    if not spec.plain_shape:
        try:
            spec.shape()
        except restree.TreeError as exc:
            raise InvalidJobspec(str(exc)) from None


def _check_env(env: dict[str, str]) -> None:
    """Names and values execve can carry: a name is not empty and has no `=`, nothing has a NUL byte."""
    size = 0
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise InvalidJobspec(f"env: {brief(key)} is not a variable name (empty, or has '=' or a"
                                 " NUL byte)")
        if "\0" in value:
            raise InvalidJobspec(f"env: the value of {brief(key)} contains a NUL byte")
        size += len(key) + len(value) + 2
    if size > MAX_ENV_BYTES:
        raise InvalidJobspec(f"env: longer than {MAX_ENV_BYTES} bytes")


def _check_cwd(cwd: str) -> None:
    if not cwd.startswith("/"):
        raise InvalidJobspec(f"cwd: must be an absolute path, got {brief(cwd)}")
    if "\0" in cwd:
        raise InvalidJobspec(f"cwd: {brief(cwd)} contains a NUL byte")
    if len(cwd.encode(errors="surrogatepass")) > outputpath.MAX_PATH_BYTES:
        raise InvalidJobspec(f"cwd: longer than {outputpath.MAX_PATH_BYTES} bytes")


def _check_stdin(spec: Jobspec) -> None:
    if spec.array is not None:
        raise InvalidJobspec("stdin: array elements read /dev/null; drop stdin or --cc")
    if spec.stdin == "all":
        return
    try:
        tasks = IdSet.parse(spec.stdin or "")
    except IdSetError as exc:
        raise InvalidJobspec(f"stdin: {exc}; use task ranks (0, 0-3) or all") from None
    beyond = [t for t in tasks if t >= spec.ntasks]
    if beyond:
        raise InvalidJobspec(f"stdin: task {beyond[0]} does not exist, the job has {spec.ntasks} task(s)")


def _int(data: dict[str, Any], name: str, least: int, most: int) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobspec(f"{name}: must be an integer, got {brief(repr(value))}")
    if value < least:
        raise InvalidJobspec(f"{name}: must be >= {least}, got {value}")
    if value > most:
        raise InvalidJobspec(f"{name}: must be <= {most}, got {value}")
    return value

