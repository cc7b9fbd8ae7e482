"""Builders: jobspecs, job records and node resources for tests, valid by default, any field overridable.

Each goes through the real parser (jobspec.from_wire, resources.discover), so a builder can never hand a test
something the broker would refuse.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from broker.job import Job
from minicluster.model import jobspec as jobspec_model
from minicluster.model.jobspec import Jobspec
from worker.resources import NodeResources, discover


def jobspec_wire(argv: Sequence[str] = ("true",), **fields: Any) -> dict[str, Any]:
    """A jobspec map as the tools send it (protocol.md §3.4)."""
    return {"argv": list(argv), "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "cwd": "/tmp", **fields}


def jobspec(argv: Sequence[str] = ("true",), **fields: Any) -> Jobspec:
    """A validated Jobspec (InvalidJobspec if the fields are bad, as at submit)."""
    return jobspec_model.from_wire(jobspec_wire(argv, **fields))


def job(job_id: int = 1, spec: Jobspec | None = None, *, uid: int | None = None, gid: int | None = None,
        t_submit: float = 1000.0, **fields: Any) -> Job:
    """A broker job record in state NEW, of `spec` or of jobspec(**fields); the caller's uid and gid."""
    if spec is None:
        spec = jobspec(**fields)
    elif fields:
        raise TypeError("give either a spec or jobspec fields, not both")
    return Job(job_id, os.getuid() if uid is None else uid, spec, t_submit,
               os.getgid() if gid is None else gid)


def resources(override: str = "cores=2,memory=4096", properties: str = "") -> NodeResources:
    """A node's resources as a worker reports them in `join` (`resources.to_wire()`), from an override spec."""
    return discover(override, properties)
