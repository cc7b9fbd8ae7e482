"""Glue between the worker agent and the PMI servers (docs/mpi.md): one PMI-1 PMIJobServer per MPI job on this
rank, with the barrier exchange carried over the overlay as `pmi-put` / `pmi-kvs` (protocol.md §2.8), and the
rank's PMIx server (worker/pmi/pmix_jobs.py) for jobs that ask for PMIx.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from minicluster.proto import messages
from worker.pmi import detect
from worker.pmi.engine import process_mapping
from worker.pmi.mpienv import mpi_env_defaults
from worker.pmi.server import PMIJobServer
from worker.pmi.shm import remove_unmapped_segments
from worker.pmi.pmix_jobs import PMIxJobs

log = logging.getLogger(__name__)

Send = Callable[[str, int, dict[str, Any]], None]
TaskEnv = dict[int, tuple[dict[str, str], tuple[int, ...]]]


class _OverlayExchange:
    """PMIExchange for one job: send this rank's puts to rank 0, wait for the merged set."""

    def __init__(self, job: int, send: Send, single_node: bool) -> None:
        self.job = job
        self.send = send
        self.single_node = single_node
        self.waiting: dict[int, asyncio.Future[dict[str, str]]] = {}

    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        if self.single_node:
            return local_kvs  # every task of the job is on this rank: no round trip to rank 0
        fut: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
        self.waiting[seq] = fut
        messages.send(self.send, 0, messages.PmiPut(self.job, seq, kvs=local_kvs))
        return await fut

    def deliver(self, seq: int, kvs: dict[str, str]) -> None:
        fut = self.waiting.pop(seq, None)
        if fut is not None and not fut.done():
            fut.set_result(kvs)


class PMIJobs:
    def __init__(self, rank: int, send: Send, shared_cores: bool = False) -> None:
        self.rank = rank
        self.send = send
        self.shared_cores = shared_cores
        # Rank 0 names each dispatch of a job (jobinfo's kvsname); an older rank 0 does not, and then this
        # worker's own name keeps MPICH's /dev/shm segments of a job apart from those an earlier job of the same
        # id left behind (docs/mpi.md, kvsname).
        self.nonce = secrets.token_hex(6)
        self._servers: dict[int, tuple[PMIJobServer, _OverlayExchange]] = {}
        self.pmix = PMIxJobs(rank, send)

    def kvsname(self, job: int, info: messages.JobInfo) -> str:
        return info.kvsname or f"mc-{job}-{self.nonce}"

    def prepare(self, job: int, info: messages.JobInfo, tasks: list[int]) -> TaskEnv:
        """Start serving PMI for this rank's `tasks` of `job`; returns each task's env and fds to pass."""
        modes = serve_modes(info)
        out: TaskEnv = {task: ({**mpi_env_defaults(self.shared_cores), **info.env}, ()) for task in tasks}
        if "pmi1" in modes:
            for task, (env, fds) in self._prepare_pmi1(job, info, tasks).items():
                out[task] = ({**out[task][0], **env}, fds)
        if "pmix" in modes:
            for task, env in self.pmix.prepare(job, info, tasks).items():
                out[task] = ({**out[task][0], **env}, out[task][1])
        return out

    def _prepare_pmi1(self, job: int, info: messages.JobInfo, tasks: list[int]) -> TaskEnv:
        layout = sorted((r, n) for r, n in info.layout)
        exchange = _OverlayExchange(job, self.send, single_node=len(layout) == 1)
        server = PMIJobServer(
            kvsname=self.kvsname(job, info), universe_size=info.ntasks, local_ranks=sorted(tasks),
            process_mapping=process_mapping([n for _, n in layout]), exchange=exchange,
            on_abort=lambda task, code, message: messages.send(
                self.send, 0, messages.Abort(job, task, code, message, time.time())),
            # The job is an MPI job: rank 0 then ends it when a task fails (protocol.md §3.6).
            on_init=lambda: messages.send(self.send, 0, messages.PmiInit(job)),
        )
        self._servers[job] = (server, exchange)
        out: TaskEnv = {}
        for task in tasks:
            fd = server.socket_for(task)
            out[task] = (server.env_for(task, fd), (fd,))
        return out

    def spawned(self, job: int) -> None:
        entry = self._servers.get(job)
        if entry is not None:
            entry[0].close_child_fds()

    def exchanged(self, kvs: messages.PmiKvs) -> None:
        """A `pmi-kvs`: the merged PMI-1 key-value set (`kvs`) or the PMIx fence data (`data`)."""
        if kvs.data is not None:
            self.pmix.exchanged(kvs.job, kvs.seq, kvs.data)
            return
        entry = self._servers.get(kvs.job)
        if entry is not None and kvs.kvs is not None:
            entry[1].deliver(kvs.seq, kvs.kvs)

    def finished(self, job: int) -> None:
        """The job's last task on this rank ended: stop serving and reap segments its killed ranks left."""
        self.pmix.finished(job)
        entry = self._servers.pop(job, None)
        if entry is None:
            return
        entry[0].close()
        removed = remove_unmapped_segments(entry[0].job.kvsname)
        if removed:
            log.info("job %d: removed %d leftover MPICH segment(s): %s", job, len(removed),
                     " ".join(p.name for p in removed))

    def close_all(self) -> None:
        for job in list(self._servers):
            self.finished(job)
        self.pmix.close_all()


def serve_modes(info: messages.JobInfo) -> set[str]:
    """Which PMI servers a job's tasks get: `mpi` is "pmi1", "pmix" or "auto" (true from an older broker
    means "pmi1").  "auto" looks at the program's shared libraries and serves both when they do not tell;
    "auto:pmi1" and "auto:pmix" (a job that named no PMI) serve the mode after the colon then.  Decided once
    per job on each worker: an array's elements and 1-task jobs get no PMI, so they never read the file."""
    mode = info.mpi
    if mode is True:
        return {"pmi1"}
    if not isinstance(mode, str) or not mode.startswith("auto"):
        return {mode} if mode in ("pmi1", "pmix") else set()
    fallback = {mode[5:]} if mode[5:] in ("pmi1", "pmix") else {"pmi1", "pmix"}
    user = (info.uid, info.gid) if info.uid != os.getuid() else None
    picked = detect.pmi_for(info.argv[0], info.env.get("PATH"), info.cwd, user)
    return {picked} if picked else fallback
