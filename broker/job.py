"""A job's in-memory record and its state machine (protocol.md §3.6–3.7, states as in Flux RFC 21). Pure: no I/O.

`Job.apply(event)` is the one place an event changes a job, for an event being posted (broker/jobmanager.py)
and for one replayed from the journal after a restart (broker/recovery.py) alike. It returns the event's effects
as data: what the job manager must do next (end tasks, post the next event, tell the workflow...). A live post
carries them out; a replay drops them, as flux-core's restart replays its eventlogs without their actions: what
they did happened before the crash, or the restart settlement decides it anew (docs/architecture.md#restart).

Records are slotted objects with counters, not dicts: an inactive job drops its jobspec and keeps only what
`mc jobs` shows, so a retained job costs well under 2 KB (docs/performance.md).
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

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


class EventName(enum.StrEnum):
    """Every event a job's log may hold (protocol.md §3.7): `Job.apply` refuses any other name."""
    SUBMIT = "submit"
    DEPENDENCY_ADD = "dependency-add"
    DEPENDENCY_REMOVE = "dependency-remove"
    HOLD = "hold"
    RELEASE = "release"  # a hold lifted (with `uid`), or the resources free (without)
    DEPEND = "depend"
    PRIORITY = "priority"
    ALLOC = "alloc"
    START = "start"
    RETRY = "retry"
    REQUEUE = "requeue"
    UPDATE = "update"
    SUCCESS = "success"
    EXCEPTION = "exception"
    OUTPUT_TRUNCATED = "output-truncated"
    FINISH = "finish"
    CLEAN = "clean"


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


class Event(NamedTuple):
    """One entry of a job's eventlog (protocol.md §3.6): its `seq`-th event, posted at wall-clock time `ts`.

    A tuple, not a frozen dataclass: a plain job posts about eight, and a tuple is built in a third of the time."""
    name: str
    context: Mapping[str, Any] = MappingProxyType({})
    seq: int = 0
    ts: float = 0.0


class Effect(enum.StrEnum):
    """What an applied event asks of the job manager, which carries it out (broker/jobmanager.py).

    A str enum: hashed and compared in C, where a plain Enum's hash is Python code (the live path posts ~8 events
    per plain job)."""
    UNQUEUE = "take the job's pending work out of the scheduler's queue"
    KILL_TASKS = "end the job's running tasks: SIGTERM, then SIGKILL after the kill grace"
    POST_FINISH = "nothing of the job runs: post its `finish`"
    POST_RELEASE = "post `release`: its resources are free (its allocation went back as its tasks ended)"
    TASKS_OVER = "tell execution the job is over (its stdin relay closes)"
    POST_CLEAN = "post `clean` with the job's final row: the last step"
    STARTED = "tell the workflow the job started (`afterstart` dependants)"
    ENDED = "tell the workflow the job ended (its dependants are judged)"
    CLOSE = "once the event is durable: the job is inactive for everyone (followers, purge)"
    WAKE_SCHEDULER = "resources or queue positions may have freed up"


class Job:
    __slots__ = (
        "id", "uid", "gid", "name", "state", "urgency", "ntasks", "nnodes", "t_submit", "t_run", "t_inactive",
        "status", "exception", "seq", "spec", "array", "pending_map", "next_element",
        "running", "succeeded", "failed", "cancelled", "ranks", "deadline", "output_bytes", "oseq",
        "truncated", "tasks_left", "done_bits", "closed", "ranks_text",
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
        self.tasks_left = len(self.array) if self.array is not None else spec.ntasks
        # One bit per task that ended, made when the first one does (a queued 10^8-element array costs nothing):
        # results re-sent after a restart are recognised and counted once.
        self.done_bits: bytearray | None = None
        # The status the job ends with, set by the event that decided its end (a severity-0 `exception`, or
        # `success`): the cause's, not that of the tasks it killed (protocol.md §3.6). See `ending`.
        self.cause_status: int | None = None
        # (status, note) of the first task that failed; it ends the job if the job fails as a gang.
        self.first_failure: tuple[int, str] | None = None
        # Set once the tasks used PMI (the broker saw a barrier): an MPI job, whose tasks fail together.
        self.pmi_used = False
        # Why the job failed, in one line: a task that could not start, or the note of the ending exception.
        self.reason: str | None = None
        # INACTIVE on disk: the `clean` event is durable. `state` runs ahead of the disk, followers must not.
        self.closed = False
        # Workflow state (broker/flow/state.py) of a job that has dependencies, a policy, a hold or retries.
        self.flow: Any = None
        # Retries made (protocol.md §3.9.2; all indexes of an array together), kept once inactive.
        self.retries = 0
        # Sharing: the queue and bank (set at submit, broker/share/service.py), and the job's accounting:
        # running sums while active (broker/share/accounting.py Acct), its UsageRecord once finished.
        self.queue = spec.queue
        self.project = spec.project
        self.acct: Any = None

    @property
    def ending(self) -> bool:
        """An event decided the job's end (an exception, or its success policy met): no more tasks start, those
        still running are being ended. Derived from `cause_status`, which only that event sets."""
        return self.cause_status is not None

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
        if not 0 <= task < self.total_tasks or self.state is State.INACTIVE:
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

    def count_retry(self, times: int = 1) -> None:
        """Count retries made (protocol.md §3.9.2): one decided now, or those a restart finds in the attempts."""
        self.retries += times

    def cancel_never_run(self, tasks: Iterable[int]) -> None:
        """Tasks that can never run (an aftercorr counterpart failed): each not yet ended counts as cancelled, and
        the job can no longer succeed."""
        for task in tasks:
            if self.mark_done(task):
                self.tasks_left -= 1
                self.cancelled += 1
        self.status = max(self.status or 0, 1)

    def count_as_success(self) -> None:
        """A result counted as failed that the job's policy ignores (a restart judges it again, flow/recovery.py)."""
        self.failed -= 1
        self.succeeded += 1

    def task_started(self, rank: int) -> None:
        """A task of the job runs on `rank` now (sent there, or started there ahead)."""
        self.running += 1
        self.ranks.add(rank)

    def task_stopped(self) -> None:
        """A running task ended with a result that is not the task's own (a workflow's attempt, a second run)."""
        self.running -= 1

    def truncate_output(self, cap: int) -> None:
        """The output reached the cap: it counts as full, and nothing more of it is kept."""
        self.output_bytes = cap
        self.truncated = True

    def next_output(self, nbytes: int) -> int:
        """A chunk of `nbytes` of output is kept: counted; returns its sequence number."""
        self.output_bytes += nbytes
        self.oseq += 1
        return self.oseq - 1

    def restore_output(self, next_oseq: int, kept: int, cap: int) -> None:
        """After a restart, output goes on from the next sequence number and counts what was already kept
        against the cap (all of it once the output was truncated)."""
        self.oseq = next_oseq
        self.output_bytes = cap if self.truncated else kept

    def retire(self) -> None:
        """Drop what only an active job needs, keeping the record `mc jobs` shows."""
        self.spec = None
        self.done_bits = None
        self.pending_map = None
        self.flow = None
        if self.ranks:  # else it was restored from the journal (restore_counts), or the job never ran
            self.ranks_text = str(IdSet.from_ints(self.ranks))
        self.ranks = set()

    # --- the state machine ----------------------------------------------------------------------------------

    def restore_row(self, state: State, t_run: float | None, t_inactive: float | None, status: int | None,
                    exception: str | None, seq: int, counts: list[Any] | None, retries: int = 0) -> None:
        """Take what the journal's row of the job holds (broker/history.py). An inactive job is as it ended and
        is retired at once; an active one's row only says where its event log ended: reset_for_replay, then
        its events, make it again."""
        self.state = state
        self.t_run, self.t_inactive, self.status, self.exception, self.seq = t_run, t_inactive, status, exception, seq
        self.retries = retries
        if state == State.INACTIVE:
            if counts is not None:
                self.restore_counts(counts)
            self.tasks_left = 0
            self.closed = True
            self.retire()

    def reset_for_replay(self) -> None:
        """Back to NEW before the job's whole event log is applied again after a restart (broker/recovery.py):
        its row's state is where the log ended, and the log's first event, `submit`, is allowed only in NEW."""
        self.state = State.NEW

    def apply(self, event: Event) -> tuple[Effect, ...]:
        """Take `event`: move the state (RFC 21), record what the event carries, return its effects in order.

        Raises TransitionError, leaving the job alone, when the event is not allowed in the current state or is
        not an event at all (EventName)."""
        name = event.name
        if name not in _EVENT_NAMES:
            raise TransitionError(f"job {self.id}: no such event {name!r}")
        rule = TRANSITIONS.get(name)
        if rule is None and self.array is None:
            rule = PLAIN_TRANSITIONS.get(name)
        if rule is not None:
            allowed, target = rule
            if self.state not in allowed:
                raise TransitionError(f"job {self.id}: event {name} not allowed in state {self.state.value}")
            self.state = target
        self.seq = event.seq + 1
        take = _TAKE.get(name)
        return take(self, event) if take is not None else ()

    def _started(self, event: Event) -> tuple[Effect, ...]:
        self.t_run = event.ts  # an array starts once; a plain job once per attempt: the current one's
        return (Effect.STARTED,)

    def _exception(self, event: Event) -> tuple[Effect, ...]:
        ctx = event.context
        if ctx.get("severity") != 0:
            return ()  # a warning: the job goes on
        self.exception = ctx.get("type")
        self.cause_status = ctx.get("status", 1)
        self.reason = ctx.get("note") or self.reason
        return self._ending()

    def _success(self, event: Event) -> tuple[Effect, ...]:
        self.status = self.cause_status = 0
        return self._ending()

    def _ending(self) -> tuple[Effect, ...]:
        """The end is decided: nothing more starts; what runs is ended, or the job finishes now."""
        return (Effect.UNQUEUE, Effect.KILL_TASKS if self.running else Effect.POST_FINISH)

    def _truncated(self, event: Event) -> tuple[Effect, ...]:
        self.truncated = True
        return ()

    def _finished(self, event: Event) -> tuple[Effect, ...]:
        ctx = event.context
        counts = ctx.get("counts") or {}
        self.status = ctx.get("status", self.status)
        self.succeeded, self.failed = counts.get("succeeded", 0), counts.get("failed", 0)
        self.cancelled = counts.get("cancelled", 0)
        self.tasks_left = 0
        # UNQUEUE too: an array can end with an element still queued for a task that a run rank 0 had taken back
        # recorded after all (protocol.md §2.10).
        return (Effect.UNQUEUE, Effect.POST_RELEASE, Effect.TASKS_OVER, Effect.POST_CLEAN)

    def _cleaned(self, event: Event) -> tuple[Effect, ...]:
        self.retire()
        return (Effect.ENDED, Effect.CLOSE, Effect.WAKE_SCHEDULER)

    def outcome(self) -> dict[str, Any]:
        """The `finish` event's context: the status the job ends with and its counts, the tasks an ending event
        left unstarted or unreported counted as cancelled."""
        status = self.cause_status if self.cause_status is not None else self.status or 0
        left = self.tasks_left if self.ending else 0
        return {"status": status, "counts": {"succeeded": self.succeeded, "failed": self.failed,
                                             "cancelled": self.cancelled + left}}

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
        """The journal's `counts` column: the counts, the reason, then the ranks the job ran on, so that `mc jobs`
        shows them after a restart (rows written before the reason have three items, before the ranks four)."""
        return [self.succeeded, self.failed, self.cancelled, self.reason,
                self.ranks_text or str(IdSet.from_ints(self.ranks))]

    def restore_counts(self, wire: list[Any]) -> None:
        self.succeeded, self.failed, self.cancelled = wire[:3]
        self.reason = wire[3] if len(wire) > 3 else None
        self.ranks_text = wire[4] if len(wire) > 4 else ""


# What each event records on the job, and its effects; the events not listed only move the state (or not even).
# A frozenset of the values: `in` on it is a hash lookup of the plain str, cheaper than the enum's own check.
_EVENT_NAMES = frozenset(EventName)
_TAKE: dict[str, Callable[[Job, Event], tuple[Effect, ...]]] = {
    "start": Job._started,
    "exception": Job._exception,
    "success": Job._success,
    "output-truncated": Job._truncated,
    "finish": Job._finished,
    "clean": Job._cleaned,
}
