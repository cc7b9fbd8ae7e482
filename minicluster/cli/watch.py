"""Following jobs: stream output and events (mc run, mc attach, --watch) and wait with progress."""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

from minicluster.cli.common import EXIT_INTERRUPTED, exit_status
from minicluster.cli.feed import StdinFeeder
from minicluster.cli.format import console, event_line
from minicluster.cli.output import OutputWriter, task_labels
from minicluster.cli.reasons import SHOWN, explain, report, task_errors
from minicluster.client import Client, ClientError
from minicluster.model.text import printable

# How often a follower wakes up to notice Ctrl-C or to refresh a progress bar.
_TICK = 0.2
# Signals that end `mc run` the way they end srun: a closed terminal or dropped ssh session (SIGHUP), `timeout`
# or `kill` (SIGTERM), Ctrl-\ (SIGQUIT). Its job is cancelled before it exits with 128 + the signal.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# How long `mc run`, ended by one of them, waits for the broker to answer its cancel.
CANCEL_ANSWER_WAIT = 10.0


class Interrupts:
    """Signals noted by caught_signals(): how many Ctrl-C, and the first ending signal, if any."""

    __slots__ = ("sigint", "ending")

    def __init__(self) -> None:
        self.sigint = 0
        self.ending: int | None = None


@contextmanager
def caught_signals(ending: bool = False) -> Iterator[Interrupts]:
    """Count Ctrl-C (and with `ending`, note the first of ENDING_SIGNALS) instead of dying of them, so that no
    frame is ever cut in half: the follower acts on them between two responses."""
    noted = Interrupts()

    def on_sigint(signum: int, frame: object) -> None:
        noted.sigint += 1

    def on_ending(signum: int, frame: object) -> None:
        noted.ending = noted.ending or signum

    wanted = {signal.SIGINT: on_sigint, **dict.fromkeys(ENDING_SIGNALS if ending else (), on_ending)}
    previous = {signum: signal.signal(signum, handler) for signum, handler in wanted.items()}
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def follow(client: Client, job: int, *, prog: str, events: bool, ctrl_c_cancels: bool, label: bool = False,
           stdin_fd: int | None = None, array: str | None = None, interrupts: Interrupts | None = None) -> int:
    """Stream a job's output (all of it, from the start) and events until it is inactive.

    Returns the exit code: the job's status. With `events`, every event goes to stderr; otherwise
    only the ones a user must know about (exceptions). `label` puts the task rank (array: index) before each
    line; `stdin_fd` is forwarded to the job's stdin. Ctrl-C cancels the job first if `ctrl_c_cancels`, then
    detaches; `interrupts` is what a caught_signals() the caller entered before submitting noted, so a
    signal between the submit and this call still counts: an ending signal it notes (mc run's) cancels the job
    and returns 128 + the signal. A failed job's tasks that could not run are named at the end.
    """
    display = _Display(prog, job, events, task_labels(array) if label else None)
    feeder = StdinFeeder(client, job, stdin_fd) if stdin_fd is not None else None
    streams = {client.request("output", job=job, follow=True),
               client.request("eventlog", job=job, **{"from": 0}, follow=True)}
    waiter = client.request("wait", jobs=[job])
    streams.add(waiter)
    result: dict[str, Any] = {}
    interrupts_seen = 0
    with caught_signals() if interrupts is None else nullcontext(interrupts) as interrupts:
        while streams:
            if interrupts.ending is not None:
                return _cancel_and_leave(client, job, prog, interrupts.ending, streams)
            while interrupts_seen < interrupts.sigint:
                interrupts_seen += 1
                if ctrl_c_cancels and interrupts_seen == 1:
                    sys.stderr.write(f"{prog}: cancelling job {job} (Ctrl-C again to detach)\n")
                    streams.add(client.request("cancel", jobs=[job]))
                else:
                    for rid in streams:
                        client.discard(rid)
                    sys.stderr.write(f"{prog}: detached from job {job}; `mc attach {job}` to resume\n")
                    return EXIT_INTERRUPTED
            wake = feeder.wake_fds() if feeder is not None and not result else ()
            got = client.next_response(streams, timeout=_TICK, wake=wake)
            if feeder is not None:
                if wake and got is None:
                    feeder.read_and_send()
                feeder.answered()
            if got is None:
                continue
            rid, msg = got
            if not msg.get("more"):
                streams.discard(rid)
            try:
                display.show(msg)
            except OSError:
                # A closed terminal fails our writes (EIO) as its SIGHUP arrives: the signal decides.
                signum = _ending_signal(interrupts)
                if signum is None:
                    raise
                return _cancel_and_leave(client, job, prog, signum, streams)
            if rid == waiter and "job" in msg:
                result = msg
    code = exit_status(result.get("status"), result.get("exception"))
    if code:
        report(prog, job, task_errors(client, job, array=array is not None))
    return code


def leave_on_ending_signals() -> None:
    """For a follower that does not own its job (mc-submit --wait and --watch, like `flux submit --wait`): an
    ending signal leaves at once with 128 + the signal, unwinding cleanly (a progress bar gives the terminal
    its cursor back, no traceback); the job goes on."""
    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in ENDING_SIGNALS:
        signal.signal(signum, leave)


def _ending_signal(interrupts: Interrupts) -> int | None:
    # A call: a signal whose handler is still pending runs before this returns.
    return interrupts.ending


def _cancel_and_leave(client: Client, job: int, prog: str, signum: int, streams: set[int]) -> int:
    """mc run was told to end (ENDING_SIGNALS): cancel its job, as srun and flux run do, then return 128 +
    the signal once the broker answered (or after CANCEL_ANSWER_WAIT). The job's end is not waited for."""
    for rid in streams:
        client.discard(rid)
    with suppress(OSError):  # stderr may be the terminal that just closed
        sys.stderr.write(f"{prog}: {signal.Signals(signum).name}: cancelling job {job}\n")
        sys.stderr.flush()
    with suppress(ClientError, OSError):  # a broker gone away cannot be told; we leave all the same
        client.next_response([client.request("cancel", jobs=[job])], timeout=CANCEL_ANSWER_WAIT)
    _drop_unwritable_output()
    return 128 + signum


def _drop_unwritable_output() -> None:
    """What stdout and stderr still hold for a terminal that closed can never be written; Python would try again
    at exit and, failing, exit 120 instead of our status (seen in a minimal Debian)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            with suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)


class _Display:
    """What follow() shows of each response: output, where it went or that it was cut, events, cancel errors."""

    def __init__(self, prog: str, job: int, events: bool, label: Callable[[int], bytes] | None) -> None:
        self.prog = prog
        self.job = job
        self.events = events
        self.writer = OutputWriter(sys.stdout.buffer, sys.stderr.buffer, label)
        self.t0: float | None = None

    def show(self, msg: dict[str, Any]) -> None:
        for task, stream, data in msg.get("chunks", ()):
            self.writer.write(task, stream, data)
        if msg.get("files"):
            report(self.prog, self.job, [output_files_note(self.job, msg["files"])])
        if msg.get("truncated"):
            report(self.prog, self.job, [truncated_note(msg["truncated"])])
        for event in msg.get("events", ()):
            self.t0 = event[1] if self.t0 is None else self.t0
            if self.events or event[2] == "exception":
                sys.stderr.write(f"{self.prog}: job {self.job}: {event_line(event, self.t0)}\n")
                sys.stderr.flush()
        for cancelled_job, reason in (msg.get("errors") or {}).items():
            sys.stderr.write(f"{self.prog}: cannot cancel job {cancelled_job}: {printable(reason)}\n")


def output_files_note(job: int, template: str) -> str:
    return f"output went to {template.replace('{id}', str(job))} on the nodes that ran it (--output), not to mc"


def truncated_note(cap: int) -> str:
    return f"output truncated at {cap} bytes (output_cap); the rest was not kept"


def wait(client: Client, jobs: Sequence[int], progress: bool, prog: str) -> int:
    """Wait for jobs to be inactive; the largest exit code. `progress` draws one bar of their tasks.

    The first failed jobs are explained at the end (the exception that ended them, tasks that could not run).
    """
    if progress:
        results = _wait_with_progress(client, jobs)
    else:
        results = [(r["job"], exit_status(r.get("status"), r.get("exception"))) for r in client.wait(jobs)]
    failed = [job for job, code in results if code]
    for job in failed[:SHOWN]:
        explain(client, prog, job, with_exception=True)
    if len(failed) > SHOWN:
        sys.stderr.write(f"{prog}: {len(failed) - SHOWN} more job(s) failed\n")
    return max((code for _job, code in results), default=0)


def _wait_with_progress(client: Client, jobs: Sequence[int]) -> list[tuple[int, int]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    results: list[tuple[int, int]] = []
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
                results.append((msg["job"], exit_status(msg.get("status"), msg.get("exception"))))
                # Its last polled counts may be stale: whatever was not seen to fail has ended too.
                last = counts[msg["job"]]
                bad = {k: last.get(k, 0) for k in ("failed", "cancelled")}
                counts[msg["job"]] = {"succeeded": sum(last.values()) - sum(bad.values()), **bad}
            _show(bar, task, counts.values())
            if got is not None and not got[1].get("more"):
                return results


def _show(bar: Any, task: Any, counts: Iterable[dict[str, int]]) -> None:
    total = running = failed = done = 0
    for c in counts:
        total += sum(c.values())
        running += c.get("running", 0)
        failed += c.get("failed", 0)
        done += c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0)
    bar.update(task, total=total, completed=done, detail=f"{running} running, {failed} failed")
