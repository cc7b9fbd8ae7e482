"""Shared-memory segments MPICH leaves in /dev/shm when its ranks are killed.

MPICH 5 names a node's intra-node segment ``/dev/shm/mpich_shm_<h>_<node>``,
``h`` being the 32-bit FNV-1a hash of the kvsname in lower-case hex (checked
against the wheel: ``mc-1`` -> ``mpich_shm_f02e8aaf_0``).  Ranks that reach
``MPI_Finalize`` unlink it themselves; killed ranks do not, and the file keeps
using memory-backed /dev/shm until someone deletes it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(text: str) -> int:
    h = _FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def segments_of(kvsname: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """The MPICH segments in ``shm_dir`` that belong to ``kvsname``."""
    return sorted(shm_dir.glob(f"mpich_shm_{fnv1a32(kvsname):x}_*"))


def mapped_paths(proc: Path = PROC) -> set[str]:
    """Every file some visible process maps (from /proc/*/maps)."""
    paths: set[str] = set()
    for maps in proc.glob("[0-9]*/maps"):
        # Processes come and go while we read, and others' maps may be unreadable.
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    paths.add(fields[5].removesuffix(" (deleted)"))
    return paths


def remove_unmapped_segments(kvsname: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Delete the segments of ``kvsname`` no process maps any more; returns those removed.

    Segments still mapped (a rank that outlived its job) are left alone: deleting
    them would not free memory and could confuse a process still using the name.
    """
    segments = segments_of(kvsname, shm_dir)
    if not segments:
        return []  # the usual case: the ranks finalized; skip the /proc scan
    in_use = mapped_paths()
    removed = []
    for path in segments:
        if str(path) not in in_use:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed
