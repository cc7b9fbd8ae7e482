"""How rank 0 judges a task's result (protocol.md §2.5, §2.9, §2.10): the pure half of `Execution.on_done`.

`sort` says what a result is (one to record, one a workflow judges first, or one only acknowledged, and why);
`final` says what a result that ends its task means for the job (the status it counts, cancelled or not, the
failure it reports). Both read the job and what rank 0 tracks, change nothing and do no I/O; broker/execution.py
carries their verdicts out (frees cores, records the result in the journal, acknowledges the batch) and
broker/flow/attempts.py judges a workflow's attempt in between, as it keeps the retry counts.

The rows of one `done` are judged one after another, each against the state the rows before it left: a result
can end the task that another row of the same batch started behind it (protocol.md §2.10), or repeat a row.
"""
from __future__ import annotations

import enum
from collections.abc import Container
from typing import NamedTuple

from broker.job import Job, State
from minicluster.proto.rows import Result

Key = tuple[int, int]
Cause = tuple[int, str]  # (status, note), as broker/abortcause.py names a job's failure


class Verdict(enum.Enum):
    """What a result is. All but JUDGE and FINAL are acknowledged and otherwise ignored."""
    PURGED = "purged"  # of a job gone or ended, or of a task the job does not have
    DUPLICATE = "duplicate"  # recorded already (re-sent after a restart)
    SECOND_RUN = "second-run"  # recorded already, and this rank ran it again (an entry that waited ahead of a
    #                            task recorded meanwhile, protocol.md §2.10): its cores come back
    REPLACED = "replaced"  # from a run rank 0 replaced by one on another rank (§2.10)
    STRAY = "stray"  # from a stray rank 0 killed at its rank's join (§2.10)
    STALE = "stale"  # an older attempt's straggler (§2.9)
    JUDGE = "judge"  # a workflow's attempt, for broker/flow/attempts.py to judge: final, or retried or requeued
    FINAL = "final"  # the task's result, to record


# The members by plain names, and the states read here: a lookup through the enum class costs as much as a
# call, and these run for every result.
PURGED, DUPLICATE, SECOND_RUN, REPLACED, STRAY, STALE, JUDGE, FINAL = Verdict
_INACTIVE, _SCHED = State.INACTIVE, State.SCHED


class Failure(NamedTuple):
    """A failed task the job hears of."""
    cause: Cause  # (status, `task 3 on rank 1 exited with status 2`)
    at: float  # when it ended (when rank 0 learned so, if the worker did not say)
    decides: bool  # told to the PMI exchange as a cause of the job's end; not when a success task decides it
    reason: bool  # the note becomes the job's reason: the task could not run or was ended, and none is set yet


class Final(NamedTuple):
    """What a task's result means for its job."""
    counted: int  # the status the job counts (0 for a failure its policy lets pass)
    cancelled: bool  # counted as cancelled: the job is ending, or the task was preempted
    started_ahead: bool  # a single job that started ahead before a restart: its alloc and start come first
    failure: Failure | None  # a failure that is news: not one the job's end or a cancel caused


SUCCEEDED = Final(0, False, False, None)


def sort(rank: int, result: Result, job: Job | None, running_rank: int | None, strays: Container[Key]) -> Verdict:
    """What the result from `rank` is. `job` is its job, if rank 0 has it; `running_rank` where rank 0 knows its
    task running, if it does; `strays` the tasks rank 0 killed at that rank's join (empty: none)."""
    # One function, no helpers: it runs for every result (each call costs more than its tests).
    task = result.task
    if job is None or job.state is _INACTIVE or not 0 <= task < job.total_tasks:
        return PURGED
    if job.is_done(task):
        return SECOND_RUN if running_rank == rank else DUPLICATE
    if running_rank is not None:
        if running_rank != rank:
            return REPLACED
    elif strays and (result.job, task) in strays:
        return STRAY
    flow = job.flow
    if flow is None:
        return FINAL
    if not flow.current(task, result.attempt, job.is_array):
        return STALE
    # Most elements exit 0 with nothing to judge: that path stays as cheap as a plain array's.
    return JUDGE if result.status or flow.judge_all else FINAL


def final(rank: int, result: Result, job: Job, judged: tuple[int, bool], preempted: bool, now: float) -> Final:
    """The meaning of a result that ends its task: `judged` is (status counted, cancelled) as the workflow judged
    it (the result's own status, not cancelled, without one); `preempted` whether rank 0 preempted the task."""
    counted, cancelled = judged
    cancelled = cancelled or preempted
    # Only a plain job without a workflow can have started ahead; an array element's result never did.
    started_ahead = job.array is None and job.flow is None and job.state is _SCHED
    status = result.status
    if not (status or counted or cancelled or started_ahead):
        return SUCCEEDED  # most results: nothing to build
    failure = None
    if status and not job.ending and not cancelled:  # a task a workflow rule cut short is a consequence
        spec = job.spec
        failure = Failure(
            cause=(status, job.failure_note(result.task, rank, status, result.error)),
            at=result.ended if result.ended is not None else now,
            # A success_task job is decided by its driver: another task failing does not end it.
            decides=spec is None or spec.success_task in (None, result.task),
            reason=bool(result.error) and job.reason is None)
    return Final(counted, cancelled, started_ahead, failure)
