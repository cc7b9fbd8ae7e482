"""Client operations of workflows (protocol.md §3.3, §3.9.4): hold, release, update, requeue, attempts."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.api.access import readable_record
from broker.api.brokerview import BrokerView
from broker.api.clientapi import Peer
from broker.job import Job
from broker.jobmanager import JobError
from broker.api.ops import once_durable, op, reply_when_done, task_of_index
from broker.flow.workflow import WorkflowRefusal
from minicluster.proto import requests


def _each(broker: BrokerView, peer: Peer, req: requests.ManyJobs,
          action: Callable[[Job], Any]) -> tuple[list[int], dict[str, str], list[Any]]:
    """Apply `action` to every job of `jobs`: (the ids it applied to, {job: why not}, what it returned)."""
    done: list[int] = []
    errors: dict[str, str] = {}
    results: list[Any] = []
    for job_id in req.jobs:
        try:
            job = broker.manager.get(job_id)
            results.append(action(job))
            done.append(job.id)
        except (JobError, WorkflowRefusal) as exc:
            errors[str(job_id)] = str(exc)
    return done, errors, results


@op("hold", requests.ManyJobs)
def hold(broker: BrokerView, peer: Peer, req: requests.ManyJobs) -> asyncio.Future[dict[str, Any]]:
    held, errors, _ = _each(broker, peer, req, lambda job: broker.manager.workflow.hold(job, peer.uid))
    return once_durable(broker, {"held": held, "errors": errors})


@op("release", requests.ManyJobs)
def release(broker: BrokerView, peer: Peer, req: requests.ManyJobs) -> asyncio.Future[dict[str, Any]]:
    released, errors, _ = _each(broker, peer, req, lambda job: broker.manager.workflow.release(job, peer.uid))
    return once_durable(broker, {"released": released, "errors": errors})


@op("requeue", requests.ManyJobs)
def requeue(broker: BrokerView, peer: Peer, req: requests.ManyJobs) -> asyncio.Future[dict[str, Any]]:
    requeued, errors, waiters = _each(broker, peer, req,
                                      lambda job: broker.manager.workflow.requeue(job, peer.uid))
    # gather() of nothing is a future already done: the reply goes out at once.
    done: asyncio.Future[Any] = asyncio.gather(*waiters)
    return reply_when_done(done, {"requeued": requeued, "errors": errors})


@op("update", requests.Update)
def update(broker: BrokerView, peer: Peer, req: requests.Update) -> asyncio.Future[dict[str, Any]]:
    job = broker.manager.get(req.job)
    try:
        updated = broker.manager.workflow.update(job, peer.uid, dict(req.changes))
    except WorkflowRefusal as exc:
        raise JobError(exc.code, str(exc)) from None
    return once_durable(broker, {"job": job.id, "updated": updated})


@op("attempts", requests.Attempts)
def attempts(broker: BrokerView, peer: Peer, req: requests.Attempts) -> Any:
    record = readable_record(broker, peer, req.job)
    index, start, limit, only_failed = req.index, req.start, min(req.limit, 100_000), req.failed
    task = task_of_index(record, index) if index is not None else None

    async def answer() -> dict[str, Any]:
        # Only failed ones: which those are is known only after reading them all, so no bound in SQL then.
        earlier, final = await broker.manager.store.attempts(record.id, start, task,
                                                             None if only_failed else limit)
        retried = {r[0] for r in earlier}
        if only_failed:
            final = [r for r in final if r[4] != 0 or r[0] in retried]
            failed = {r[0] for r in final}
            earlier = [r for r in earlier if r[0] in failed or r[0] in retried]
        rows = sorted(earlier + final, key=lambda r: (r[0], r[2]))
        return {"attempts": rows[:limit]}

    return asyncio.ensure_future(answer())
