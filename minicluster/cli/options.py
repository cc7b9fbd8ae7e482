"""Job-shape options shared by mc-submit, mc run and mc bulksubmit, and the jobspec they build.

The options are tables (JOB_OPTIONS, WORKFLOW_OPTIONS): argparse is built from them (add_job_options), and
mc-submit's plain calls are parsed from the same tables without importing argparse (quickparse.py).
"""
from __future__ import annotations

import os
import time

from minicluster import runtime
from minicluster.cli.quickparse import add_options, option
from minicluster.client import own_umask
from minicluster.model import workflowforms as forms
from minicluster.model.idset import IdSet, IdSetError
from minicluster.model.jobterms import INT_RANGES, MPI_MODES, POLICIES, InvalidJobspec
from minicluster.model.text import brief, cut

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from minicluster.cli.quickparse import Option, Parsed

# argparse, re and the jobspec model are imported where they are used, not here: `mc-submit true`,
# run from shell loops, needs none of them (tests/unit/test_client_imports.py).

_MEM_UNITS = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def _type_error(message: str) -> Exception:
    """argparse.ArgumentTypeError(message): argparse's one-line message for a bad option value."""
    import argparse

    return argparse.ArgumentTypeError(message)


# The largest integer the wire carries (msgpack's signed 64 bits): no option may ask for more.
MAX_WIRE_INT = (1 << 63) - 1


def int_at_least(minimum: int, what: str = "an integer", maximum: int = MAX_WIRE_INT) -> Callable[[str], int]:
    """An argparse type: an integer from `minimum` to `maximum`, with a one-line message otherwise."""
    def parse(text: str) -> int:
        # ASCII digits and a leading '-' only: int() would also take ' 5\n', '+5', '1_000' and '٣'.
        digits = text[1:] if text.startswith("-") else text
        if not forms.decimal_digits(digits):
            raise _type_error(f"{brief(text)} is not {what} (digits 0-9)")
        value = int(text[:24])  # more digits than that are out of any range; int() refuses some 4300
        if not minimum <= value <= maximum:
            bound = f"of at least {minimum}" if value < minimum and maximum == MAX_WIRE_INT else \
                f"from {minimum} to {maximum}"
            raise _type_error(f"must be {what} {bound}, got {cut(text, 40)}")
        return value
    return parse


# Options whose 0 would mean "not given" in the jobspec: on the command line they start at 1.
_AT_LEAST_ONE = frozenset({"nnodes", "tasks_per_node"})


def field_int(field: str, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type for the jobspec's integer `field`: its range (jobterms.INT_RANGES)."""
    least, most = INT_RANGES[field]
    return int_at_least(max(least, 1) if field in _AT_LEAST_ONE else least, what, most)

positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
urgency = field_int("urgency", "an urgency")


def umask(text: str) -> int:
    """A file mode creation mask in octal (`077`, `0o022`), as the shell's umask takes it."""
    digits = text[2:] if text[:2] in ("0o", "0O") else text
    if not digits or len(digits) > 4 or any(c not in "01234567" for c in digits) or int(digits, 8) > 0o777:
        raise _type_error(f"must be an octal umask from 000 to 777, got {cut(text, 40)}")
    return int(digits, 8)


def time_limit(text: str) -> float:
    """Seconds from a Slurm time (`30` minutes, `5:00`, `1:00:00`, `2-12`, `1-0:30:00`) or `90s`/`10m`/`2h`/`1d`."""
    text = text.strip()
    seconds = _unit_time(text)
    if seconds is None:
        seconds = _slurm_time(text)
    if not 0 < seconds < forms.MAX_SECONDS:
        raise _type_error(f"time limit must be above 0 and below {forms.MAX_SECONDS:.0f} seconds (3168 years), "
                          f"got {text!r}")
    return seconds


def _unit_time(text: str) -> float | None:
    """`90s`, `1.5h`: a number, then one of s, m, h, d (a workflow duration with its unit); None for anything else."""
    if text[-1:] not in ("s", "m", "h", "d"):
        return None
    try:
        return forms.parse_duration(text)
    except forms.WorkflowError:
        return None


def _slurm_time(text: str) -> float:
    days_text, dash, clock = text.rpartition("-") if "-" in text else ("", "", text)
    parts = clock.split(":")
    digits = forms.decimal_digits
    if not all(digits(p) for p in parts) or (dash and not digits(days_text)) or len(parts) > 3:
        raise _type_error(
            f"bad time limit {text!r}: use minutes (30), MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or 90s/10m/2h/1d")
    values = [int(p) for p in parts]
    if dash:
        # Slurm: after days, the fields are hours[:minutes[:seconds]].
        hours, minutes, seconds = [*values, 0, 0][:3]
        return int(days_text) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(values) == 1:
        return values[0] * 60.0
    if len(values) == 2:
        return values[0] * 60.0 + values[1]
    return values[0] * 3600.0 + values[1] * 60 + values[2]


def memory_mb(text: str) -> int:
    """MiB from `512`, `512M`, `4G`, `1T` (a `B` may follow: `4GB`)."""
    number = text.strip()
    if number.endswith(("b", "B")):
        number = number[:-1]
    unit = number[-1:].lower() if number[-1:] in tuple("mMgGtT") else ""
    if unit:
        number = number[:-1]
    # By hand, not with re: importing re (with enum, functools and collections) would cost each mc-submit call in a
    # shell loop as much as the rest of its imports.
    if not forms.decimal_digits(number):
        raise _type_error(f"bad memory size {text!r}: use MiB (512) or 512M, 4G, 1T")
    mib, most = int(number) * _MEM_UNITS[unit], INT_RANGES["mem_per_task"][1]
    if mib > most:
        raise _type_error(f"memory size {text!r} is more than the largest, {most // (1024 * 1024)}T")
    return mib


def idset(text: str) -> str:
    try:
        IdSet.parse(text)
        return text
    except IdSetError as exc:
        raise _type_error(str(exc)) from None


def stdin_tasks(text: str) -> str:
    """`-i/--input`: `none`, `all` or an idset of task ranks."""
    if text in ("none", "all"):
        return text
    return idset(text)


def parse_job_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """parse_args, but a long option's value may start with `-` (`--env -FOO` drops FOO, as documented).

    argparse would take `-FOO` for an option. Only the options before the command are looked at: what follows
    belongs to the command untouched.
    """
    valued = {opt for action in parser._actions if action.nargs != 0 for opt in action.option_strings}
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-"):
            out.extend(argv[i:])
            break
        if arg in valued and i + 1 < len(argv):
            value = argv[i + 1]
            out.extend([f"{arg}={value}"] if arg.startswith("--") and value.startswith("-") else [arg, value])
            i += 2
            continue
        out.append(arg)
        i += 1
    return parser.parse_args(out)


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a workflow parser: its error becomes a one-line usage error."""
    def check(text: str) -> Any:
        try:
            parse(text)
        except forms.WorkflowError as exc:
            raise _type_error(str(exc)) from None
        return text
    return check


def retry_delay(text: str) -> float:
    try:
        seconds = forms.parse_duration(text)
    except forms.WorkflowError as exc:
        raise _type_error(str(exc)) from None
    if seconds > forms.MAX_RETRY_DELAY:
        raise _type_error(f"must be at most {forms.MAX_RETRY_DELAY:.0f} seconds (1d), got {text!r}")
    return seconds


# The one definition of the job options: add_job_options gives them to argparse, quickparse reads them directly.
JOB_SHAPE_OPTIONS: tuple[Option, ...] = (
    option("-N", "--nodes", type=field_int("nnodes", "a number of nodes"), metavar="N", help="number of nodes"),
    option("-n", "--ntasks", type=field_int("ntasks", "a number of tasks"), metavar="N",
           help="number of tasks (default: nodes x tasks-per-node, else nodes, else 1)"),
    option("-c", "--cores-per-task", type=field_int("cores_per_task", "a number of cores"), default=1, metavar="N"),
    option("-g", "--gpus-per-task", type=field_int("gpus_per_task", "a number of GPUs"), default=0, metavar="N"),
    option("--mem", type=memory_mb, default=0, metavar="MB", help="memory per task (512, 4G)"),
    option("--tasks-per-node", type=field_int("tasks_per_node", "a number of tasks"), default=0, metavar="K"),
    option("--exclusive", action="store_true", help="allocate whole nodes"),
    option("-t", "--time-limit", type=time_limit, metavar="TIME",
           help="30 (minutes), 5:00, 1:00:00, 2-0, or 90s/10m/2h/1d"),
    option("--requires", action="append", default=[], metavar="CONSTRAINT",
           help="node property: zone=a, gpu=h100|a100, ssd (repeatable)"),
    option("--policy", choices=POLICIES, help="node match policy for this job"),
    option("--resources", metavar="TREE",
           help="a resource tree instead of -N/-n/-c/-g/--mem/--exclusive, e.g."
                " 'rack[1]>node[4]>slot[8]>core[2]' or 'node[2]>socket[1]>{core[8],gpu[1]}'"
                " (quote it; :x marks a vertex exclusive)"),
    option("--locality", metavar="LEVEL",
           help="all nodes of the job under one vertex of this topology level (rack, zone)"),
    option("--spread", metavar="LEVEL",
           help="each node (with -N), else each task, under its own vertex of this level"),
    option("--gpu-affinity", action="store_true",
           help="each task's GPUs and memory on the socket of its cores"),
    option("--cc", type=idset, metavar="IDSET",
           help="array job: one task per index; {cc} in the command becomes the index"),
    option("-q", "--queue", metavar="QUEUE", help="queue to submit to (default: the instance's default)"),
    option("--project", metavar="BANK", help="bank to charge (default: your default bank)"),
)
JOB_ENVIRONMENT_OPTIONS: tuple[Option, ...] = (
    option("--name", help="job name (default: the command's basename)"),
    option("--urgency", type=urgency, default=16, metavar="0-31", help="higher runs first"),
    option("--env", action="append", default=[], metavar="K=V",
           help="set K=V, copy K from here, or -K to drop it (repeatable)"),
    option("--env-clear", action="store_true", help="do not send this environment"),
    option("--cwd", metavar="DIR", help="working directory (default: the current one)"),
    option("--umask", type=umask, metavar="OCTAL",
           help="the tasks' umask, their --output file's mode is 666 less it (default: this shell's)"),
    option("--output", metavar="FILE",
           help="output file on the node ({id}, {task}, {index}); default: stream to mc"),
    option("--mpi", choices=MPI_MODES,
           help="PMI to serve: pmi1 (MPICH), pmix (Open MPI), auto (from the program's libraries), none "
                "(default when ntasks > 1: what the program links, else the instance's mpi_default, pmi1)"),
)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """Options describing one job's shape and environment (not the command itself)."""
    add_options(parser.add_argument_group("job shape"), JOB_SHAPE_OPTIONS)
    add_options(parser.add_argument_group("job environment"), JOB_ENVIRONMENT_OPTIONS)
    add_workflow_options(parser)


WORKFLOW_OPTIONS: tuple[Option, ...] = (
    option("-d", "--dependency", action="append", default=[], metavar="TYPE:ID[:ID...]",
           type=_checked(lambda t: forms.parse_dependencies([t])),
           help="wait for jobs: afterok, afterany, afternotok, afterstart (after), aftercorr (array "
                "index by index), or singleton; comma-separated or repeated"),
    option("--begin-time", metavar="TIME", type=_checked(lambda t: forms.parse_begin_time(t, 0.0)),
           help="not before TIME: +10m, 12:30, 2025-01-31T12:00, @EPOCH"),
    option("--hold", action="store_true", help="submit held; `mc release ID` lets it run"),
    option("--retries", type=field_int("retries", "a number of retries"), metavar="N",
           help="run a failed job again up to N times (arrays: N retries for all indexes together)"),
    option("--retry-delay", type=retry_delay, metavar="TIME",
           help="wait TIME (90s, 10m) before the first retry, doubling for each next one"),
    option("--on-exit", action="append", default=[], metavar="CODES=ACTION,...",
           type=_checked(forms.parse_exit_rules),
           help="by exit code, first match wins: 42=fail-job,3-5=retry,2=fail,0=ignore"),
    option("--on-signal", action="append", default=[], metavar="SIGNALS=ACTION,...",
           type=_checked(forms.parse_signal_rules),
           help="by signal: KILL=retry,SEGV+ABRT=fail"),
    option("--max-retries-per-index", type=field_int("max_retries_per_index", "a number of retries"), metavar="N",
           help="arrays: retries of each index"),
    option("--max-failed-indexes", type=field_int("max_failed_indexes", "a number of indexes"), metavar="N",
           help="arrays: fail (and cancel the rest) once more than N indexes failed for good"),
    option("--success-indexes", type=idset, metavar="IDSET",
           help="arrays: succeed once these indexes succeeded; the rest is cancelled"),
    option("--success-count", type=field_int("success_count", "a number of indexes"), metavar="N",
           help="arrays: succeed once N indexes (of --success-indexes, if given) succeeded"),
    option("--success-task", type=field_int("success_task", "a task rank"), metavar="T",
           help="multi-task jobs: the job's result is task T's (a driver); the others are stopped"),
)
# Every option of JOB_* and WORKFLOW_*, for quickparse.
JOB_OPTIONS = JOB_SHAPE_OPTIONS + JOB_ENVIRONMENT_OPTIONS + WORKFLOW_OPTIONS


def add_workflow_options(parser: argparse.ArgumentParser) -> None:
    """Dependencies, failure and success policies, holds (protocol.md §3.9, docs/workflows.md)."""
    add_options(parser.add_argument_group("workflow"), WORKFLOW_OPTIONS)


def workflow_fields(args: Parsed, now: float) -> dict[str, Any]:
    """The jobspec's workflow fields from the parsed options (only those given).

    Raises InvalidJobspec with the option's problem.
    """
    out: dict[str, Any] = {}
    if args.dependency or args.begin_time or args.on_exit or args.on_signal:
        out.update(_parsed_workflow(args, now))
    if args.hold:
        out["hold"] = True
    optional = {"retries": args.retries, "retry_delay": args.retry_delay,
                "max_retries_per_index": args.max_retries_per_index, "max_failed_indexes": args.max_failed_indexes,
                "success_indexes": args.success_indexes, "success_count": args.success_count,
                "success_task": args.success_task}
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _parsed_workflow(args: Parsed, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        if args.dependency:
            out["dependencies"] = forms.parse_dependencies(args.dependency)
        if args.begin_time:
            out["begin_time"] = forms.parse_begin_time(args.begin_time, now)
        rules = [("on_exit", args.on_exit, forms.parse_exit_rules),
                 ("on_signal", args.on_signal, forms.parse_signal_rules)]
        for name, texts, parse in rules:
            if texts:
                out[name] = [rule for text in texts for rule in parse(text)]
    except forms.WorkflowError as exc:
        raise InvalidJobspec(str(exc)) from None
    return out


def add_command_argument(parser: argparse.ArgumentParser) -> None:
    import argparse

    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD ARGS...",
                        help="the command and its arguments (options after CMD belong to CMD)")


def command_of(args: Parsed) -> list[str]:
    """The command after the options, without the `--` that may separate them."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return command


def build_env(settings: Sequence[str], clear: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The task environment: the submitter's (unless `clear`), then each --env in order."""
    env = {} if clear else dict(environ)
    for item in settings:
        if item.startswith("-"):
            env.pop(item[1:], None)
        elif "=" in item:
            key, _, value = item.partition("=")
            if not key:
                raise InvalidJobspec(f"env: {item!r} has no variable name")
            env[key] = value
        elif item in environ:
            env[item] = environ[item]
        else:
            raise InvalidJobspec(f"env: {item} is not set here; use {item}=VALUE")
    return env


def jobspec_from_args(args: Parsed, command: Sequence[str],
                      environ: Mapping[str, str] | None = None,
                      cwd: str | None = None, stdin: str | None = None, check: bool = True) -> dict[str, Any]:
    """The wire jobspec (protocol.md §3.4) for `command` with the parsed job options.

    Raises InvalidJobspec with the field name when the combination is invalid; with `check=False` only for what
    the options themselves get wrong, and the rest is left to check_jobspec or the broker.
    """
    if not command:
        raise InvalidJobspec("no command given")
    # Run from the injected runtime (`kubectl exec POD -- /mnt/minicluster/bin/mc run ...`), the tasks get the
    # image's environment with the runtime's bin/ last on PATH, as the batch command does, and nothing else of it.
    environ = runtime.command_env(os.environ) if environ is None else environ
    nnodes = args.nodes or 0
    ntasks = args.ntasks or (nnodes * args.tasks_per_node) or nnodes or 1
    spec: dict[str, Any] = {
        "argv": list(command),
        "env": build_env(args.env, args.env_clear, environ),
        "cwd": os.path.abspath(args.cwd if args.cwd else (cwd or os.getcwd())),
        "ntasks": ntasks,
        "nnodes": nnodes,
        "tasks_per_node": args.tasks_per_node,
        "cores_per_task": args.cores_per_task,
        "gpus_per_task": args.gpus_per_task,
        "mem_per_task": args.mem,
        "exclusive": args.exclusive,
        "requires": list(args.requires),
        "urgency": args.urgency,
        "umask": own_umask() if args.umask is None else args.umask,  # Slurm's srun and sbatch carry theirs
    }
    optional = {"time_limit": args.time_limit, "name": args.name, "output": args.output,
                "array": args.cc, "policy": args.policy, "mpi": args.mpi, "stdin": stdin,
                "resources": args.resources, "locality": args.locality, "spread": args.spread,
                "queue": args.queue, "project": args.project}
    spec.update({k: v for k, v in optional.items() if v is not None})
    if args.gpu_affinity:
        spec["gpu_affinity"] = True
    if args.resources is not None and not args.ntasks:
        del spec["ntasks"]  # the tree says how many tasks
    spec.update(workflow_fields(args, time.time()))
    if check:
        check_jobspec(spec)
    return spec


def check_jobspec(spec: dict[str, Any]) -> None:
    """Raise InvalidJobspec, naming the field, if the broker would refuse `spec` whatever its state."""
    from minicluster.model.jobspec import from_wire

    from_wire(spec)
