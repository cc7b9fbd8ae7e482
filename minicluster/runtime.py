"""The injected runtime ("the view"): a self-contained tree at RUNTIME_ROOT that brings its own
CPython, loader and libraries, so minicluster runs in an application image it knows nothing about.

Stdlib-only and import-light: the operator (which renders pods mounting the view) and the runtime
running inside the view both import it.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping

# Where the view is mounted in every pod, and the prefix its ELF files and scripts are patched for.
RUNTIME_ROOT = "/mnt/minicluster"


def in_view() -> bool:
    """True when this interpreter is the view's own python (its prefix lies under RUNTIME_ROOT)."""
    return _in_root(sys.prefix)


def python_argv() -> list[str]:
    """The argv prefix that starts another Python like this one: isolated (-I) when this one is,
    so a child of the view's python never reads the image's PYTHON* variables or user site."""
    if sys.flags.isolated:
        return [sys.executable, "-I"]
    return [sys.executable]


# Variables the runtime may set for its own process only (worker/pmi/libpmix.py: the view's PMIx plugins), and
# those that would put the view's python or libraries into a program of the image.
_OWN = ("PYTHONHOME", "PMIX_PKGLIBDIR", "PMIX_PKGDATADIR")
_SEARCH_PATHS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")


def _in_root(path: str) -> bool:
    return path == RUNTIME_ROOT or path.startswith(RUNTIME_ROOT + "/")


def command_env(environ: Mapping[str, str], view: bool | None = None) -> dict[str, str]:
    """The environment for the image's own programs (the batch command, and through it the tasks): `environ`
    with nothing of the view in it and, when this runs from the view, RUNTIME_ROOT/bin last on PATH, so they call
    `mc` and `mc-submit` without the view shadowing any command of the image."""
    env = {name: value for name, value in environ.items() if not (name in _OWN and _in_root(value))}
    for name in _SEARCH_PATHS:
        if name in env:
            kept = [entry for entry in env[name].split(os.pathsep) if not _in_root(entry)]
            if kept:
                env[name] = os.pathsep.join(kept)
            else:
                del env[name]
    if in_view() if view is None else view:
        env["PATH"] = os.pathsep.join(filter(None, [env.get("PATH", os.defpath), RUNTIME_ROOT + "/bin"]))
    return env
