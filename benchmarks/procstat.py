"""What the benchmarks read from /proc: a process's (or one thread's) CPU seconds, and its sizes.

Benchmarks run as scripts, so this directory is on their path: `from procstat import cpu_seconds`.
"""
from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of process `pid`, or of its thread `tid` alone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    # The command name, in parentheses, may hold spaces: the fields are counted after its closing one.
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, key: str) -> int:
    """One size from /proc/PID/status, in KiB: VmRSS, VmHWM, ..."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"no {key} for pid {pid}")


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of `pid`, by thread name (the main thread is "main")."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out["main" if tid == str(pid) else f"{name}-{tid}"] = cpu_seconds(pid, int(tid))
        except FileNotFoundError:
            continue  # the thread ended between listing and reading
    return out
