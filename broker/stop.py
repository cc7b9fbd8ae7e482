"""A planned stop (`mc shutdown`, the end of `mc start`'s command): what becomes of the jobs that run.

As in Slurm, a stop the owner asked for must not cost users work that a crash would have kept. By default
(`requeue`) every running job goes back to the queue, like `mc requeue`: its tasks get SIGTERM (SIGKILL after
`kill_grace`), the attempt is recorded with the outcome `shutdown`, and it is neither counted as failed nor charged
a retry; it runs again when an instance starts on the same state directory. `cancel` ends running jobs as
`mc cancel` would (their `afterok` dependants fail); `drain` starts nothing new and waits for them to end. Queued
jobs stay queued in every mode. A second stop during a drain replaces it (`mc shutdown` after `mc shutdown --drain`
requeues what still runs). A rank that never reports its tasks' end does not hold the stop beyond the grace: its
jobs stay running in the journal, and the next start settles them as after a crash (docs/architecture.md#restart).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.flow.attempts import PLANNED_STOP
from broker.jobmanager import JobManager

log = logging.getLogger(__name__)

MODES = ("requeue", "cancel", "drain")
# How much longer than kill_grace a stop waits for the last results of the tasks it ended.
RESULTS_MARGIN = 5.0
POLL = 0.05


async def settle_running(manager: JobManager, mode_now: Callable[[], str | None], kill_grace: float) -> None:
    """Requeue, cancel or wait for every running job as the stop's mode says (see above; read again each turn, as
    a drain may be replaced, and None ends the settling at once); returns once none runs, or once the grace is
    over (`requeue`, `cancel`). The scheduler starts nothing meanwhile: the broker is stopping."""
    jobs = manager.jobs
    for job in list(jobs.values()):
        manager.tasks.recall_ahead(job)  # what waits on a worker's window must not start now
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    cancelled = False
    while True:
        mode = mode_now()
        running = [job for job in jobs.values() if job.running]
        if mode is None or not running:
            return
        if mode == "cancel" and not cancelled:
            manager.cancel(manager.owner_uid, [job.id for job in running])
            cancelled = True
        if mode != "drain" and deadline is None:
            deadline = loop.time() + kill_grace + RESULTS_MARGIN
        if mode == "requeue":
            for job in running:  # an entry that started ahead as cores freed is interrupted too
                if not job.ending:
                    manager.workflow.interrupt(job, PLANNED_STOP)
        if deadline is not None and loop.time() >= deadline:
            log.warning("stopping with jobs %s still running: their end was not reported in time",
                        ",".join(str(job.id) for job in running))
            return
        await asyncio.sleep(POLL)
