"""Job-wide PMI barrier with key-value exchange, one per job per worker.

Implements Flux RFC 13 "PMI_Barrier" and the KVS visibility rule of
"PMI_KVS_Put" (values become visible to others after the barrier) for the
tasks one worker runs: puts stay local until every local task entered the
barrier, then a single :meth:`PMIExchange.exchange` call trades them for the
whole job's key-value set (the worker does that over the overlay tree).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class PMIExchange(Protocol):
    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        """Called once per barrier per worker with the puts of all local tasks
        since the previous barrier; returns the merged key-value set of all
        tasks of the job on all workers."""
        ...


class JobBarrier:
    """Gathers the local tasks of one job into successive barriers.

    ``kvs`` is the job's key-value set on this worker; it only ever grows.
    """

    def __init__(
        self,
        kvsname: str,
        local_ranks: list[int],
        exchange: PMIExchange,
        kvs: dict[str, str],
    ) -> None:
        if len(set(local_ranks)) != len(local_ranks) or not local_ranks:
            raise ValueError(f"local ranks must be distinct and non-empty: {local_ranks}")
        self.kvsname = kvsname
        self.local_ranks = frozenset(local_ranks)
        self.kvs = kvs
        self.seq = 0  # index of the barrier being gathered
        self._exchange = exchange
        self._entered: dict[int, dict[str, str]] = {}
        self._done: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None

    async def enter(self, rank: int, puts: dict[str, str]) -> bool:
        """Wait until the barrier completes; False if the exchange failed."""
        if rank not in self.local_ranks:
            raise ValueError(f"rank {rank} is not local to this job server")
        if rank in self._entered:
            raise RuntimeError(f"rank {rank} entered barrier {self.seq} twice")
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        done = self._done
        self._entered[rank] = puts
        if len(self._entered) == len(self.local_ranks):
            self._task = asyncio.create_task(self._run(self.seq, self._entered, done))
            self._entered = {}
            self._done = None
            self.seq += 1
        # Shielded so one task's handler being cancelled does not cancel the
        # round the other tasks wait on.
        return await asyncio.shield(done)

    async def _run(self, seq: int, entered: dict[int, dict[str, str]], done: asyncio.Future[bool]) -> None:
        local: dict[str, str] = {}
        for rank in sorted(entered):
            local.update(entered[rank])
        self.kvs.update(local)
        try:
            merged = await self._exchange.exchange(self.kvsname, seq, local)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception:
            log.exception("PMI exchange %s seq %d failed", self.kvsname, seq)
            ok = False
        else:
            self.kvs.update(merged)
            ok = True
        if not done.done():
            done.set_result(ok)

    def close(self) -> None:
        """Stop an exchange in flight; its waiters see cancellation."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._done is not None and not self._done.done():
            self._done.cancel()
