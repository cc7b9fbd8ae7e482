"""Attempts (protocol.md §2.9, §3.9.2–3.9.3): judging each ended task of a job with a workflow state, retries
with backoff, requeues after disruptions or by request, and success policies.

Execution hands every result of such a job to `judge` before counting it. A result that ends its task for good
is counted as usual; one that does not (a retry, a requeue) is recorded in the `attempts` table together with its
`retry`/`requeue` event, and the task is queued again once that is durable, so attempt k+1 never starts before
attempt k is on disk. A plain job is judged as a whole when its last task ended (`before_finish`).
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import signal
from collections.abc import Callable
from typing import Any

from broker.flow import retry
from broker.durable import store
from broker.flow.state import Flow
from broker.durable.journal import Statement
from broker.job import Job, State
from broker.taskmap import TaskMap
from broker.flow.jobtable import JobTable
from minicluster.model.idset import IdSet

log = logging.getLogger(__name__)

DISRUPTIONS = ("node-lost", "broker-restart")
# The reason and outcome of a requeue by a planned stop of the instance (broker/stop.py).
PLANNED_STOP = "shutdown"


def outcome_of(reason: str) -> str:
    """The `attempts.outcome` of a requeue: the disruption's name, `shutdown` for a planned stop (broker/stop.py),
    or `requeue` for a request."""
    return reason if reason in (*DISRUPTIONS, PLANNED_STOP) else "requeue"


class _Pending:
    """What one batch of results decided for one job: attempt rows and the tasks to queue again."""

    __slots__ = ("rows", "retry", "requeue")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.retry: list[tuple[int, float]] = []          # (task, delay)
        self.requeue: dict[str, list[int]] = {}           # reason -> tasks


class Attempts:
    def __init__(self, manager: JobTable, element_final: Callable[[Job, int, bool], None],
                 queue_blocked: Callable[[Job], bool], tick: Callable[[float], None]) -> None:
        """`element_final`: an array element of a watched job ended for good (ok or not); `queue_blocked`:
        whether a job may not be queued now (held); `tick`: called after the timer fired (begin times)."""
        self.manager = manager
        self.element_final = element_final
        self.queue_blocked = queue_blocked
        self.tick = tick
        self._batch: dict[int, tuple[Job, _Pending]] = {}
        self._timers: list[tuple[float, int, int, int]] = []   # (due, job, task or -1, attempt)
        self._timer: asyncio.TimerHandle | None = None
        # Jobs broker/recovery.py settles when the reattach window closes: until then nothing of theirs is
        # queued here (it re-queues what is left), and retry delays wait in `window_delays`.
        self.recovering_ids: set[int] = set()
        self.window_delays: dict[int, list[tuple[int, float]]] = {}

    # --- judging results -----------------------------------------------------------------------------------

    def judge(self, job: Job, task: int, rank: int, result: list[Any], attempt: int) -> tuple[int, bool] | None:
        """The status to count and whether the task counts as cancelled; None when the attempt is not final."""
        flow: Flow = job.flow
        status = result[2]
        if job.ending:
            # Killed because the job ends (cancel, failure policy, success met): not judged.
            return (0 if flow.succeeded_early else status), True
        if job.is_array:
            return self._judge_element(job, flow, task, rank, result, attempt)
        if flow.cut:
            return 0, True
        spec = job.spec
        assert spec is not None, "a job being judged is active"
        if flow.requeue is not None or (flow.policy is None and spec.success_task is None):
            return status, False
        action = flow.policy.action(status, result[3], result[4]) if flow.policy else (
            retry.SUCCESS if status == 0 else retry.FAIL)
        flow.actions.append(action)
        if task == spec.success_task:
            flow.decider = (action, status)
            flow.cut = True
            flow.end = ("cut", "", None)
        return _counted(action, status), False

    def _judge_element(self, job: Job, flow: Flow, task: int, rank: int, result: list[Any],
                       attempt: int) -> tuple[int, bool] | None:
        status, exit_code, sig, error = result[2], result[3], result[4], result[5]
        reason = flow.requeue_tasks.pop(task, None)
        if reason is None and error in DISRUPTIONS and flow.policy is not None:
            reason = error
        if reason is not None:
            self._not_final(job, task, rank, result, attempt, outcome_of(reason), 0.0).requeue.setdefault(
                reason, []).append(task)
            return None
        action = flow.policy.action(status, exit_code, sig) if flow.policy else (
            retry.SUCCESS if status == 0 else retry.FAIL)
        fails_job = False
        if flow.policy is not None:
            decision = retry.decide(flow.policy, action, flow.retried.get(task, 0), job.retries)
            if decision.outcome == retry.RETRIED:
                flow.retried[task] = flow.retried.get(task, 0) + 1
                job.count_retry()
                self._not_final(job, task, rank, result, attempt, "retry", decision.delay).retry.append(
                    (task, decision.delay))
                return None
            fails_job = decision.outcome == retry.FAILED_JOB
        counted = _counted(action, status)
        self._element_ended(job, flow, task, result, counted, fails_job)
        return counted, False

    def _element_ended(self, job: Job, flow: Flow, task: int, result: list[Any], counted: int,
                       fails_job: bool) -> None:
        """An element's final result, counting `counted`: the job-level end it may decide (a fail-job rule, too
        many indexes failed for good, the success policy met), and the arrays waiting on its index learn it."""
        if fails_job:
            # The job ends with the status of the exit the rule matched (protocol.md §3.6).
            flow.end = flow.end or ("failure-policy", f"index {job.index_of(task)}: {_exit_text(result)} "
                                                      "matches a fail-job rule", counted)
        if counted:
            flow.failed_for_good += 1
            flow.end_past_max_failed()
        elif flow.success is not None and flow.success.succeeded(job.index_of(task)):
            flow.end = flow.end or ("success", _success_note(job), 0)
        if flow.corr_watch:
            self.element_final(job, task, counted == 0)

    def _not_final(self, job: Job, task: int, rank: int, result: list[Any], attempt: int, outcome: str,
                   delay: float) -> _Pending:
        """Record an attempt that ends without ending its task: the next attempt's number is set now."""
        not_before = self.manager.clock() + delay if delay else None
        job.flow.attempts[task] = attempt + 1
        pending = self._pending(job)
        pending.rows.append((job.id, task, attempt, job.index_of(task), rank, *result[2:8], outcome, not_before))
        return pending

    def _pending(self, job: Job) -> _Pending:
        entry = self._batch.get(job.id)
        if entry is None:
            entry = self._batch[job.id] = (job, _Pending())
        return entry[1]

    def commit(self) -> None:
        """Post the retry/requeue events of the results judged since the last commit, with their attempt rows;
        the tasks are queued again once that is durable (after their `done-ack`)."""
        batch, self._batch = self._batch, {}
        for job, pending in batch.values():
            rows = [store.attempt_recorded(row) for row in pending.rows]
            last = None
            if pending.retry:
                delays = [delay for _, delay in pending.retry]
                last = self.manager.post(job, "retry", {"indexes": _idset(job, [t for t, _ in pending.retry]),
                                                        "delay": min(delays)}, extra=rows, durable=True)
                rows = []
            for reason, tasks in pending.requeue.items():
                last = self.manager.post(job, "requeue", {"indexes": _idset(job, tasks), "reason": reason},
                                         extra=rows, durable=True)
                rows = []
            assert last is not None
            last.add_done_callback(functools.partial(self._requeued, job, pending))
            self._resolve_waiters(job, last)

    def _requeued(self, job: Job, pending: _Pending, durable: asyncio.Future[None]) -> None:
        if durable.exception() is not None:
            return
        now_tasks = [task for tasks in pending.requeue.values() for task in tasks]
        now_tasks += [task for task, delay in pending.retry if delay <= 0]
        self.queue_tasks(job, now_tasks)
        for task, delay in pending.retry:
            if delay > 0:
                self.delay_retry(job, task, job.flow.attempts.get(task, 0), delay)

    def _resolve_waiters(self, job: Job, durable: asyncio.Future[None]) -> None:
        flow = job.flow
        if flow.waiters and ((job.is_array and not flow.requeue_tasks) or not job.is_array):
            waiters, flow.waiters = flow.waiters, []
            for waiter in waiters:
                durable.add_done_callback(functools.partial(_wake, waiter))

    # --- a job's consequences ------------------------------------------------------------------------------

    def after_results(self, job: Job) -> None:
        """Act on what judging decided for the job as a whole (before the broker checks whether it finished)."""
        flow = job.flow
        if flow.end is None or job.ending:
            return
        kind, note, status = flow.end
        flow.end = None
        if kind == "cut":
            if job.running:
                self.manager.tasks.kill_job(job, signal.SIGTERM)
        elif kind == "success":
            self.succeed(job, note)
        else:
            self.manager.raise_exception(job, kind, note, status=status)

    def succeed(self, job: Job, note: str) -> None:
        """The success policy was met: `success` cancels what is left, the job ends with status 0 (broker/job.py)."""
        # Before the post: its effects end the tasks still running, whose results are then not judged.
        job.flow.succeeded_early = True
        self.manager.post(job, "success", {"note": note})

    def before_finish(self, job: Job) -> bool:
        """A plain job's last task ended: True when its attempt runs again instead of finishing."""
        flow = job.flow
        if job.is_array or job.ending:
            return False
        if flow.requeue is not None:
            self.requeue_plain(job, flow.requeue)
            return True
        if flow.decider is None and flow.policy is None:
            return False
        action = flow.decider[0] if flow.decider is not None else retry.strongest(flow.actions)
        decision = retry.decide(flow.policy or retry.Policy(), action, job.retries, job.retries)
        if decision.outcome == retry.RETRIED:
            self._retry_plain(job, decision.delay)
            return True
        if flow.decider is not None:
            job.status = _counted(action, flow.decider[1])
        if decision.outcome == retry.FAILED_JOB:
            self.manager.raise_exception(job, "failure-policy", f"{_plain_note(job)}: a fail-job rule matched",
                                         status=job.status or 1)
            return True
        return False

    def _retry_plain(self, job: Job, delay: float) -> None:
        flow = job.flow
        status = job.status
        job.count_retry()
        moved = self._next_attempt(job, "retry", delay)
        self.manager.post(job, "retry", {"attempt": flow.attempt, "status": status, "delay": delay}, extra=moved)
        if delay > 0:
            self.delay_retry(job, -1, flow.attempt, delay)
        else:
            self.queue_plain(job)

    def requeue_plain(self, job: Job, reason: str) -> None:
        """Back to the queue after a disruption or a request; does not count as a retry."""
        flow = job.flow
        flow.requeue = None
        moved = self._next_attempt(job, outcome_of(reason), 0.0)
        durable = self.manager.post(job, "requeue", {"attempt": flow.attempt, "reason": reason}, extra=moved,
                                    durable=True)
        assert durable is not None
        self._resolve_waiters(job, durable)
        self.queue_plain(job)

    def _next_attempt(self, job: Job, outcome: str, delay: float) -> list[Statement]:
        """Statements moving the attempt's results from `tasks` to `attempts`; resets the job's counters."""
        flow = job.flow
        attempt = flow.attempt
        flow.attempt += 1
        flow.actions, flow.decider, flow.cut = [], None, False
        job.new_attempt()
        not_before = self.manager.clock() + delay if delay else None
        return store.attempt_moved(job.id, attempt, outcome, not_before)

    def absorbs(self, job: Job, kind: str, note: str) -> bool:
        """An exception about to end a plain job with a failure policy: a disruption requeues the attempt, an
        abort (a task failed, or called abort) is judged as the attempt's failure. True when handled."""
        flow = job.flow
        if job.is_array or flow.policy is None or kind not in (*DISRUPTIONS, "abort"):
            return False
        if flow.cut or flow.requeue is not None:
            return True  # the attempt is decided already; this is one of its consequences
        self.manager.post(job, "exception", {"type": kind, "severity": 1, "note": note})
        if kind == "abort":
            flow.actions.append(retry.RETRY)
            flow.cut = True
        else:
            flow.requeue = flow.requeue or kind
        if job.running:
            self.manager.tasks.kill_job(job, signal.SIGTERM)
        elif flow.requeue is not None and job.state == State.RUN:
            self.requeue_plain(job, flow.requeue)
        return True

    # --- queueing again ------------------------------------------------------------------------------------

    def queue_plain(self, job: Job) -> None:
        if job.id in self.recovering_ids:
            return
        if not self.queue_blocked(job) and job.state == State.SCHED and not job.ending:
            self.manager.enqueue(job, self.manager.request(job))

    def queue_tasks(self, job: Job, tasks: list[int]) -> None:
        """Queue array elements (task ordinals) again, numbered after the job's last element."""
        if not tasks or job.ending or job.state == State.INACTIVE or job.id in self.recovering_ids:
            return
        if job.pending_map is None:
            job.pending_map = TaskMap([range(job.total_tasks)])
        first = len(job.pending_map)
        job.pending_map.extend(tasks)
        if self.queue_blocked(job):
            return
        if not self.manager.scheduler.extend(job.id, len(tasks)):
            self.manager.enqueue(job, self.manager.request(job), count=len(tasks), first=first)

    def delay_retry(self, job: Job, task: int, attempt: int, delay: float) -> None:
        due = self.manager.clock() + delay
        if job.id in self.recovering_ids:
            self.window_delays.setdefault(job.id, []).append((task, due))
            return
        job.flow.delayed += 1
        heapq.heappush(self._timers, (due, job.id, task, attempt))
        self.arm()

    def arm(self, extra: float | None = None) -> None:
        """(Re)set the one timer to the earliest retry due, or `extra` (a begin time) if earlier."""
        due = self._timers[0][0] if self._timers else None
        if extra is not None and (due is None or extra < due):
            due = extra
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, due - self.manager.clock()), self.on_timer)

    def on_timer(self) -> None:
        self._timer = None
        now = self.manager.clock()
        ready: dict[int, list[int]] = {}
        while self._timers and self._timers[0][0] <= now:
            _, job_id, task, attempt = heapq.heappop(self._timers)
            job = self.manager.jobs.get(job_id)
            if job is None or job.flow is None:
                continue
            job.flow.delayed -= 1
            if job.ending or job.flow.attempt_of(task, job.is_array) != attempt:
                continue
            ready.setdefault(job_id, []).append(task)
        for job_id, tasks in ready.items():
            job = self.manager.jobs[job_id]
            if job.is_array:
                self.queue_tasks(job, tasks)
            else:
                self.queue_plain(job)
        self.tick(now)

    def due_times(self) -> list[tuple[float, int, int, int]]:
        return self._timers


def _counted(action: str, status: int) -> int:
    """The status a task's end counts with: 0 for success or an ignored failure, else its own (at least 1)."""
    if action in (retry.SUCCESS, retry.IGNORE):
        return 0
    return status or 1


def _exit_text(result: list[Any]) -> str:
    status, exit_code, sig = result[2], result[3], result[4]
    if sig is not None:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit {exit_code if exit_code is not None else status}"


def _plain_note(job: Job) -> str:
    return f"attempt {job.flow.attempt}"


def _wake(waiter: asyncio.Future[None], _durable: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _success_note(job: Job) -> str:
    spec = job.spec
    assert spec is not None, "a job meeting its success condition is active"
    parts = []
    if spec.success_indexes:
        parts.append(f"success_indexes {spec.success_indexes}")
    if spec.success_count:
        parts.append(f"success_count {spec.success_count}")
    return " and ".join(parts) + " met"


def _idset(job: Job, tasks: list[int]) -> str:
    return str(IdSet.from_ints(job.index_of(t) for t in tasks))
