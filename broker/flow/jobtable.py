"""The job manager as the workflow group sees it (broker/jobmanager.py is the one implementation): what
broker/flow/ reads and calls, so that it needs no import of the manager, which builds it."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from broker import sched
from broker.durable.journal import Journal, Statement
from broker.durable.store import JobStore
from broker.job import Job
from broker.ports import Tasks
from minicluster.model.jobspec import Jobspec


class JobTable(Protocol):
    jobs: dict[int, Job]
    scheduler: sched.Scheduler
    store: JobStore
    journal: Journal
    tasks: Tasks
    clock: Callable[[], float]
    owner_uid: int
    next_id: int

    def find(self, job_id: int) -> Job | None: ...

    def post(self, job: Job, name: str, context: dict[str, Any] | None = None,
             extra: Iterable[Statement] = (), durable: bool = False) -> asyncio.Future[None] | None: ...

    def raise_exception(self, job: Job, kind: str, note: str, severity: int = 0,
                        status: int | None = None) -> None: ...

    def maybe_finish(self, job: Job) -> None: ...

    def request(self, job: Job) -> sched.Request: ...

    def enqueue(self, job: Job, request: sched.Request, count: int | None = None, first: int = 0) -> None: ...

    def time_limit(self, spec: Jobspec) -> float: ...
