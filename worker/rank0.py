"""The seam between broker/ and worker/: what rank 0 composes to run tasks on its own node.

Rank 0 is a node like any other, so the broker hosts the same WorkerAgent every worker runs
(architecture.md#the-broker-worker-seam).  The broker imports this module and nothing else of worker/ (an
import-linter contract in pyproject.toml keeps it so), and holds the agent as a NodeAgent: the four things it
does with it.  A change inside worker/ then reaches the broker only through here.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from minicluster.config import InstanceConfig
from minicluster.proto.envelope import Message
from worker.agent import PEER_KINDS, WORKER_KINDS, WorkerAgent
from worker.resources import discover

Send = Callable[[str, int, dict[str, Any]], None]


class NodeAgent(Protocol):
    """Rank 0's own task-running agent, as the broker sees it."""

    stopped: asyncio.Event  # set once its tasks ended after `shutdown`

    def handle(self, msg: Message) -> None:
        """A message for the agent (see `for_agent`); never blocks."""

    async def run(self) -> None:
        """Its periodic work, until stopped."""

    async def shutdown(self) -> None:
        """End its tasks with their grace and report them (a disruption: the pod goes away)."""


def agent(config: InstanceConfig, send: Send, uri: str) -> NodeAgent:
    """Rank 0's agent, over the resources discovered on this node."""
    return WorkerAgent(config, 0, send, discover(config.resources, config.node_properties), uri)


def for_agent(msg: Message) -> bool:
    """Whether a message reaching rank 0 is for its agent rather than the broker.

    Kinds a worker handles go to the agent when rank 0 sent them to itself; the PMIx peer kinds, which one
    worker sends another, go to it from any rank.
    """
    return msg.kind in WORKER_KINDS and (msg.src == 0 or msg.kind in PEER_KINDS)
