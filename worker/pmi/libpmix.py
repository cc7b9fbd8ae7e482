"""ctypes view of the OpenPMIx server library (libpmix.so.2, OpenPMIx 4.2 ABI).

Only what a host that serves PMIx to Open MPI needs: the types of pmix_common.h the server API passes
(proc, value, info, data array), the host module of pmix_server.h (six of its callbacks), and the
server calls.  Struct sizes and offsets are checked against the C headers by
tests/unit/test_libpmix_abi.py whenever the headers (libpmix-dev) and a C compiler are present.

Why ctypes and not Debian's python3-pmix: see docs/mpi.md, "Why ctypes".
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, Union, c_bool, c_char, c_char_p, c_int, c_size_t,
                    c_uint16, c_uint32, c_void_p)
from typing import Any

from minicluster import runtime

LIBRARY = "libpmix.so.2"
# The worker's environment may name another libpmix.so.2 to serve from (docs/mpi.md, "PMIx groups").
LIBRARY_VARIABLE = "MC_LIBPMIX"
# Where the injected runtime keeps its PMIx (manifest.json's "pmix"): lib/libpmix.so.2, lib/pmix/*.so, share/pmix/.
VIEW_PMIX = f"{runtime.RUNTIME_ROOT}/lib/pmix"

MAX_NSLEN = 255
MAX_KEYLEN = 511

# pmix_status_t values used here.
SUCCESS = 0
ERROR = -1
ERR_NOT_SUPPORTED = -47
ERR_NOT_FOUND = -46
ERR_BAD_PARAM = -27
OPERATION_SUCCEEDED = -157

# pmix_data_type_t values used here.
UNDEF = 0
BOOL = 1
STRING = 3
SIZE = 4
UINT16 = 13
UINT32 = 14
PROC = 22
INFO = 24
BYTE_OBJECT = 27
DATA_ARRAY = 39
PROC_RANK = 40
STATUS = 20

RANK_WILDCARD = 0xFFFFFFFE
INFO_REQD = 0x00000001


class Proc(Structure):
    _fields_ = [("nspace", c_char * (MAX_NSLEN + 1)), ("rank", c_uint32)]


class ByteObject(Structure):
    _fields_ = [("bytes", c_void_p), ("size", c_size_t)]


class DataArray(Structure):
    _fields_ = [("type", c_uint16), ("size", c_size_t), ("array", c_void_p)]


class _ValueData(Union):
    # The C union's largest member is 24 bytes (pmix_envar_t); `raw` pins that size.
    _fields_ = [("flag", c_bool), ("string", c_char_p), ("size", c_size_t), ("uint16", c_uint16),
                ("uint32", c_uint32), ("rank", c_uint32), ("integer", c_int), ("darray", POINTER(DataArray)),
                ("bo", ByteObject),
                ("raw", c_char * 24)]


class Value(Structure):
    _fields_ = [("type", c_uint16), ("data", _ValueData)]


class Info(Structure):
    _fields_ = [("key", c_char * (MAX_KEYLEN + 1)), ("flags", c_uint32), ("value", Value)]


# Callback types of pmix_common.h / pmix_server.h.
OpCbFunc = CFUNCTYPE(None, c_int, c_void_p)
ReleaseCbFunc = CFUNCTYPE(None, c_void_p)
ModexCbFunc = CFUNCTYPE(None, c_int, c_void_p, c_size_t, c_void_p, ReleaseCbFunc, c_void_p)
DmodexResponseFn = CFUNCTYPE(None, c_int, c_void_p, c_size_t, c_void_p)

ClientConnectedFn = CFUNCTYPE(c_int, POINTER(Proc), c_void_p, OpCbFunc, c_void_p)
ClientFinalizedFn = CFUNCTYPE(c_int, POINTER(Proc), c_void_p, OpCbFunc, c_void_p)
AbortFn = CFUNCTYPE(c_int, POINTER(Proc), c_void_p, c_int, c_char_p, POINTER(Proc), c_size_t, OpCbFunc, c_void_p)
FenceNbFn = CFUNCTYPE(c_int, POINTER(Proc), c_size_t, POINTER(Info), c_size_t, c_void_p, c_size_t, ModexCbFunc,
                      c_void_p)
DirectModexFn = CFUNCTYPE(c_int, POINTER(Proc), POINTER(Info), c_size_t, ModexCbFunc, c_void_p)
# pmix_info_cbfunc_t: status, info, ninfo, cbdata, release_fn, release_cbdata.
InfoCbFunc = CFUNCTYPE(None, c_int, POINTER(Info), c_size_t, c_void_p, ReleaseCbFunc, c_void_p)
# pmix_server_grp_fn_t: op (GROUP_CONSTRUCT/DESTRUCT), group id, procs, nprocs, directives, ndirs, cbfunc, cbdata.
GroupFn = CFUNCTYPE(c_int, c_int, c_char_p, POINTER(Proc), c_size_t, POINTER(Info), c_size_t, InfoCbFunc, c_void_p)
GROUP_CONSTRUCT = 0
GROUP_DESTRUCT = 1

# pmix_server_module_t: 28 function pointers in OpenPMIx 4 (the headers here), 29 in 5 (`session_control` added),
# which a worker may load instead (docs/mpi.md, "PMIx groups"): the server copies as many as it knows, so the struct
# has room for 5's and leaves the last NULL.  The first five and `group` (the 26th) are served.
MODULE_SLOTS = 29
GROUP_SLOT = 25


class ServerModule(Structure):
    _fields_ = [("client_connected", ClientConnectedFn), ("client_finalized", ClientFinalizedFn),
                ("abort", AbortFn), ("fence_nb", FenceNbFn), ("direct_modex", DirectModexFn),
                ("unused", c_void_p * (GROUP_SLOT - 5)), ("group", GroupFn),
                ("unused_after", c_void_p * (MODULE_SLOTS - GROUP_SLOT - 1))]


class PMIxUnavailable(RuntimeError):
    """libpmix cannot be loaded here."""


def _prototype(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def load() -> ctypes.CDLL:
    """Load libpmix and declare the calls used; PMIxUnavailable if it is not installed.  The one MC_LIBPMIX names if
    set; run from the injected runtime, its own libpmix (never the image's: PMIx clients talk to servers of other
    versions since 2.1)."""
    explicit = os.environ.get(LIBRARY_VARIABLE)
    if explicit:
        try:
            lib = ctypes.CDLL(explicit)
        except OSError as exc:
            raise PMIxUnavailable(f"{LIBRARY_VARIABLE}={explicit}: {exc}") from None
    elif runtime.in_view():
        lib = _open_view(VIEW_PMIX)
    else:
        try:
            lib = ctypes.CDLL(LIBRARY)
        except OSError:
            found = ctypes.util.find_library("pmix")
            if found is None:
                raise PMIxUnavailable(f"{LIBRARY} not found (Debian: apt-get install libpmix2)") from None
            lib = ctypes.CDLL(found)
    p_info = POINTER(Info)
    _prototype(lib, "PMIx_Get_version", c_char_p)
    _prototype(lib, "PMIx_Error_string", c_char_p, c_int)
    _prototype(lib, "PMIx_server_init", c_int, POINTER(ServerModule), p_info, c_size_t)
    _prototype(lib, "PMIx_server_finalize", c_int)
    _prototype(lib, "PMIx_generate_regex", c_int, c_char_p, POINTER(c_void_p))
    _prototype(lib, "PMIx_generate_ppn", c_int, c_char_p, POINTER(c_void_p))
    _prototype(lib, "PMIx_server_register_nspace", c_int, c_char_p, c_int, p_info, c_size_t, OpCbFunc, c_void_p)
    _prototype(lib, "PMIx_server_deregister_nspace", None, c_char_p, OpCbFunc, c_void_p)
    _prototype(lib, "PMIx_server_register_client", c_int, POINTER(Proc), c_uint32, c_uint32, c_void_p, OpCbFunc,
               c_void_p)
    _prototype(lib, "PMIx_server_deregister_client", None, POINTER(Proc), OpCbFunc, c_void_p)
    _prototype(lib, "PMIx_server_setup_fork", c_int, POINTER(Proc), POINTER(POINTER(c_char_p)))
    _prototype(lib, "PMIx_server_dmodex_request", c_int, POINTER(Proc), DmodexResponseFn, c_void_p)
    return lib


def _open_view(prefix: str) -> ctypes.CDLL:
    """The view's copy of Debian's libpmix2 (images/runtime/mkview.py).  Its plugins and help texts are looked up
    where Debian installed them unless PMIX_PKGLIBDIR/PMIX_PKGDATADIR say otherwise (libpmix 4.2 reads those, not
    PMIX_MCA_mca_base_component_path).  Set in this process only: PMIx_server_setup_fork does not pass them to
    clients, and the image's programs get an environment without them (runtime.command_env)."""
    library = f"{prefix}/lib/{LIBRARY}"
    if not os.path.exists(library):
        raise PMIxUnavailable(f"the runtime has no {library}")
    os.environ["PMIX_PKGLIBDIR"] = f"{prefix}/lib/pmix"
    os.environ["PMIX_PKGDATADIR"] = f"{prefix}/share/pmix"
    return ctypes.CDLL(library)


libc = ctypes.CDLL(None)
libc.free.argtypes = [c_void_p]
libc.free.restype = None
libc.malloc.argtypes = [c_size_t]
libc.malloc.restype = c_void_p


def take_string(ptr: c_void_p) -> str:
    """A malloc'ed C string returned by libpmix, as str; the memory is freed."""
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        libc.free(ptr)


def take_env(env: Any) -> dict[str, str]:
    """A malloc'ed NULL-terminated `char **` environment (PMIx_server_setup_fork), as a dict; freed."""
    out: dict[str, str] = {}
    if not env:
        return out
    i = 0
    while env[i] is not None:
        name, _, value = env[i].decode().partition("=")
        out[name] = value
        libc.free(ctypes.cast(env, POINTER(c_void_p))[i])
        i += 1
    libc.free(ctypes.cast(env, c_void_p))
    return out


def proc(nspace: str, rank: int) -> Proc:
    return Proc(nspace.encode(), rank)


class InfoArray:
    """A pmix_info_t[] built from (key, type, value) triples; keeps everything it points to alive."""

    def __init__(self, entries: list[tuple[str, int, Any]]) -> None:
        self._keep: list[Any] = []
        self.array = (Info * max(1, len(entries)))()
        self.count = len(entries)
        for index, (key, kind, value) in enumerate(entries):
            info = self.array[index]
            info.key = key.encode()
            info.value.type = kind
            self._load(info.value.data, kind, value)

    def _load(self, data: _ValueData, kind: int, value: Any) -> None:
        if kind == STRING:
            raw = ctypes.create_string_buffer(str(value).encode())
            self._keep.append(raw)
            data.string = ctypes.cast(raw, c_char_p)
        elif kind == BOOL:
            data.flag = bool(value)
        elif kind == UINT16:
            data.uint16 = int(value)
        elif kind in (UINT32, PROC_RANK):
            data.uint32 = int(value)
        elif kind == SIZE:
            data.size = int(value)
        elif kind == BYTE_OBJECT:
            # malloc'ed, not kept: the library takes the bytes over and frees them (PMIX_LOAD_BUFFER, as it reads
            # a group's endpoint data), so only hand it a byte object it is known to consume.
            raw = libc.malloc(max(1, len(value)))
            if not raw:
                raise MemoryError("malloc failed")
            ctypes.memmove(raw, bytes(value), len(value))
            data.bo = ByteObject(raw, len(value))
        elif kind == DATA_ARRAY and value and isinstance(value[0], Proc):
            procs = (Proc * len(value))(*value)
            darray = DataArray(PROC, len(value), ctypes.cast(procs, c_void_p))
            self._keep += [procs, darray]
            data.darray = ctypes.pointer(darray)
        elif kind == DATA_ARRAY:
            inner = value if isinstance(value, InfoArray) else InfoArray(value)
            darray = DataArray(INFO, inner.count, ctypes.cast(inner.array, c_void_p))
            self._keep += [inner, darray]
            data.darray = ctypes.pointer(darray)
        else:
            raise ValueError(f"unsupported PMIx data type {kind}")

    def pointer(self) -> Any:
        return ctypes.cast(self.array, POINTER(Info))


def info_flags(info: Any, count: int) -> dict[str, tuple[int, Value]]:
    """Read an incoming pmix_info_t[]: key -> (flags, value)."""
    return {info[i].key.decode(errors="replace"): (info[i].flags, info[i].value) for i in range(count)}


def error_string(lib: ctypes.CDLL, status: int) -> str:
    text = lib.PMIx_Error_string(status)
    return text.decode() if text else f"PMIx status {status}"

