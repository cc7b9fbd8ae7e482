"""Client operations of sharing (protocol.md §3.10): queues, queue control, banks, usage and job efficiency."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from broker.api.brokerview import BrokerView
from broker.api.access import check_owner, check_readable
from broker.api.clientapi import Peer
from broker.jobmanager import JobError
from broker.api.ops import op, reply_when_done
from broker.share import banks, reports
from broker.share.service import uid_of
from minicluster.proto import requests

QUEUE_ACTIONS = ("start", "stop", "enable", "disable")
_DEFAULT_REASON = {"stop": "stopped by the instance owner", "disable": "disabled by the instance owner"}


@op("queues")
def queues(broker: BrokerView, peer: Peer, req: requests.Empty) -> dict[str, Any]:
    sharing = broker.sharing
    limits = sharing.scheduler.limits
    gauges = sharing.gauges()["queues"]
    out = []
    for name, spec in sharing.queues.items():
        state = sharing.state[name]
        users = [{"uid": uid, **usage.to_wire()} for (queue, uid), usage in sorted(limits.by_user.items())
                 if queue == name and (usage.pending or usage.running)]
        out.append({**spec.to_wire(), **gauges[name], "reason": state.reason, "default": name == sharing.default_queue,
                    "users": users})
    return {"default": sharing.default_queue, "queues": out}


@op("queue-control", requests.QueueControl)
def queue_control(broker: BrokerView, peer: Peer, req: requests.QueueControl) -> asyncio.Future[dict[str, Any]]:
    action = req.action
    if action not in QUEUE_ACTIONS:
        raise JobError("bad-request", f"action must be one of {', '.join(QUEUE_ACTIONS)}, got {action!r}")
    check_owner(broker, peer, f"{action} queues")
    names = req.queues
    if not all(isinstance(n, str) for n in names):
        raise JobError("bad-request", "queues must be a list of queue names")
    reason = req.reason[:256]
    sharing = broker.sharing
    changed = sharing.set_state(names or list(sharing.queues), action, reason or _DEFAULT_REASON.get(action, ""))
    broker.manager.wake_scheduler()
    return reply_when_done(broker.journal.write([]), {"queues": changed})


@op("banks")
def bank_list(broker: BrokerView, peer: Peer, req: requests.Empty) -> dict[str, Any]:
    return {"banks": banks.listing(broker.sharing, time.time())}


@op("bank-add", requests.BankAdd)
def bank_add(broker: BrokerView, peer: Peer, req: requests.BankAdd) -> asyncio.Future[dict[str, Any]]:
    check_owner(broker, peer, "change banks")
    if req.user is not None:
        statements = banks.add_member(broker.sharing, req.bank, uid_of(req.user), req.shares, req.default)
    else:
        statements = banks.add_bank(broker.sharing, req.bank, req.parent, req.shares)
    broker.sharing.refresh(time.time())
    return reply_when_done(broker.journal.write(statements), {})


@op("bank-remove", requests.BankRemove)
def bank_remove(broker: BrokerView, peer: Peer, req: requests.BankRemove) -> asyncio.Future[dict[str, Any]]:
    check_owner(broker, peer, "change banks")
    if req.user is not None:
        statements = banks.remove_member(broker.sharing, broker.manager, req.bank, uid_of(req.user))
    else:
        statements = banks.remove_bank(broker.sharing, broker.manager, req.bank)
    broker.sharing.refresh(time.time())
    return reply_when_done(broker.journal.write(statements), {})


def _time(value: float | None, name: str) -> float | None:
    if value is not None and not 0 <= value < 1e12:
        raise JobError("bad-request", f"{name} must be a time in seconds since the epoch, got {value!r}")
    return value


@op("usage", requests.Usage)
def usage(broker: BrokerView, peer: Peer, req: requests.Usage) -> Any:
    uid = uid_of(req.user) if req.user is not None else None
    project, by_queue = req.project, req.by_queue
    since, until = _time(req.since, "since"), _time(req.until, "until")
    rows = reports.usage_rows(broker.journal, uid, project, since, until, by_queue)
    return asyncio.ensure_future(_wrap(rows))


async def _wrap(rows: Any) -> dict[str, Any]:
    return {"usage": await rows}


@op("job-usage", requests.OneJob)
def job_usage(broker: BrokerView, peer: Peer, req: requests.OneJob) -> Any:
    job_id = req.job
    record = broker.manager.jobs.get(job_id)
    if record is not None:
        check_readable(broker, peer, job_id, record.uid)
    if record is not None and not record.closed:  # closed: its clean event, and so its usage row, is durable
        raise JobError("bad-request", f"job {job_id} has not ended yet: its usage is known once it has")

    async def from_journal() -> dict[str, Any]:
        # A finished job's row was written with its finish event, before anyone could see it end.
        row = await reports.job_usage_row(broker.journal, job_id)
        if row is None:
            raise JobError("not-found", f"job {job_id} has no usage record (it does not exist, or was purged; "
                                        "mc usage still counts it)")
        check_readable(broker, peer, job_id, row["uid"])
        return {"usage": row}

    return asyncio.ensure_future(from_journal())
