"""Carrying out the scheduler's preemptions (docs/scheduling.md, "Preemption").

The scheduler (broker/sched/preempt.py) picks the victims; here each one is ended as its queue says: its tasks get
SIGTERM and, after `kill_grace`, SIGKILL; it is then requeued (the workflow requeue, reason `preempted`, not a
retry) or cancelled, and an `exception` event of type `preempt` says by which job.  A plain job is a whole gang;
an array element goes alone (cancelled, it counts as cancelled).
"""
from __future__ import annotations

import logging
import signal
from typing import Any

from broker import sched
from broker.job import State

log = logging.getLogger(__name__)


def carry_out(manager: Any, execution: Any, sharing: Any, preemptions: list[sched.Preemption]) -> None:
    for p in preemptions:
        job = manager.jobs.get(p.job_id)
        if job is None or job.ending or job.state != State.RUN:
            continue
        by = manager.jobs.get(p.by)
        note = f"preempted by job {p.by}" + (f" of queue {by.queue}" if by is not None and by.queue else "")
        queue = sharing.queues.get(job.queue or sharing.default_queue)
        requeue = queue is None or queue.preempt_mode == "requeue"
        log.info("job %d element %d: %s (%s)", job.id, p.element, note, "requeue" if requeue else "cancel")
        if job.is_array:
            task = execution.task_of_element(job, p.element)
            if task is None:
                continue
            manager.raise_exception(job, "preempt", f"index {job.index_of(task)} {note}", severity=1)
            if requeue:
                manager.workflow.requeue_preempted(job, task)
            execution.preempt_task(job, task, note, cancel=not requeue)
        elif requeue:
            manager.raise_exception(job, "preempt", note, severity=1)
            manager.workflow.requeue_preempted(job, None)
            manager.tasks.kill_job(job, signal.SIGTERM)
        else:
            manager.raise_exception(job, "preempt", note)
