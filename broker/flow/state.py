"""The workflow state of one active job (protocol.md §3.9): attempts, retries, holds, requeues, success.

Only jobs that need it carry one (`Job.flow`): a job with a workflow field, a hold, a requeue, or an array a
restart re-queued. Pure data and small rules; the broker acts on it (broker/flow/attempts.py, broker/flow/workflow.py).
"""
from __future__ import annotations

from typing import Any

from broker.flow.depgraph import Verdict
from broker.flow.retry import Policy, SuccessTracker
from minicluster.model.idset import IdSet
from minicluster.model.jobspec import Jobspec


class Corr:
    """An array waiting, index by index, for the indexes of another array (aftercorr)."""

    __slots__ = ("target", "released", "ready", "cancelled", "loading", "deferred")

    def __init__(self, target: int) -> None:
        self.target = target
        # Task ordinals of this job whose counterpart succeeded: they may be queued.
        self.released: set[int] = set()
        # Released while the job itself still waits in DEPEND or is held: queued when it is released.
        self.ready: list[int] = []
        # Ordinals that can never run (counterpart failed for good or never ran).
        self.cancelled: set[int] = set()
        # True while the target's past results are read from the journal; the target's end waits meanwhile.
        self.loading = False
        # The target's end, when it came while `loading`: fed to the graph once the past results are in.
        self.deferred: Verdict | None = None


class Flow:
    __slots__ = (
        "policy", "success", "attempt", "attempts", "retried", "failed_for_good", "actions",
        "decider", "cut", "requeue", "requeue_tasks", "waiters", "held", "held_from", "corr", "corr_watch",
        "delayed", "succeeded_early", "end", "judge_all",
    )

    def __init__(self, spec: Jobspec | None = None) -> None:
        self.policy = Policy.of(spec) if spec is not None and spec.failure_policy else None
        ids = spec.array_ids if spec is not None else None
        self.success: SuccessTracker | None = None
        if spec is not None and ids is not None and (spec.success_indexes or spec.success_count):
            indexes = IdSet.parse(spec.success_indexes) if spec.success_indexes else None
            self.success = SuccessTracker(indexes, spec.success_count)
        # Plain job: the attempt running (all tasks share it). Arrays: per task, sparse (absent = 0).
        self.attempt = 0
        self.attempts: dict[int, int] = {}
        # Counted retries of arrays per task (sparse); the job's total is Job.retries.
        self.retried: dict[int, int] = {}
        self.failed_for_good = 0
        # Plain job: the actions of the current attempt's tasks (protocol.md §3.9.2); `decider` is the
        # success_task's, once it ended; after `cut` (the attempt is decided), further exits are consequences.
        self.actions: list[str] = []
        self.decider: tuple[str, int] | None = None
        self.cut = False
        # Plain job: why its running attempt is to be requeued (a disruption, a request); arrays per task.
        self.requeue: str | None = None
        self.requeue_tasks: dict[int, str] = {}
        # Futures of `requeue` requests, resolved once the job's requeue event is durable (asyncio futures, typed
        # Any: this module stays free of asyncio, the no-I/O contract).
        self.waiters: list[Any] = []
        self.held = False
        # Array elements from this number on were queued when the hold came (see Workflow.hold).
        self.held_from: int | None = None
        self.corr: Corr | None = None
        # True when other arrays wait index by index for this one's results.
        self.corr_watch = False
        # Tasks (or -1 for a plain job) waiting for a retry's delay.
        self.delayed = 0
        self.succeeded_early = False
        # A job-level end decided while judging results: (exception type, "success" or "cut", note, status).
        self.end: tuple[str, str, int | None] | None = None
        # False while an array element's exit 0 needs no judging (the common case, kept cheap): no success
        # policy, no array waiting on its indexes, no requeue asked for.
        self.judge_all = ids is None or self.success is not None

    def end_past_max_failed(self) -> None:
        """End the job (unless its end is decided already) once more indexes failed for good than the failure
        policy's max_failed allows."""
        limit = self.policy.max_failed if self.policy else None
        if limit is not None and self.failed_for_good > limit:
            self.end = self.end or ("max-failed-indexes",
                                    f"{self.failed_for_good} indexes failed for good, more than {limit}", None)

    def current(self, task: int, attempt: int, is_array: bool) -> bool:
        """Whether a result of `attempt` belongs to the task's current attempt (not a stale one)."""
        return attempt == (self.attempts.get(task, 0) if is_array else self.attempt)

    def attempt_of(self, task: int, is_array: bool) -> int:
        return self.attempts.get(task, 0) if is_array else self.attempt
