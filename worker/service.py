"""A worker process: the overlay plus the WorkerAgent for one rank (`mc worker`)."""
from __future__ import annotations

import asyncio
import logging
import signal

from minicluster import exitcodes
from minicluster.config import InstanceConfig
from minicluster.overlay.curve import Certificate
from minicluster.overlay.transport import Overlay
from minicluster.proto.envelope import Message
from worker.agent import WorkerAgent
from worker.resources import discover

log = logging.getLogger(__name__)


async def run_worker(config: InstanceConfig, rank: int, cert: Certificate) -> int:
    if rank == 0:
        raise ValueError("rank 0 is the broker; start it with `mc broker`")
    resources = discover(config.resources, config.node_properties)
    agent: WorkerAgent | None = None

    def deliver(msg: Message) -> None:
        assert agent is not None
        agent.handle(msg)

    overlay = Overlay(config, rank, cert, deliver)
    agent = WorkerAgent(config, rank, overlay.send, resources, f"unix://{config.socket_path}")
    loop = asyncio.get_running_loop()
    signals: list[int] = []
    stopping: list[asyncio.Task[None]] = []

    def stop(signum: int) -> None:
        # Pod deletion or eviction: end this rank's tasks with their grace and report them, then leave as a
        # disruption (exitcodes.py).  Only rank 0's `shutdown` is a clean end.
        if not signals:
            signals.append(signum)
            stopping.append(loop.create_task(agent.shutdown()))  # referenced: a bare task may be collected

    loop.add_signal_handler(signal.SIGTERM, stop, signal.SIGTERM)
    # Ctrl-C in `mc start` reaches every process of the foreground group; the launcher decides.
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    overlay.start()
    try:
        await agent.run()
    finally:
        await overlay.close()
    return exitcodes.stopped_by(signals[0]) if signals else exitcodes.SUCCESS
