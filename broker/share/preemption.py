"""Carrying out the scheduler's preemptions (docs/scheduling.md, "Preemption").

The scheduler (broker/sched/preempt.py) picks the victims; here each one is ended as its queue says: its tasks get
SIGTERM and, after `kill_grace`, SIGKILL; it is then requeued or cancelled, and its event log says by which job.
A plain job is a whole gang; an array element goes alone and counts as cancelled.
"""
from __future__ import annotations

import logging
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
        requeue = queue is not None and queue.preempt_mode == "requeue"
        log.info("job %d element %d: %s (%s)", job.id, p.element, note, "requeue" if requeue else "cancel")
        if job.is_array:
            if execution.preempt_element(job, p.element, note):
                manager.raise_exception(job, "preempt", f"element {p.element} {note}", severity=1)
        elif requeue and _requeue(manager, job, note):
            continue
        else:
            manager.raise_exception(job, "preempt", note)


def _requeue(manager: Any, job: Any, note: str) -> bool:
    """Back to the queue with the reason `preempted`, through the workflow requeue when the broker has one."""
    workflow = getattr(manager, "workflow", None)
    if workflow is None or not hasattr(workflow, "requeue_preempted"):
        return False
    workflow.requeue_preempted(job, note)
    return True
