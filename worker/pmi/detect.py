"""`--mpi auto`: which PMI a program wants, from the shared libraries its ELF file names (DT_NEEDED).

Open MPI (4.x and 5.x) ships `libmpi.so.40` and bootstraps only through PMIx; MPICH and its
derivatives ship `libmpi.so.12` / `libmpich.so.12` and speak PMI-1.  A program that names neither
(a script, an interpreter such as python running mpi4py, a static binary) gives no answer.
"""
from __future__ import annotations

import os
import shutil
import stat
import struct

from worker.asuser import acting_as_user

OPEN_MPI = ("libmpi.so.40", "libopen-pal.so", "libopen-rte.so")
MPICH = ("libmpi.so.12", "libmpich.so.12", "libmpicxx.so.12", "libmpifort.so.12")
_PT_DYNAMIC = 2
_DT_NEEDED = 1
_DT_STRTAB = 5
_PT_LOAD = 1
# Headers and the dynamic section are read, never the whole file.
_MAX_READ = 1 << 20


def resolve_program(argv0: str, path: str | None, cwd: str | None) -> str | None:
    """The file `argv0` names, looked up on the job's PATH as exec would."""
    if "/" in argv0:
        full = argv0 if os.path.isabs(argv0) else os.path.join(cwd or os.getcwd(), argv0)
        return full if os.path.isfile(full) else None
    return shutil.which(argv0, path=path or os.defpath)


def needed_libraries(path: str, user: tuple[int, int] | None = None) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file; [] for anything else.

    The job names the file: it is opened as the job's `user` (uid, gid) when that is not the worker's own,
    without blocking (a FIFO would stall the worker's loop), and read only if it is a regular file.
    """
    try:
        with acting_as_user(user):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return []
            phoff, phentsize, phnum = struct.unpack_from("<Q", head, 32)[0], *struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(min(phentsize * phnum, _MAX_READ))
            headers = [struct.unpack_from("<IIQQQQQQ", table, i * phentsize) for i in range(len(table) // phentsize)]
            dynamic = next((h for h in headers if h[0] == _PT_DYNAMIC), None)
            if dynamic is None:
                return []
            f.seek(dynamic[2])
            raw = f.read(min(dynamic[5], _MAX_READ))
            entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
            strtab = next((v for tag, v in entries if tag == _DT_STRTAB), None)
            if strtab is None:
                return []
            # DT_STRTAB is a virtual address: map it to a file offset through the PT_LOAD that holds it.
            load = next((h for h in headers if h[0] == _PT_LOAD and h[3] <= strtab < h[3] + h[5]), None)
            if load is None:
                return []
            names = []
            for tag, value in entries:
                if tag == _DT_NEEDED:
                    f.seek(strtab - load[3] + load[2] + value)
                    names.append(f.read(256).split(b"\0", 1)[0].decode(errors="replace"))
            return names
    except (OSError, ValueError, struct.error, ZeroDivisionError):  # a truncated or hostile header
        return []


def pmi_for(argv0: str, path: str | None, cwd: str | None, user: tuple[int, int] | None = None) -> str | None:
    """"pmix" for an Open MPI program, "pmi1" for an MPICH-family one, None when the file does not say.

    The job's PATH and cwd are walked as the job's `user` too: a guest learns nothing of directories it may not
    search, and the file is only read, never run, by the worker."""
    with acting_as_user(user):
        program = resolve_program(argv0, path, cwd)
    if program is None:
        return None
    libs = needed_libraries(program, user)
    if any(lib.startswith(OPEN_MPI) for lib in libs):
        return "pmix"
    if any(lib.startswith(MPICH) for lib in libs):
        return "pmi1"
    return None
