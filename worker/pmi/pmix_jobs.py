"""Glue between the worker agent and its PMIx server (docs/mpi.md, "PMIx"): one namespace per job, fences
carried over the overlay as `pmi-put` / `pmi-kvs` with a `data` blob, direct modex as `pmix-dmodex` /
`pmix-dmodex-data` between workers, group operations as `pmix-group` / `pmix-group-done` through rank 0
(protocol.md §2.8).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicluster.proto import messages
from worker.pmi import libpmix
from worker.pmi.engine import PutBudget
from worker.pmi.libpmix import InfoArray
from worker.pmi.pmix_host import Complete, GroupComplete, GroupRequest, PMIxHost, Upcalls, serves_groups
from worker.pmi.pmix_keys import JobLayout, job_keys, node_name

log = logging.getLogger(__name__)

Send = Callable[[str, int, dict[str, Any]], None]


def pmix_tmp_root() -> str:
    """Where the server and the jobs' directories live: memory-backed /dev/shm when there is one,
    because Open MPI puts its shared-memory segments in the job's directory (see `job_env`)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir()


@dataclass
class _Job:
    nspace: str
    layout: JobLayout
    tmpdir: str
    fence_seq: int = 0
    fences: dict[int, Complete] = field(default_factory=dict)
    # PMIx groups: operations so far per group name, and those waiting for rank 0 by (name, sequence number).
    group_seq: dict[str, int] = field(default_factory=dict)
    groups: dict[tuple[str, int], GroupComplete] = field(default_factory=dict)
    connected: bool = False


class PMIxJobs:
    def __init__(self, rank: int, send: Send) -> None:
        self.rank = rank
        self.send = send
        self.host: PMIxHost | None = None
        self._jobs: dict[int, _Job] = {}
        self._by_nspace: dict[str, int] = {}
        self._dmodex: dict[int, Complete] = {}
        self._ids = itertools.count(1)

    @staticmethod
    def nspace(job: int) -> str:
        # The same on every worker of the job: PMIx names peers by (namespace, rank).
        return f"mc.{job}"

    def _server(self) -> PMIxHost:
        if self.host is None:
            # OpenPMIx allows one server per process: started with the first PMIx job, kept until shutdown.
            tmpdir = tempfile.mkdtemp(prefix=f"mc-pmix-rank{self.rank}-", dir=pmix_tmp_root())
            os.chmod(tmpdir, 0o755)  # tasks run as the job's user must reach the server's files
            upcalls = Upcalls(fence=self._fence, direct_modex=self._direct_modex, abort=self._abort,
                              connected=self._connected, group=self._group)
            self.host = PMIxHost(tmpdir, node_name(self.rank), self.rank, upcalls, asyncio.get_running_loop())
            log.info("PMIx server (%s) serving from %s%s", self.host.version, tmpdir, "" if serves_groups(
                self.host.version) else "; PMIx groups not served by this version (docs/mpi.md, PMIx groups)")
        return self.host

    def prepare(self, job: int, info: messages.JobInfo, tasks: list[int]) -> dict[int, dict[str, str]]:
        """Register `job` with the PMIx server; returns each local task's PMIx environment."""
        host = self._server()
        layout = JobLayout.from_wire(info.layout)
        nspace = self.nspace(job)
        uid, gid = info.uid, info.gid
        tmpdir = os.path.join(host.tmpdir, nspace)
        os.makedirs(tmpdir, mode=0o700, exist_ok=True)
        if uid != os.getuid():
            os.chown(tmpdir, uid, gid)
        keys = job_keys(nspace, layout, self.rank, tmpdir, host.generate_regex, host.generate_ppn)
        host.register_nspace(nspace, len(tasks), InfoArray(keys))
        self._jobs[job] = _Job(nspace, layout, tmpdir)
        self._by_nspace[nspace] = job
        # The server's shared key store (its pmix_dstor_* directories) is root's and holds every job's keys: the
        # ranks of another user's job ask the server for theirs (gds "hash") instead of failing to open its lock.
        store = {"PMIX_MCA_gds": "hash"} if uid != os.getuid() else {}
        return {task: {**host.register_client(nspace, task, uid, gid), **job_env(tmpdir), **store}
                for task in sorted(tasks)}

    def finished(self, job: int) -> None:
        entry = self._jobs.pop(job, None)
        if entry is None or self.host is None:
            return
        del self._by_nspace[entry.nspace]
        self.host.deregister_nspace(entry.nspace)
        shutil.rmtree(entry.tmpdir, ignore_errors=True)

    def close_all(self) -> None:
        for job in list(self._jobs):
            self.finished(job)
        if self.host is not None:
            self.host.finalize()
            shutil.rmtree(self.host.tmpdir, ignore_errors=True)

    # --- overlay messages ----------------------------------------------------------------------------------

    def exchanged(self, job: int, seq: int, data: bytes) -> None:
        """`pmi-kvs` with the concatenated fence data of every worker of the job."""
        entry = self._jobs.get(job)
        complete = entry.fences.pop(seq, None) if entry else None
        if complete is not None:
            complete(libpmix.SUCCESS, data)

    def group_done(self, done: messages.PmixGroupDone) -> None:
        """`pmix-group-done`: rank 0 gathered every member's node; release the members here."""
        entry = self._jobs.get(done.job)
        complete = entry.groups.pop((done.group, done.seq), None) if entry else None
        if complete is not None:
            complete(done.status, done.ctxid, done.data)

    def dmodex_request(self, request: messages.DmodexRequest) -> None:
        """A peer worker asks for the data one of our tasks committed."""

        def reply(status: int, data: bytes) -> None:
            messages.send(self.send, request.sender, messages.DmodexReply(request.job, request.id, status, data))

        entry = self._jobs.get(request.job)
        if entry is None or self.host is None:
            reply(libpmix.ERR_NOT_FOUND, b"")
            return
        self.host.dmodex_request(entry.nspace, request.task, reply)

    def dmodex_reply(self, reply: messages.DmodexReply) -> None:
        complete = self._dmodex.pop(reply.id, None)
        if complete is not None:
            complete(reply.status, reply.data)

    # --- upcalls from the PMIx server (on the event loop) ---------------------------------------------------

    def _fence(self, nspace: str, data: bytes, complete: Complete) -> None:
        job = self._by_nspace.get(nspace)
        if job is None:
            complete(libpmix.ERR_NOT_FOUND, b"")
            return
        entry = self._jobs[job]
        seq = entry.fence_seq
        entry.fence_seq += 1
        # The same room as PMI-1 puts (worker/pmi/engine.py): rank 0 holds every node's part until all came.
        local = dict(entry.layout.nodes).get(self.rank, 1)
        room = PutBudget(entry.layout.size, local).max_bytes
        if len(data) > room:
            log.warning("job %d: PMIx fence %d refused: %d bytes from this node's tasks, at most %d",
                        job, seq, len(data), room)
            complete(libpmix.ERR_BAD_PARAM, b"")
            return
        if len(entry.layout.nodes) == 1:
            complete(libpmix.SUCCESS, data)  # every rank is here: nothing to trade
            return
        entry.fences[seq] = complete
        messages.send(self.send, 0, messages.PmiPut(job, seq, data=data))

    def _group(self, request: GroupRequest, complete: GroupComplete) -> None:
        """All local members of a group called construct or destruct: a collective over the members' nodes."""
        job, refused, why = self._group_job(request)
        if job is None:
            log.warning("PMIx group %s %r refused: %s", request.op, request.group, why)
            complete(refused, None, b"")
            return
        entry = self._jobs[job]
        ranks = {rank for _, rank in request.procs}
        everyone = libpmix.RANK_WILDCARD in ranks
        nodes = sorted(w for w, _ in entry.layout.nodes) if everyone else sorted(
            {entry.layout.node_of(rank) for rank in ranks})
        local = dict(entry.layout.nodes).get(self.rank, 1)
        room = PutBudget(entry.layout.size, local).max_bytes
        if len(request.data) > room:
            log.warning("job %d: PMIx group %r refused: %d bytes of endpoint data from this node, at most %d",
                        job, request.group, len(request.data), room)
            complete(libpmix.ERR_BAD_PARAM, None, b"")
            return
        if nodes == [self.rank] and not request.ctxid:
            complete(request.status, None, request.data)  # every member is here and no id is asked: nothing to trade
            return
        seq = entry.group_seq.get(request.group, 0)
        entry.group_seq[request.group] = seq + 1
        entry.groups[(request.group, seq)] = complete
        messages.send(self.send, 0, messages.PmixGroup(job, request.group, seq, request.op, nodes, request.ctxid,
                                                       request.status, request.data))

    def _group_job(self, request: GroupRequest) -> tuple[int | None, int, str]:
        """The job whose tasks are the group's members, or the PMIx status that refuses the group and why."""
        nspaces = {nspace for nspace, _ in request.procs}
        job = self._by_nspace.get(next(iter(nspaces))) if len(nspaces) == 1 else None
        if job is None:  # a group across jobs would need a collective over several jobs' workers
            return None, libpmix.ERR_NOT_SUPPORTED, f"members not of one job here: namespaces {sorted(nspaces)[:4]}"
        size = self._jobs[job].layout.size
        bad = [rank for _, rank in request.procs if rank >= size and rank != libpmix.RANK_WILDCARD]
        if bad:
            return None, libpmix.ERR_BAD_PARAM, f"ranks {bad[:4]} outside job {job} of {size} tasks"
        return job, libpmix.SUCCESS, ""

    def _direct_modex(self, nspace: str, rank: int, complete: Complete) -> None:
        job = self._by_nspace.get(nspace)
        if job is None:
            complete(libpmix.ERR_NOT_FOUND, b"")
            return
        try:
            owner = self._jobs[job].layout.node_of(rank)
        except ValueError:
            complete(libpmix.ERR_NOT_FOUND, b"")
            return
        ident = next(self._ids)
        self._dmodex[ident] = complete
        messages.send(self.send, owner, messages.DmodexRequest(job, rank, ident, self.rank))

    def _connected(self, nspace: str) -> None:
        """The first task of a job called PMIx_Init here: rank 0 treats the job as MPI from now on (§3.6)."""
        job = self._by_nspace.get(nspace)
        if job is not None and not self._jobs[job].connected:
            self._jobs[job].connected = True
            messages.send(self.send, 0, messages.PmiInit(job))

    def _abort(self, nspace: str, rank: int, status: int, message: str, when: float) -> None:
        job = self._by_nspace.get(nspace)
        if job is not None:
            messages.send(self.send, 0, messages.Abort(job, rank, status, message, when))


def job_env(tmpdir: str) -> dict[str, str]:
    """What a PMIx task needs besides the server's rendezvous variables (docs/mpi.md, "PMIx")."""
    return {
        # Open MPI 4.x only believes it was started by a resource manager's PMIx server when a known
        # launcher says so; JSM (IBM's PMIx-only launcher) is the one that implies nothing but PMIx.
        # It also tells Open MPI the tasks are already bound (the worker binds them).
        "JSM_JSRUN_PORT": "minicluster",
        # Shared-memory segments go in the job's directory, which the worker removes when the job
        # ends: killed ranks leave none behind, and simulated nodes on one host (mc start) do not
        # share names.
        "OMPI_MCA_btl_vader_backing_directory": tmpdir,
        "OMPI_MCA_btl_sm_backing_directory": tmpdir,
    }
