"""Client operations of workflows (protocol.md §3.3, §3.9.4): hold, release, update, requeue, attempts."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.brokerview import BrokerView
from broker.clientapi import Peer
from broker.job import Job
from broker.jobmanager import JobError
from broker.ops import _field, _readable, _task_of_index, _then, once_durable, op
from broker.workflow import WorkflowRefusal


def _each(broker: BrokerView, peer: Peer, req: dict[str, Any],
          action: Callable[[Job], Any]) -> tuple[list[int], dict[str, str], list[Any]]:
    """Apply `action` to every job of `jobs`: (the ids it applied to, {job: why not}, what it returned)."""
    done: list[int] = []
    errors: dict[str, str] = {}
    results: list[Any] = []
    for job_id in _field(req, "jobs", list):
        try:
            job = broker.manager.get(job_id)
            results.append(action(job))
            done.append(job.id)
        except (JobError, WorkflowRefusal) as exc:
            errors[str(job_id)] = str(exc)
    return done, errors, results


@op("hold")
def hold(broker: BrokerView, peer: Peer, req: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    held, errors, _ = _each(broker, peer, req, lambda job: broker.manager.workflow.hold(job, peer.uid))
    return once_durable(broker, {"held": held, "errors": errors})


@op("release")
def release(broker: BrokerView, peer: Peer, req: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    released, errors, _ = _each(broker, peer, req, lambda job: broker.manager.workflow.release(job, peer.uid))
    return once_durable(broker, {"released": released, "errors": errors})


@op("requeue")
def requeue(broker: BrokerView, peer: Peer, req: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    requeued, errors, waiters = _each(broker, peer, req,
                                      lambda job: broker.manager.workflow.requeue(job, peer.uid))
    # gather() of nothing is a future already done: the reply goes out at once.
    done: asyncio.Future[Any] = asyncio.gather(*waiters)
    return _then(done, {"requeued": requeued, "errors": errors})


@op("update")
def update(broker: BrokerView, peer: Peer, req: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    job = broker.manager.get(_field(req, "job", int))
    changes = {k: v for k, v in req.items() if k not in ("v", "id", "op", "job")}
    try:
        updated = broker.manager.workflow.update(job, peer.uid, changes)
    except WorkflowRefusal as exc:
        raise JobError(exc.code, str(exc)) from None
    return once_durable(broker, {"job": job.id, "updated": updated})


@op("attempts")
def attempts(broker: BrokerView, peer: Peer, req: dict[str, Any]) -> Any:
    record = _readable(broker, peer, _field(req, "job", int))
    index = _field(req, "index", int, None)
    start = _field(req, "from", int, 0)
    limit = min(_field(req, "limit", int, 10_000), 100_000)
    only_failed = _field(req, "failed", bool, False)
    task = _task_of_index(record, index) if index is not None else None

    async def answer() -> dict[str, Any]:
        earlier, final = await broker.manager.store.attempts(record.id, start, task)
        retried = {r[0] for r in earlier}
        if only_failed:
            final = [r for r in final if r[4] != 0 or r[0] in retried]
            failed = {r[0] for r in final}
            earlier = [r for r in earlier if r[0] in failed or r[0] in retried]
        rows = sorted(earlier + final, key=lambda r: (r[0], r[2]))
        return {"attempts": rows[:limit]}

    return asyncio.ensure_future(answer())
