"""How the rank-0 components see one another: the protocols each takes in its constructor (issue 27 item 1), so
that none needs another's class, and a unit test can build each alone (tests/unit/test_core_parts.py)."""
from __future__ import annotations

from typing import Any, Protocol

from broker import sched
from broker.durable.journal import Statement
from broker.job import Job
from minicluster.model.jobspec import Jobspec


class Tasks(Protocol):
    """What the job manager asks of the tasks it does not run itself (broker/execution.py)."""

    def kill_job(self, job: Job, sig: int) -> None:
        """End the job's running tasks with `sig`."""

    def job_finished(self, job: Job) -> None:
        """Nothing of the job runs any more."""

    def retime(self, job: Job) -> None:
        """A running job's time limit changed."""

    def running_tasks(self, job: Job) -> list[int]:
        """The task numbers of the job that run now."""

    def recall_ahead(self, job: Job) -> None:
        """Take back the job's elements sent ahead and not started (protocol.md §2.10)."""

    def ahead_rank(self, job: Job) -> int | None:
        """The rank a single job was sent ahead to, while it has neither started nor come back."""


class SharingPolicy(Protocol):
    """Queues, banks, priorities and accounting as the job manager sees them (broker/share/service.py)."""

    def resolve(self, uid: int, spec: Jobspec) -> Jobspec: ...

    def admit(self, uid: int, spec: Jobspec, request: sched.Request, count: int) -> None: ...

    def bucket_fields(self, uid: int, spec: Jobspec) -> dict[str, Any]: ...

    def describe(self, job: Job) -> dict[str, Any]: ...

    def finished(self, job: Job) -> list[Statement]: ...
