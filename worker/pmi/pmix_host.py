"""The worker's PMIx server: OpenPMIx's server library hosted through ctypes, bridged to asyncio.

OpenPMIx allows one server per process, so a worker runs one `PMIxHost` for all its jobs, one
namespace per job.  The library runs its own progress thread and calls the host module from it
(fence, direct modex, group construct and destruct, abort, connect and finalize).  Those upcalls only copy
their arguments and hand them to the worker's event loop with `call_soon_threadsafe`; they never wait.  The
event loop later
completes each request by calling the library's callback, which OpenPMIx allows from any thread
(it moves the work back onto its own).  Nothing here blocks the event loop for longer than the
library takes to copy a namespace's keys.
"""
from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.pmi import libpmix
from worker.pmi.libpmix import InfoArray

log = logging.getLogger(__name__)

# complete(status, data): finish a fence or a direct-modex request.
Complete = Callable[[int, bytes], None]
# complete(status, context id or None, endpoint data): finish a group operation.
GroupComplete = Callable[[int, int | None, bytes], None]
# The first OpenPMIx whose server sends a group's members their final membership, which the PMIx client of Open MPI 5
# (OpenPMIx 5) reads before the context id: from an older server it takes the context id for the member count and
# allocates that many (docs/mpi.md, "PMIx groups").  Older servers are left without the group upcall.
GROUPS_SINCE = (4, 2, 4)
# A task may list this many members at most (the server library accepts any number): copied on its thread.
MAX_GROUP_PROCS = 1 << 16
# Directives of a group operation the host reads; the library adds the last two itself.
GROUP_KEYS = ("pmix.grp.actxid", "pmix.grp.endpt", "pmix.timeout", "pmix.embed.barrier", "pmix.grp.id",
              "pmix.grp.lcl", "pmix.sorted.parr", "pmix.loc.col.st")


@dataclass(frozen=True)
class GroupRequest:
    """What the server library asks of the host for a group once all local members called (docs/mpi.md)."""

    op: str  # "construct" or "destruct"
    group: str
    procs: list[tuple[str, int]]
    ctxid: bool  # PMIX_GROUP_ASSIGN_CONTEXT_ID
    data: bytes  # PMIX_GROUP_ENDPT_DATA: the local members' endpoints, packed by the library
    status: int  # PMIX_LOCAL_COLLECTIVE_STATUS


def serves_groups(version: str) -> bool:
    """Whether a server library of this version (PMIx_Get_version's text) gets the group upcall."""
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", version)
    return found is not None and tuple(int(n) for n in found.groups()) >= GROUPS_SINCE


def _info_true(value: Any) -> bool:
    # PMIX_INFO_TRUE: a bool's value, and a key given without a value (PMIX_UNDEF) means true.
    return bool(value.data.flag) if value.type == libpmix.BOOL else value.type == libpmix.UNDEF


@dataclass(frozen=True)
class Upcalls:
    """What the host does with the library's requests; all called on the event loop."""

    fence: Callable[[str, bytes, Complete], None]
    direct_modex: Callable[[str, int, Complete], None]
    abort: Callable[[str, int, int, str, float], None]  # nspace, rank, status, message, when (time.time())
    # A client of the namespace called PMIx_Init.
    connected: Callable[[str], None] = lambda nspace: None
    group: Callable[[GroupRequest, GroupComplete], None] = lambda request, complete: complete(
        libpmix.ERR_NOT_SUPPORTED, None, b"")


class PMIxHost:
    """One OpenPMIx server per process, serving every PMIx job of this worker."""

    def __init__(self, tmpdir: str, node: str, node_id: int, upcalls: Upcalls,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.lib = libpmix.load()
        self.version = (self.lib.PMIx_Get_version() or b"?").decode().split(",")[0]
        self.tmpdir = tmpdir
        self._upcalls = upcalls
        self._loop = loop
        self._buffers: dict[int, Any] = {}  # data handed to the library until it releases it
        self._tokens = itertools.count(1)
        self._dmodex_waiters: dict[int, Callable[[int, bytes], None]] = {}
        # The library keeps pointers to the module and its callbacks: they live as long as the host.
        self._release_cb = libpmix.ReleaseCbFunc(self._release)
        self._dmodex_cb = libpmix.DmodexResponseFn(self._dmodex_response)
        self._module = libpmix.ServerModule(
            client_connected=libpmix.ClientConnectedFn(self._client_connected),
            client_finalized=libpmix.ClientFinalizedFn(self._client_finalized),
            abort=libpmix.AbortFn(self._abort),
            fence_nb=libpmix.FenceNbFn(self._fence_nb),
            direct_modex=libpmix.DirectModexFn(self._direct_modex),
            group=libpmix.GroupFn(self._group) if serves_groups(self.version) else libpmix.GroupFn())
        os.makedirs(tmpdir, mode=0o700, exist_ok=True)
        init = InfoArray([("pmix.srvr.tmpdir", libpmix.STRING, tmpdir),
                          ("pmix.sys.tmpdir", libpmix.STRING, tmpdir),
                          ("pmix.hname", libpmix.STRING, node),
                          ("pmix.nodeid", libpmix.UINT32, node_id),
                          ("pmix.srv.rank", libpmix.PROC_RANK, node_id)])
        self._check("PMIx_server_init",
                    self.lib.PMIx_server_init(ctypes.byref(self._module), init.pointer(), init.count))
        self.closed = False

    # --- calls from the event loop -------------------------------------------------------------------------

    def generate_regex(self, names: list[str]) -> str:
        out = ctypes.c_void_p()
        self._check("PMIx_generate_regex", self.lib.PMIx_generate_regex(",".join(names).encode(), ctypes.byref(out)))
        return self._regex(out)

    def generate_ppn(self, ranks_per_node: list[list[int]]) -> str:
        text = ";".join(",".join(map(str, ranks)) for ranks in ranks_per_node)
        out = ctypes.c_void_p()
        self._check("PMIx_generate_ppn", self.lib.PMIx_generate_ppn(text.encode(), ctypes.byref(out)))
        return self._regex(out)

    def register_nspace(self, nspace: str, nlocal: int, keys: InfoArray) -> None:
        # No callback: the call copies the keys and returns (OpenPMIx >= 4 blocking form).
        rc = self.lib.PMIx_server_register_nspace(nspace.encode(), nlocal, keys.pointer(), keys.count,
                                                  libpmix.OpCbFunc(), None)
        self._check("PMIx_server_register_nspace", rc)

    def register_client(self, nspace: str, rank: int, uid: int, gid: int) -> dict[str, str]:
        """Admit `rank` of `nspace` (as uid/gid); return the environment that points it at this server."""
        proc = libpmix.proc(nspace, rank)
        self._check("PMIx_server_register_client",
                    self.lib.PMIx_server_register_client(ctypes.byref(proc), uid, gid, None, libpmix.OpCbFunc(),
                                                         None))
        env = ctypes.POINTER(ctypes.c_char_p)()
        self._check("PMIx_server_setup_fork", self.lib.PMIx_server_setup_fork(ctypes.byref(proc), ctypes.byref(env)))
        return libpmix.take_env(env)

    def deregister_nspace(self, nspace: str) -> None:
        """Forget a job: its clients, their data and the job's keys."""
        self.lib.PMIx_server_deregister_nspace(nspace.encode(), libpmix.OpCbFunc(), None)

    def dmodex_request(self, nspace: str, rank: int, reply: Callable[[int, bytes], None]) -> None:
        """Ask the library for the data a local `rank` committed; `reply(status, data)` on the event loop."""
        token = next(self._tokens)
        self._dmodex_waiters[token] = reply
        proc = libpmix.proc(nspace, rank)
        rc = self.lib.PMIx_server_dmodex_request(ctypes.byref(proc), self._dmodex_cb, token)
        if rc != libpmix.SUCCESS:
            self._dmodex_waiters.pop(token, None)
            reply(rc, b"")

    def finalize(self) -> None:
        if not self.closed:
            self.closed = True
            self.lib.PMIx_server_finalize()

    def error_string(self, status: int) -> str:
        return libpmix.error_string(self.lib, status)

    # --- upcalls from the library's thread: copy, hand over, return ----------------------------------------

    def _client_connected(self, proc: Any, server_object: Any, cbfunc: Any, cbdata: Any) -> int:
        self._loop.call_soon_threadsafe(self._upcalls.connected, proc[0].nspace.decode())
        return libpmix.OPERATION_SUCCEEDED

    def _client_finalized(self, proc: Any, server_object: Any, cbfunc: Any, cbdata: Any) -> int:
        # The library tracks finalize itself; a task's end is judged by its exit status.
        return libpmix.OPERATION_SUCCEEDED

    def _abort(self, proc: Any, server_object: Any, status: int, msg: bytes | None, procs: Any, nprocs: int,
               cbfunc: Any, cbdata: Any) -> int:
        nspace, rank = proc[0].nspace.decode(), int(proc[0].rank)
        text = (msg or b"").decode(errors="replace")
        # Stamped here, not on the loop: the caller is released at once, and a busy loop could otherwise date the
        # abort after the aborts of the peers that saw this task go (rank 0 names the earliest as the cause).
        self._loop.call_soon_threadsafe(self._upcalls.abort, nspace, rank, int(status), text, time.time())
        # Release the caller at once: the job's end comes from rank 0 like any other gang failure.
        return libpmix.OPERATION_SUCCEEDED

    def _fence_nb(self, procs: Any, nprocs: int, info: Any, ninfo: int, data: Any, ndata: int, cbfunc: Any,
                  cbdata: Any) -> int:
        if nprocs != 1 or procs[0].rank != libpmix.RANK_WILDCARD:
            return libpmix.ERR_NOT_SUPPORTED  # a fence over a subset of a job: no such exchange here
        for key, (flags, _) in libpmix.info_flags(info, ninfo).items():
            if flags & libpmix.INFO_REQD and key not in ("pmix.collect", "pmix.timeout"):
                return libpmix.ERR_NOT_SUPPORTED
        nspace = procs[0].nspace.decode()
        blob = ctypes.string_at(data, ndata) if data and ndata else b""
        complete = self._completer(cbfunc, cbdata)
        self._loop.call_soon_threadsafe(self._upcalls.fence, nspace, blob, complete)
        return libpmix.SUCCESS

    def _direct_modex(self, proc: Any, info: Any, ninfo: int, cbfunc: Any, cbdata: Any) -> int:
        nspace, rank = proc[0].nspace.decode(), int(proc[0].rank)
        complete = self._completer(cbfunc, cbdata)
        self._loop.call_soon_threadsafe(self._upcalls.direct_modex, nspace, rank, complete)
        return libpmix.SUCCESS

    def _group(self, op: int, grp: bytes | None, procs: Any, nprocs: int, directives: Any, ndirs: int,
               cbfunc: Any, cbdata: Any) -> int:
        if op not in (libpmix.GROUP_CONSTRUCT, libpmix.GROUP_DESTRUCT) or not nprocs or nprocs > MAX_GROUP_PROCS:
            log.warning("PMIx group %r refused: operation %d over %d procs", grp, op, nprocs)
            return libpmix.ERR_BAD_PARAM
        info = libpmix.info_flags(directives, ndirs)
        required = [key for key, (flags, _) in info.items() if flags & libpmix.INFO_REQD and key not in GROUP_KEYS]
        if required:
            log.warning("PMIx group %r refused: required directives not served: %s", grp, ", ".join(required))
            return libpmix.ERR_NOT_SUPPORTED
        if "pmix.grp.lcl" in info and _info_true(info["pmix.grp.lcl"][1]):
            return libpmix.OPERATION_SUCCEEDED  # OpenPMIx 5 tells the host of a group strictly local to this node
        ctxid, data, status = False, b"", libpmix.SUCCESS
        if "pmix.grp.actxid" in info:
            ctxid = _info_true(info["pmix.grp.actxid"][1])
        if "pmix.grp.endpt" in info and info["pmix.grp.endpt"][1].type == libpmix.BYTE_OBJECT:
            bo = info["pmix.grp.endpt"][1].data.bo
            data = ctypes.string_at(bo.bytes, bo.size) if bo.bytes and bo.size else b""
        if "pmix.loc.col.st" in info and info["pmix.loc.col.st"][1].type == libpmix.STATUS:
            status = int(info["pmix.loc.col.st"][1].data.integer)
        request = GroupRequest("construct" if op == libpmix.GROUP_CONSTRUCT else "destruct",
                               (grp or b"").decode(errors="replace"),
                               [(procs[i].nspace.decode(errors="replace"), int(procs[i].rank)) for i in range(nprocs)],
                               ctxid, data, status)
        log.debug("PMIx group %s %r: %d procs, directives %s, %d bytes of endpoint data", request.op, request.group,
                  nprocs, sorted(info), len(data))
        members = [libpmix.proc(nspace, rank) for nspace, rank in request.procs] if request.op == "construct" else []
        self._loop.call_soon_threadsafe(self._upcalls.group, request, self._group_completer(cbfunc, cbdata, members))
        return libpmix.SUCCESS

    def _dmodex_response(self, status: int, data: Any, size: int, cbdata: Any) -> None:
        reply = self._dmodex_waiters.pop(int(cbdata or 0), None)
        if reply is not None:
            blob = ctypes.string_at(data, size) if data and size else b""
            self._loop.call_soon_threadsafe(reply, int(status), blob)

    def _release(self, cbdata: Any) -> None:
        self._buffers.pop(int(cbdata or 0), None)

    # --- helpers -------------------------------------------------------------------------------------------

    def _completer(self, cbfunc: Any, cbdata: Any) -> Complete:
        # The pointers stay valid until the callback is called, once.
        address = ctypes.cast(cbfunc, ctypes.c_void_p).value
        if address is None:
            return lambda status, data: None  # the caller wants no answer; never call a NULL pointer
        callback = libpmix.ModexCbFunc(address)
        done = [False]

        def complete(status: int, data: bytes) -> None:
            if done[0] or self.closed:
                return
            done[0] = True
            if not data:
                callback(status, None, 0, cbdata, libpmix.ReleaseCbFunc(), None)
                return
            token = next(self._tokens)
            buffer = ctypes.create_string_buffer(data, len(data))
            self._buffers[token] = buffer
            callback(status, ctypes.cast(buffer, ctypes.c_void_p), len(data), cbdata, self._release_cb, token)

        return complete

    def _group_completer(self, cbfunc: Any, cbdata: Any, members: list[libpmix.Proc]) -> GroupComplete:
        address = ctypes.cast(cbfunc, ctypes.c_void_p).value
        if address is None:
            return lambda status, ctxid, data: None
        callback = libpmix.InfoCbFunc(address)
        done = [False]

        def complete(status: int, ctxid: int | None, data: bytes) -> None:
            if done[0] or self.closed:
                return
            done[0] = True
            # The final membership: OpenPMIx >= 4.2.4 sends it to the members (4.2.2 ignores it).
            entries: list[tuple[str, int, Any]] = [("pmix.grp.mbrs", libpmix.DATA_ARRAY, members)] if members else []
            if ctxid is not None:
                entries.append(("pmix.grp.ctxid", libpmix.SIZE, ctxid))
            if data:
                entries.append(("pmix.grp.endpt", libpmix.BYTE_OBJECT, data))
            # The library reads the array after the call returns, and releases it through the release callback.
            results = InfoArray(entries)
            token = next(self._tokens)
            self._buffers[token] = results
            callback(status, results.pointer() if entries else None, results.count, cbdata, self._release_cb, token)

        return complete

    def _regex(self, out: ctypes.c_void_p) -> str:
        # The regex is a NUL-terminated string (4.x "pmix:" or "raw:" prefix).
        return libpmix.take_string(out)

    def _check(self, what: str, rc: int) -> None:
        if rc not in (libpmix.SUCCESS, libpmix.OPERATION_SUCCEEDED):
            raise RuntimeError(f"{what} failed: {self.error_string(rc)}")
