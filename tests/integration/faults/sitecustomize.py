"""Faults injected into a rank's process for tests: with this directory on PYTHONPATH, Python's `site` imports
this module at start-up, before the rank runs.

* MC_TEST_CLOCK_SHIFT=FILE: time.time() is ahead by the seconds written in FILE (read again at each call), as
  when NTP or an administrator moves the wall clock; the monotonic clock does not move.
* MC_TEST_FAIL=MODULE:CLASS.METHOD:FILE: that method raises RuntimeError("injected fault") while FILE exists.
"""
from __future__ import annotations

import functools
import importlib
import os
import time
from typing import Any


def _shift_wall_clock(path: str) -> None:
    real = time.time

    def shifted() -> float:
        try:
            with open(path) as f:
                return real() + float(f.read() or 0)
        except (OSError, ValueError):
            return real()

    time.time = shifted


def _inject_failure(spec: str) -> None:
    module, qualname, trigger = spec.split(":", 2)
    class_name, method = qualname.split(".")
    cls = getattr(importlib.import_module(module), class_name)
    original = getattr(cls, method)

    @functools.wraps(original)
    def failing(*args: Any, **kwargs: Any) -> Any:
        if os.path.exists(trigger):
            raise RuntimeError("injected fault")
        return original(*args, **kwargs)

    setattr(cls, method, failing)


if os.environ.get("MC_TEST_CLOCK_SHIFT"):
    _shift_wall_clock(os.environ["MC_TEST_CLOCK_SHIFT"])
if os.environ.get("MC_TEST_FAIL"):
    _inject_failure(os.environ["MC_TEST_FAIL"])
