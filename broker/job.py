"""A job's in-memory record and its state machine (protocol.md §3.6–3.7, states as in Flux RFC 21). No I/O.

Records are slotted objects with counters, not dicts: an inactive job drops its jobspec and keeps only what
`mc jobs` shows, so a retained job costs well under 2 KB (docs/performance.md).
"""
from __future__ import annotations

import enum
from typing import Any

from broker.taskmap import TaskMap
from minicluster.model.idset import IdSet
from minicluster.model.jobspec import Jobspec


class State(enum.Enum):
    NEW = "NEW"
    DEPEND = "DEPEND"
    PRIORITY = "PRIORITY"
    SCHED = "SCHED"
    RUN = "RUN"
    CLEANUP = "CLEANUP"
    INACTIVE = "INACTIVE"


# Which state each event leads to; events not listed leave the state alone.
TRANSITIONS: dict[str, tuple[set[State], State]] = {
    "submit": ({State.NEW}, State.DEPEND),
    "depend": ({State.DEPEND}, State.PRIORITY),
    "priority": ({State.PRIORITY}, State.SCHED),
    "alloc": ({State.SCHED}, State.RUN),
    # A job can also end while it waits for a dependency (exception `dependency`, a cancel).
    "finish": ({State.RUN, State.SCHED, State.DEPEND, State.PRIORITY}, State.CLEANUP),
    "clean": ({State.CLEANUP, State.SCHED}, State.INACTIVE),
}
# A plain job whose attempt is retried or requeued goes back to the queue (protocol.md §3.9.2); an array
# stays in RUN while some of its indexes run again.
PLAIN_TRANSITIONS: dict[str, tuple[set[State], State]] = {
    "retry": ({State.RUN}, State.SCHED),
    "requeue": ({State.RUN}, State.SCHED),
}


class TransitionError(RuntimeError):
    pass


class Job:
    __slots__ = (
        "id", "uid", "gid", "name", "state", "urgency", "ntasks", "nnodes", "t_submit", "t_run", "t_inactive",
        "status", "exception", "seq", "spec", "array", "pending_map", "next_element",
        "running", "succeeded", "failed", "cancelled", "ranks", "deadline", "output_bytes", "oseq",
        "truncated", "ending", "tasks_left", "done_bits", "closed", "ranks_text",
        "cause_status", "first_failure", "pmi_used", "reason", "flow", "retries", "queue", "project", "acct",
    )

    def __init__(self, job_id: int, uid: int, spec: Jobspec, t_submit: float, gid: int = -1) -> None:
        self.id = job_id
        self.uid = uid
        self.gid = gid
        self.name = spec.name
        self.state = State.NEW
        self.urgency = spec.urgency
        self.ntasks = spec.ntasks
        self.nnodes = spec.nnodes
        self.t_submit = t_submit
        self.t_run: float | None = None
        self.t_inactive: float | None = None
        self.status: int | None = None
        self.exception: str | None = None
        self.seq = 0
        self.spec: Jobspec | None = spec
        self.array: IdSet | None = spec.array_ids
        # Element ordinals still to run, when not simply next_element.. (after a restart some already ran).
        self.pending_map: TaskMap | None = None
        self.next_element = 0
        self.running = 0
        self.succeeded = 0
        self.failed = 0
        self.cancelled = 0
        self.ranks: set[int] = set()
        # An inactive job keeps its ranks as compact text instead of a set.
        self.ranks_text = ""
        self.deadline: float | None = None
        self.output_bytes = 0
        self.oseq = 0
        self.truncated = False
        # Set once an exception ended the job: no more tasks start, the rest are being killed.
        self.ending = False
        self.tasks_left = len(self.array) if self.array is not None else spec.ntasks
        # One bit per task: results re-sent after a restart are recognised and counted once.
        # One bit per task that ended, made when the first one does (a queued 10^8-element array costs nothing);
        # retire() leaves it empty: no longer counted.
        self.done_bits: bytearray | None = None
        # The status the job ends with when an exception ends it (protocol.md §3.6): its cause's.
        self.cause_status: int | None = None
        # (status, note) of the first task that failed; it ends the job if the job fails as a gang.
        self.first_failure: tuple[int, str] | None = None
        # Set once the tasks used PMI (the broker saw a barrier): an MPI job, whose tasks fail together.
        self.pmi_used = False
        # Why the job failed, in one line: a task that could not start, or the note of the ending exception.
        self.reason: str | None = None
        # True once the `clean` event is durable; `state` runs ahead of the disk, followers must not.
        self.closed = False
        # Workflow state (broker/flowstate.py) of a job that has dependencies, a policy, a hold or retries.
        self.flow: Any = None
        # Retries made (protocol.md §3.9.2; all indexes of an array together), kept once inactive.
        self.retries = 0
        # Sharing: the queue and bank (set at submit, broker/share/service.py), and the job's accounting:
        # running sums while active (broker/share/accounting.py Acct), its UsageRecord once finished.
        self.queue = spec.queue
        self.project = spec.project
        self.acct: Any = None

    @property
    def is_array(self) -> bool:
        return self.array is not None

    @property
    def total_tasks(self) -> int:
        return len(self.array) if self.array is not None else self.ntasks

    def index_of(self, task: int) -> int:
        """Array index of task (element ordinal) `task`; plain jobs use the task rank."""
        return self.array[task] if self.array is not None else task

    def mark_done(self, task: int) -> bool:
        """Record that `task` ended; False when it is out of range or already recorded."""
        if not 0 <= task < self.total_tasks or (self.done_bits is not None and not self.done_bits):
            return False
        if self.done_bits is None:
            self.done_bits = bytearray((self.total_tasks + 7) // 8)
        byte, bit = divmod(task, 8)
        if self.done_bits[byte] & (1 << bit):
            return False
        self.done_bits[byte] |= 1 << bit
        return True

    def is_done(self, task: int) -> bool:
        if not self.done_bits:
            return False
        byte, bit = divmod(task, 8)
        return bool(self.done_bits[byte] & (1 << bit))

    def record_result(self, status: int, was_running: bool, cancelled: bool = False) -> None:
        self.status = status if self.status is None else max(self.status, status)
        if cancelled:
            self.cancelled += 1
        elif status == 0:
            self.succeeded += 1
        elif self.exception == "cancel":
            self.cancelled += 1
        else:
            self.failed += 1
        if was_running:
            self.running -= 1
        self.tasks_left -= 1

    def failure_note(self, task: int, rank: int, status: int, error: str | None) -> str:
        """`task 3 on rank 1 exited with status 2`, or with the reason it could not run instead."""
        who = f"task {task}" if self.array is None else f"index {self.index_of(task)}"
        if error:
            return f"{who} on rank {rank}: {error}"
        return f"{who} on rank {rank} exited with status {status}"

    def new_attempt(self) -> None:
        """Reset what one run of a plain job counts, before it runs again (a retry or a requeue)."""
        self.tasks_left = self.ntasks
        self.done_bits = None
        self.succeeded = self.failed = self.cancelled = 0
        self.status = None
        self.first_failure = None
        self.reason = None
        self.ranks = set()

    def retire(self) -> None:
        """Drop what only an active job needs, keeping the record `mc jobs` shows."""
        self.spec = None
        self.done_bits = bytearray()
        self.pending_map = None
        self.flow = None
        self.ranks_text = str(IdSet.from_ints(self.ranks))
        self.ranks = set()

    def apply(self, event: str) -> None:
        rule = TRANSITIONS.get(event)
        if rule is None:
            rule = PLAIN_TRANSITIONS.get(event) if self.array is None else None
            if rule is None:
                return
        allowed, target = rule
        if self.state not in allowed:
            raise TransitionError(f"job {self.id}: event {event} not allowed in state {self.state.value}")
        self.state = target

    def pending(self) -> int:
        return max(self.tasks_left - self.running, 0) if self.state in (State.SCHED, State.RUN) else 0

    def summary(self, est_start: float | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "uid": self.uid, "state": self.state.value,
            "urgency": self.urgency, "t_submit": self.t_submit, "t_run": self.t_run,
            "t_inactive": self.t_inactive, "ntasks": self.total_tasks, "nnodes": self.nnodes,
            "ranks": self.ranks_text or str(IdSet.from_ints(self.ranks)), "status": self.status,
            "exception": self.exception,
            "array": str(self.array) if self.array is not None else None, "reason": self.reason,
            "counts": {
                "pending": self.pending(), "running": self.running, "succeeded": self.succeeded,
                "failed": self.failed, "cancelled": self.cancelled,
            },
            "est_start": est_start, "queue": self.queue, "project": self.project,
        }

    def counts_wire(self) -> list[Any]:
        """The journal's `counts` column: the counts, then the reason (rows written before it have three)."""
        return [self.succeeded, self.failed, self.cancelled, self.reason]

    def restore_counts(self, wire: list[Any]) -> None:
        self.succeeded, self.failed, self.cancelled = wire[:3]
        self.reason = wire[3] if len(wire) > 3 else None
