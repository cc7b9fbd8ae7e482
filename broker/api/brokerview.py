"""What the client operations (ops.py, flowops.py, shareops.py and access.py here) may use of the broker.

The operations are plain functions of (broker, peer, request): this Protocol is the broker they see, so mypy
checks every use against the real types and a new dependency of an operation on the broker shows here.
`broker.service.Broker` satisfies it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.execution import Execution
    from broker.jobmanager import JobManager
    from broker.durable.journal import Journal
    from broker.ranks import RankTable
    from broker.sched import ResourceGraph
    from broker.share.service import Sharing
    from broker.watchers import Watchers
    from minicluster.config import InstanceConfig


class BrokerView(Protocol):
    config: InstanceConfig
    owner_uid: int
    stopping: bool
    epoch: int
    manager: JobManager
    journal: Journal
    watchers: Watchers
    sharing: Sharing
    graph: ResourceGraph
    execution: Execution
    ranks: RankTable

    def request_stop(self, mode: str = "requeue") -> None:
        """Begin a clean stop (`mc shutdown`); `mode` says what becomes of running jobs (broker/stop.py)."""
