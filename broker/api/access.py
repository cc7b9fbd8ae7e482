"""Who may read what (docs/security.md): a job's details are its owner's and the instance owner's.

Every client operation that serves a job's output, event log, task results, attempts, usage or details calls
`check_readable` first, so the rule lives in one place. The queue listing (`jobs`) stays public, as `squeue`
is, but shows other users' jobs without their `reason`, which quotes task errors (commands, paths).
Operations on the instance itself (drain, shutdown, queues, banks) call `check_owner`.
"""
from __future__ import annotations

from typing import Any

from broker.api.brokerview import BrokerView
from broker.api.clientapi import Peer
from broker.jobmanager import JobError


def may_read(broker: BrokerView, peer: Peer, owner: int) -> bool:
    """Whether `peer` may read the details of a job that `owner` (a uid) submitted."""
    return peer.uid == owner or peer.uid == broker.owner_uid


def check_readable(broker: BrokerView, peer: Peer, job_id: int, owner: int) -> None:
    """JobError `permission` unless `peer` may read job `job_id`, which `owner` submitted."""
    if not may_read(broker, peer, owner):
        raise JobError("permission", f"job {job_id} belongs to another user: only its owner and the instance "
                                     "owner may read its details, output and events")


def listed(broker: BrokerView, peer: Peer, summary: dict[str, Any]) -> dict[str, Any]:
    """A job's summary as the `jobs` listing shows it to `peer`."""
    if may_read(broker, peer, summary["uid"]):
        return summary
    return {**summary, "reason": None}


def readable_record(broker: BrokerView, peer: Peer, job_id: Any) -> Any:
    """The job's record, if `peer` may read its details."""
    record = broker.manager.get(job_id)
    check_readable(broker, peer, record.id, record.uid)
    return record


def check_owner(broker: BrokerView, peer: Peer, what: str) -> None:
    """JobError `permission` unless `peer` is the instance owner, the one who may `what`."""
    if peer.uid != broker.owner_uid:
        raise JobError("permission", f"only the instance owner (uid {broker.owner_uid}) may {what}")
