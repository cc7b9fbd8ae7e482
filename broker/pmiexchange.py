"""The PMI exchange through rank 0 and the ends of MPI jobs (protocol.md §2.8, §3.6).

Barriers (PMI-1 `kvs`) and fences (PMIx `data`) of a job are merged here once every rank of the job sent its
part, then sent back to each.  A job that uses PMI fails as a gang: its first failure, or the earliest cause among
the aborts and failed exits that settle within ABORT_SETTLE seconds (broker/abortcause.py), ends it.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from broker.abortcause import AbortSettlement, Cause
from broker.job import Job, State
from broker.jobmanager import JobManager
from minicluster.proto import messages
from minicluster.proto.messages import Send

# How long an MPI abort waits for an earlier cause: Open MPI ranks call abort themselves when a peer
# vanishes, and their abort can overtake the report of the task that exited first.
ABORT_SETTLE = 0.25
# PMIX_ERR_BAD_PARAM: the parts of a group operation disagree (protocol.md §2.8).
BAD_PARAM = -27


class PmiExchange:
    def __init__(self, manager: JobManager, send: Send) -> None:
        self.manager = manager
        self.send = send
        # (job, "kvs" or "data", sequence number) -> rank -> its part.
        self._parts: dict[tuple[int, str, int], dict[int, Any]] = {}
        # Per job: the aborts settling, and the timer that ends the settling.
        self._aborts: dict[int, tuple[AbortSettlement, asyncio.TimerHandle]] = {}
        # PMIx group operations: (job, group, sequence number) -> rank -> its part; and the context ids drawn.
        self._groups: dict[tuple[int, str, int], dict[int, messages.PmixGroup]] = {}
        self._context_ids = itertools.count(1)

    def on_put(self, rank: int, put: messages.PmiPut) -> None:
        self.drop_ended()
        job = self.manager.jobs.get(put.job)
        if job is None or rank not in job.ranks:
            messages.send(self.send, rank, messages.Refusal("bad-request", "pmi-put for an unknown job", put.KIND))
            return
        # PMI-1 barriers (kvs) and PMIx fences (data) of one job are numbered apart.
        seq = put.seq
        field = "data" if put.data is not None else "kvs"
        parts = self._parts.setdefault((job.id, field, seq), {})
        parts[rank] = put.data if put.data is not None else put.kvs
        if len(parts) < len(job.ranks):
            return
        del self._parts[(job.id, field, seq)]
        merged: dict[str, str] | bytes
        if field == "data":
            merged = b"".join(parts[r] for r in sorted(parts))  # PMIx unpacks the blobs one after another
        else:
            merged = {}
            for part in parts.values():
                merged.update(part)
        kvs = messages.PmiKvs(job.id, seq, data=merged) if isinstance(merged, bytes) else messages.PmiKvs(
            job.id, seq, kvs=merged)
        for r in job.ranks:
            messages.send(self.send, r, kvs)

    def on_group(self, rank: int, part: messages.PmixGroup, epoch: int) -> None:
        """A worker's part of a PMIx group operation; done once every rank that holds members sent its part."""
        self.drop_ended()
        job = self.manager.jobs.get(part.job)
        if job is None or rank not in job.ranks or rank not in part.nodes or not set(part.nodes) <= job.ranks:
            messages.send(self.send, rank, messages.Refusal(
                "bad-request", "pmix-group for an unknown job or ranks that do not run it", part.KIND))
            return
        key = (job.id, part.group, part.seq)
        parts = self._groups.setdefault(key, {})
        parts[rank] = part
        if not set().union(*(p.nodes for p in parts.values())) <= set(parts):
            return
        del self._groups[key]
        first = parts[min(parts)]
        agree = all((p.op, p.nodes, p.ctxid) == (first.op, first.nodes, first.ctxid) for p in parts.values())
        status = next((p.status for p in parts.values() if p.status), 0) if agree else BAD_PARAM
        # Unique in the instance: the epoch grows with each broker start, the counter within one.
        ctxid = (epoch << 32) | next(self._context_ids) if first.ctxid and status == 0 else None
        done = messages.PmixGroupDone(job.id, part.group, part.seq, status, ctxid,
                                      b"".join(parts[r].data for r in sorted(parts)))
        for r in parts:
            messages.send(self.send, r, done)

    def drop_ended(self) -> None:
        """Forget the parts of barriers, fences and group operations some rank never joined, once their job ends
        (no task runs)."""
        for pending in (self._parts, self._groups):
            for key in [k for k in pending if (job := self.manager.jobs.get(k[0])) is None or job.ending
                        or job.state != State.RUN or job.running == 0]:
                del pending[key]

    def on_init(self, init: messages.PmiInit) -> None:
        """A task of the job initialized PMI: it is an MPI job, whose tasks fail together from now on."""
        job = self.manager.jobs.get(init.job)
        if job is not None and not job.pmi_used:
            job.pmi_used = True
            self.abort_gang(job)

    def on_abort(self, rank: int, abort: messages.Abort) -> None:
        job = self.manager.jobs.get(abort.job)
        if job is None or job.ending:
            return
        job.pmi_used = True  # only MPI programs call PMI abort
        note = f"task {abort.task} on rank {rank} called abort({abort.code}): {abort.message}".strip()
        # As mpiexec: the job exits with the code given to MPI_Abort (one that reads as success becomes 1).
        status = abort.code % 256
        when = abort.t if abort.t is not None else time.time()
        settling = self._aborts.get(job.id)
        if settling is None:
            timer = asyncio.get_running_loop().call_later(ABORT_SETTLE, self._raise_abort, job)
            settling = self._aborts[job.id] = (AbortSettlement(), timer)
        settling[0].abort(abort.task, when, (status or 1, note))

    def task_failed(self, job: Job, task: int, ended: float, failure: Cause) -> None:
        """A task of the job failed at `ended`: the job's first failure, or a cause among aborts settling."""
        settling = self._aborts.get(job.id)
        if settling is not None:  # the settle timer names the earliest cause
            settling[0].exit(task, ended, failure)
        else:
            job.first_failure = job.first_failure or failure

    def _raise_abort(self, job: Job) -> None:
        settlement, _ = self._aborts.pop(job.id)
        if not job.ending and job.state == State.RUN:
            status, note = settlement.cause()
            self.manager.raise_exception(job, "abort", note, status=status)

    def abort_gang(self, job: Job) -> None:
        """A failed task ends a job that fails as a gang, with that task's status (protocol.md §3.6).

        An MPI job does: the other ranks would wait for the failed one forever.  A job is one when it asked for
        PMI by name (`--mpi pmi1|pmix|auto`), or once a task initialized the PMI served by default (`pmi-init`,
        even after the failure: its ranks would wait in MPI_Init); until then a multi-task job is a set of
        independent tasks that run on when one fails, as under `srun`.
        """
        spec = job.spec
        if job.first_failure is None or job.ending or job.is_array or spec is None or not spec.uses_pmi:
            return
        if job.pmi_used or spec.mpi not in (None, "none"):
            status, note = job.first_failure
            self.manager.raise_exception(job, "abort", note, status=status)
