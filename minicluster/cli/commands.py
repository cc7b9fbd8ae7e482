"""The table of `mc`'s commands (minicluster/cli/main.py dispatches by it, completion.py completes from it) and
how to load one: each command's module is imported only when it runs."""
from __future__ import annotations

import importlib
from collections.abc import Callable

# name -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("minicluster.cli.submit", "run", "run a job in the foreground, streaming its output"),
    "submit": ("minicluster.cli.submit", "submit", "submit a job, print its id (same as mc-submit)"),
    "bulksubmit": ("minicluster.cli.bulk", "main", "submit one job per line of a file or stdin"),
    "jobs": ("minicluster.cli.jobs", "main", "list jobs (-a: with inactive ones; --json)"),
    "cancel": ("minicluster.cli.jobs", "cancel", "cancel jobs"),
    "hold": ("minicluster.cli.flow", "hold", "keep pending jobs from starting"),
    "release": ("minicluster.cli.flow", "release", "let held jobs start"),
    "requeue": ("minicluster.cli.flow", "requeue", "stop running jobs and queue them again"),
    "update": ("minicluster.cli.flow", "update", "change a job's urgency, time limit or name"),
    "attach": ("minicluster.cli.logs", "attach", "replay and follow a job's output and events"),
    "logs": ("minicluster.cli.logs", "logs", "print a job's output (--follow, --index)"),
    "eventlog": ("minicluster.cli.logs", "eventlog", "print a job's event log"),
    "resources": ("minicluster.cli.instance", "resources", "show nodes and their free resources"),
    "status": ("minicluster.cli.instance", "status", "show the instance: ranks, states, queue"),
    "drain": ("minicluster.cli.instance", "drain", "stop scheduling on ranks"),
    "undrain": ("minicluster.cli.instance", "undrain", "schedule on drained ranks again"),
    "shutdown": ("minicluster.cli.instance", "shutdown", "stop the instance"),
    "start": ("minicluster.cli.launcher", "main", "start a local instance and run a command in it"),
    "broker": ("minicluster.cli.boot", "broker_main", "run the rank-0 broker (used by pods and mc start)"),
    "worker": ("minicluster.cli.boot", "worker_main", "run a worker rank (used by pods and mc start)"),
    "boot": ("minicluster.cli.boot", "boot_main", "run this pod's rank: broker or worker"),
    "operator": ("minicluster.cli.main", "operator", "run the Kubernetes operator"),
    "top": ("minicluster.cli.top", "main", "live view: queue by state, tasks/s, ranks and their health, busiest jobs"),
    "completion": ("minicluster.cli.completion", "completion", "print the shell completion script (bash, zsh)"),
    "queue": ("minicluster.cli.queues", "main", "queues: list, status, start|stop|enable|disable"),
    "bank": ("minicluster.cli.banks", "main", "banks (projects) and fair share: list, add, remove"),
    "usage": ("minicluster.cli.usage", "usage", "core-, GPU- and wall-hours per user and bank"),
    "job": ("minicluster.cli.usage", "job", "about one job: eff ID (CPU and memory efficiency)"),
    "report": ("minicluster.cli.report", "main", "write an HTML report of jobs, a workflow or a time span"),
    "runtime": ("minicluster.cli.runtime", "main", "the injected runtime: install DEST (init container), info"),
}


def resolve(name: str) -> Callable[[list[str]], int]:
    module_name, func_name, _help = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OSError(f"`mc {name}` is unavailable here: {exc}") from None
    return getattr(module, func_name)
