"""What a test needs from the host beyond Python and the `[test]` extra, and the host's processes as /proc shows them.

A test that needs a host command or root says so with `@pytest.mark.needs("ip", root=True)` (checked by
tests/conftest.py) or calls `need(...)`: without it the test is skipped with the reason, or fails when CI is set,
since CI installs every tool and runs as root (.ci/run). Processes are found by reading /proc, not with procps'
pgrep/ps, which a minimal Debian lacks."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def skip_unless_ready(reason: str | None) -> None:
    """With a `reason` the test cannot run: skip it, or fail it when CI is set (CI must run every tier)."""
    if reason and os.environ.get("CI"):
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)


def need(*tools: str, root: bool = False) -> None:
    """Skip (fail under CI) unless every command in `tools` is on PATH and, with `root`, we are root."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        skip_unless_ready(f"needs {', '.join(missing)} on PATH (see the README's test section)")
    if root and os.geteuid() != 0:
        skip_unless_ready("needs root (CI runs as root)")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state is [0], ppid [1])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> list[int]:
    """The live children of `pid`, oldest first."""
    found = []
    for other in pids():
        try:
            fields = _stat_fields(other)
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append((int(fields[19]), other))  # field 22 of stat: start time
    return [other for _, other in sorted(found)]


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def with_cmdline(marker: str) -> list[str]:
    """`pid cmdline` of each live process (but this one) whose command line contains `marker`."""
    return [f"{pid} {line}" for pid in pids() if pid != os.getpid() and marker in (line := cmdline(pid))
            and alive(pid)]


def with_environ(entry: str) -> set[int]:
    """The live processes whose environment holds `entry` (`KEY=value`); unreadable ones are passed over."""
    wanted, found = entry.encode(), set()
    for pid in pids():
        try:
            if wanted in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and alive(pid):
                found.add(pid)
        except OSError:
            pass
    return found


def traces(mounts_under: Path) -> dict[str, set[str]]:
    """What a test can leave on the host besides processes: mount points under `mounts_under` (the session's
    temporary directory, where tests mount), users, groups and named network namespaces."""
    def names(path: str) -> set[str]:
        return {line.split(":", 1)[0] for line in Path(path).read_text().splitlines() if line}

    base = str(mounts_under)
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    netns = Path("/run/netns")
    return {
        "mount": {p for p in points if p == base or p.startswith(f"{base}/")},
        "user": names("/etc/passwd"),
        "group": names("/etc/group"),
        "network namespace": set(os.listdir(netns)) if netns.is_dir() else set(),
    }

