"""Opening files as a job's user in a root worker, without a fork: the calling thread's file-system ids.

A root worker runs a guest's tasks under the guest's ids (the task's child takes them before exec,
worker/spawn.py), but the task's output file and working directory are opened by the worker itself, before the
spawn, and `--mpi auto` reads the program's ELF header there. Opened as root, a guest could create or
append to a file only root may write (issue 10, item 1). `acting_as` makes the kernel check such opens as the
guest: Linux keeps a file-system uid and gid and the supplementary groups per thread, and changing the fsuid
away from 0 also drops the effective capabilities that bypass file permissions (setfsuid(2)). The thread takes the
user's groups too, those its task gets (`user_groups`: what NSS lists for the uid, as Slurm and Flux give a job), so
what the worker opens for the task is what the task could open itself. glibc's `setfsuid`/`setfsgid` change only
the calling thread; its `setgroups` changes every thread, so the groups go through the raw system call. The loop
thread switches for one `open` or `chdir` and back: nothing else runs in that thread meanwhile, and the process's
other threads (the journal writer) never see the guest's ids.
"""
from __future__ import annotations

import ctypes
import os
import platform
import pwd
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

# setgroups(2) by architecture (asm/unistd.h); where unknown, acting as a user of other groups than the worker refuses.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_QUERY = 0xFFFFFFFF  # an invalid id: setfsuid changes nothing and returns the current one

GROUPS_TTL = 60.0  # seconds a user's groups are kept before NSS is asked again
_groups: dict[tuple[int, int], tuple[float, list[int]]] = {}  # (uid, gid) -> (expires, groups)

_libc = ctypes.CDLL(None, use_errno=True)


class IdentityError(OSError):
    """The thread could not take the user's file-system ids: nothing is opened."""


def user_groups(uid: int, gid: int) -> list[int]:
    """The supplementary groups a task of `uid` with primary group `gid` gets: what NSS lists for the uid's name
    (getgrouplist, as initgroups), none for a uid without a passwd entry.  Cached for GROUPS_TTL seconds per
    (uid, gid), so a spawn asks NSS (maybe a directory server) once a minute per user, not once per task."""
    now = time.monotonic()
    cached = _groups.get((uid, gid))
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = []
    for key in [key for key, (expires, _) in _groups.items() if expires <= now]:
        del _groups[key]
    _groups[(uid, gid)] = (now + GROUPS_TTL, groups)
    return groups


@contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """File-system ids `uid`/`gid` and the user's groups (`user_groups`) for the calling thread, inside the block."""
    groups = os.getgroups()
    wanted = user_groups(uid, gid)
    change_groups = sorted(set(groups) - {gid}) != sorted(set(wanted) - {gid})
    if change_groups and platform.machine() not in _SYS_SETGROUPS:
        raise IdentityError(f"cannot set this thread's supplementary groups on {platform.machine()}")
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        if _libc.setfsuid(_QUERY) != uid or _libc.setfsgid(_QUERY) != gid:
            raise IdentityError(f"cannot take the file-system ids of uid {uid} gid {gid}")
        if change_groups:
            _set_thread_groups(wanted)
        yield
    finally:
        if change_groups:
            _set_thread_groups(groups)
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


def acting_as_user(user: tuple[int, int] | None) -> AbstractContextManager[None]:
    """`acting_as(uid, gid)` for a task of another user; nothing (the worker's own ids) when `user` is None."""
    return acting_as(*user) if user is not None else nullcontext()


def _set_thread_groups(groups: list[int]) -> None:
    array = (ctypes.c_uint * len(groups))(*groups)
    if _libc.syscall(_SYS_SETGROUPS[platform.machine()], len(groups), array) != 0:
        errno = ctypes.get_errno()
        raise IdentityError(errno, f"setgroups: {os.strerror(errno)}")
