"""Following jobs: stream output and events (mc run, mc attach, --watch) and wait with progress."""
from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

from minicluster.cli.common import EXIT_INTERRUPTED, exit_status
from minicluster.cli.format import console, event_line
from minicluster.client import Client

# How often a follower wakes up to notice Ctrl-C or to refresh a progress bar.
_TICK = 0.2


@contextmanager
def _counting_sigint() -> Iterator[list[int]]:
    """Count Ctrl-C instead of raising, so that no frame is ever cut in half by KeyboardInterrupt."""
    count = [0]

    def handler(signum: int, frame: object) -> None:
        count[0] += 1

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield count
    finally:
        signal.signal(signal.SIGINT, previous)


def write_chunk(stream: int, data: bytes, stdout: BinaryIO, stderr: BinaryIO) -> None:
    out = stderr if stream == 2 else stdout
    out.write(data)
    out.flush()


def follow(client: Client, job: int, *, events: bool, ctrl_c_cancels: bool) -> int:
    """Stream a job's output (all of it, from the start) and events until it is inactive.

    Returns the exit code: the job's status. With `events`, every event goes to stderr; otherwise
    only the ones a user must know about (exceptions, truncated output). Ctrl-C cancels the job
    first if `ctrl_c_cancels`, then detaches.
    """
    stdout, stderr = sys.stdout.buffer, sys.stderr.buffer
    streams = {client.request("output", job=job, follow=True),
               client.request("eventlog", job=job, **{"from": 0}, follow=True)}
    waiter = client.request("wait", jobs=[job])
    streams.add(waiter)
    result: dict[str, Any] = {}
    t0: float | None = None
    interrupts_seen = 0
    with _counting_sigint() as interrupts:
        while streams:
            while interrupts_seen < interrupts[0]:
                interrupts_seen += 1
                if ctrl_c_cancels and interrupts_seen == 1:
                    sys.stderr.write(f"mc: cancelling job {job} (Ctrl-C again to detach)\n")
                    streams.add(client.request("cancel", jobs=[job]))
                else:
                    for rid in streams:
                        client.discard(rid)
                    sys.stderr.write(f"mc: detached from job {job}; `mc attach {job}` to resume\n")
                    return EXIT_INTERRUPTED
            got = client.next_response(streams, timeout=_TICK)
            if got is None:
                continue
            rid, msg = got
            if not msg.get("more"):
                streams.discard(rid)
            for _task, stream, data in msg.get("chunks", ()):
                write_chunk(stream, data, stdout, stderr)
            for event in msg.get("events", ()):
                t0 = event[1] if t0 is None else t0
                if events or event[2] in ("exception", "output-truncated"):
                    sys.stderr.write(f"mc: job {job}: {event_line(event, t0)}\n")
                    sys.stderr.flush()
            for cancelled_job, reason in (msg.get("errors") or {}).items():
                sys.stderr.write(f"mc: cannot cancel job {cancelled_job}: {reason}\n")
            if rid == waiter and "job" in msg:
                result = msg
    return exit_status(result.get("status"), result.get("exception"))


def wait(client: Client, jobs: Sequence[int], progress: bool) -> int:
    """Wait for jobs to be inactive; the largest exit code. `progress` draws one bar of their tasks."""
    if not progress:
        return max((exit_status(r.get("status"), r.get("exception")) for r in client.wait(jobs)),
                   default=0)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    worst = 0
    remaining = set(jobs)
    counts: dict[int, dict[str, int]] = {job: {"pending": 1} for job in jobs}
    waiter = client.request("wait", jobs=list(jobs))
    label = f"job {jobs[0]}" if len(jobs) == 1 else f"{len(jobs)} jobs"
    with Progress(*columns, console=console(stderr=True)) as bar:
        task = bar.add_task(label, total=None, detail="")
        next_poll = 0.0
        while True:
            if remaining and time.monotonic() >= next_poll:
                # wait answers only when a job ends; the summaries tell how far each array got.
                for summary in client.jobs(all=True, ids=sorted(remaining), limit=len(remaining)):
                    counts[summary["id"]] = summary.get("counts") or counts[summary["id"]]
                next_poll = time.monotonic() + 0.5
            got = client.next_response((waiter,), timeout=_TICK)
            if got is not None and "job" in got[1]:
                msg = got[1]
                remaining.discard(msg["job"])
                worst = max(worst, exit_status(msg.get("status"), msg.get("exception")))
                # Its last polled counts may be stale: whatever was not seen to fail has ended too.
                last = counts[msg["job"]]
                bad = {k: last.get(k, 0) for k in ("failed", "cancelled")}
                counts[msg["job"]] = {"succeeded": sum(last.values()) - sum(bad.values()), **bad}
            _show(bar, task, counts.values())
            if got is not None and not got[1].get("more"):
                return worst


def _show(bar: Any, task: Any, counts: Iterable[dict[str, int]]) -> None:
    total = running = failed = done = 0
    for c in counts:
        total += sum(c.values())
        running += c.get("running", 0)
        failed += c.get("failed", 0)
        done += c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0)
    bar.update(task, total=total, completed=done, detail=f"{running} running, {failed} failed")
