"""The injected runtime ("the view"): a self-contained tree at RUNTIME_ROOT that brings its own
CPython, loader and libraries, so minicluster runs in an application image it knows nothing about.

Stdlib-only and import-light: the operator (which renders pods mounting the view) and the runtime
running inside the view both import it.
"""
from __future__ import annotations

import sys

# Where the view is mounted in every pod, and the prefix its ELF files and scripts are patched for.
RUNTIME_ROOT = "/mnt/minicluster"


def in_view() -> bool:
    """True when this interpreter is the view's own python (its prefix lies under RUNTIME_ROOT)."""
    return sys.prefix == RUNTIME_ROOT or sys.prefix.startswith(RUNTIME_ROOT + "/")


def python_argv() -> list[str]:
    """The argv prefix that starts another Python like this one: isolated (-I) when this one is,
    so a child of the view's python never reads the image's PYTHON* variables or user site."""
    if sys.flags.isolated:
        return [sys.executable, "-I"]
    return [sys.executable]
