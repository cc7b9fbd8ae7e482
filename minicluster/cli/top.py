"""`mc top`: a live view of the instance, like `flux top` or HyperQueue's dashboard.

Each frame is three requests (`status`, `resources`, `jobs`): jobs by state, tasks started and ended per second
(from the broker's counters between two frames), ranks and their health, and the jobs running the most tasks.
On a terminal it redraws in place (`q` or Ctrl-C quits); piped, it prints frames one after another.
"""
from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from minicluster.cli.argparser import Parser
from minicluster.cli.format import RANK_STYLE, console, duration, free_used, shown, styled, table, user_name
from minicluster.cli.options import non_negative_int
from minicluster.client import Client
from minicluster.model.text import printable

HELP = "live view: jobs by state, tasks/s, ranks and their health, the busiest jobs (q quits)"
QUEUE_STATES = ("DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE")
BUSIEST = 10
# Above this many ranks, healthy ranks are counted rather than listed.
RANKS_LISTED = 16


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc top", description=HELP)
    parser.add_argument("-d", "--delay", type=float, default=2.0, metavar="SECONDS", help="between frames (2)")
    parser.add_argument("-n", "--iterations", type=non_negative_int, default=0, metavar="N",
                        help="stop after N frames (default: until q or Ctrl-C)")
    args = parser.parse_args(argv)
    if not 0 < args.delay <= 3600:  # NaN too
        parser.error(f"--delay must be a number of seconds above 0 and at most 3600, got {args.delay}")
    with Client() as client:
        frames = _frames(client, args.delay, args.iterations)
        if not sys.stdout.isatty():
            for frame in frames:
                console().print(frame)
            return 0
        with _keys() as pressed, Live(console=console(), auto_refresh=False, screen=False) as live:
            for frame in frames:
                live.update(frame, refresh=True)
                if pressed(args.delay):
                    break
    return 0


def _frames(client: Client, delay: float, iterations: int) -> Iterator[Group]:
    previous: tuple[float, dict[str, int]] | None = None
    count = 0
    while not iterations or count < iterations:
        if count and not sys.stdout.isatty():
            time.sleep(delay)
        now = time.monotonic()
        status = client.status()
        snapshot = {"status": status, "resources": client.resources(), "jobs": client.jobs(limit=10_000)}
        counters = status.get("tasks") or {}
        rates = _rates(previous, now, counters)
        previous = (now, counters)
        count += 1
        yield render(snapshot, rates, time.time())


def _rates(previous: tuple[float, dict[str, int]] | None, now: float, counters: dict[str, int]) -> dict[str, float]:
    if previous is None or now <= previous[0]:
        return {}
    span = now - previous[0]
    return {k: max(0, counters.get(k, 0) - previous[1].get(k, 0)) / span for k in ("started", "ended")}


def render(snapshot: dict[str, Any], rates: dict[str, float], now: float) -> Group:
    """One frame from the three answers (pure: the tests render it from real ones)."""
    status = snapshot["status"]
    ranks = status.get("ranks") or []
    health: dict[str, int] = {}
    for r in ranks:
        health[r.get("state", "?")] = health.get(r.get("state", "?"), 0) + 1
    started = f"{rates['started']:.1f}" if "started" in rates else "-"
    ended = f"{rates['ended']:.1f}" if "ended" in rates else "-"
    header = Text.assemble(
        (printable(str(status.get("name", "?"))), "bold"),
        f"  size {status.get('size', '?')}  epoch {status.get('epoch', '?')}  ",
        "ranks: " + ", ".join(f"{n} {state}" for state, n in sorted(health.items())),
        f"\ntasks/s: {started} started, {ended} ended")
    return Group(header, _queue_table(status.get("queue") or {}), _ranks_table(ranks, snapshot["resources"]),
                 _jobs_table(snapshot["jobs"], now))


def _queue_table(queue: dict[str, int]) -> Table:
    t = Table(title="jobs by state", title_justify="left", box=None, header_style="bold", pad_edge=False)
    for state in QUEUE_STATES:
        t.add_column(state, justify="right")
    t.add_row(*(str(queue.get(state, 0)) for state in QUEUE_STATES))
    return t


def _ranks_table(ranks: list[dict[str, Any]], resources: list[dict[str, Any]]) -> Table:
    by_rank = {r.get("rank"): r for r in resources}
    listed = ranks if len(ranks) <= RANKS_LISTED else [r for r in ranks if r.get("state") != "up"]
    t = table("RANK", "HOST", "STATE", "CORES free/used", "GPUS free/used", "DRAIN")
    t.title, t.title_justify = "ranks" + ("" if listed is ranks else " (not up)"), "left"
    for r in listed:
        res = by_rank.get(r.get("rank"), {})
        # The node's name in the resource graph, as `mc resources` shows it; the process's host only without one.
        host = res.get("hostname") or r.get("hostname") or "-"
        t.add_row(str(r.get("rank")), shown(host), styled(str(r.get("state", "?")), RANK_STYLE),
                  free_used(res, "cores"), free_used(res, "gpus"), shown(res.get("reason") or ""))
    return t


def _jobs_table(jobs: list[dict[str, Any]], now: float) -> Table:
    busiest = sorted((j for j in jobs if j.get("state") != "INACTIVE"),
                     key=lambda j: (-(j.get("counts") or {}).get("running", 0), j.get("id", 0)))[:BUSIEST]
    t = table("ID", "USER", "NAME", "STATE", "RUNNING", "PENDING", "DONE", "FAILED", "TIME")
    t.title, t.title_justify = "busiest jobs", "left"
    for j in busiest:
        c = j.get("counts") or {}
        done = c.get("succeeded", 0) + c.get("failed", 0) + c.get("cancelled", 0)
        runtime = now - j["t_run"] if j.get("t_run") else None
        t.add_row(str(j.get("id")), user_name(j.get("uid")), shown(j.get("name", "")), str(j.get("state", "")),
                  str(c.get("running", 0)), str(c.get("pending", 0)), str(done), str(c.get("failed", 0)),
                  duration(runtime))
    return t


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function waiting up to `delay` seconds for a key; True if it was `q` (or Ctrl-C came)."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)

    def pressed(delay: float) -> bool:
        deadline = time.monotonic() + delay
        try:
            while (left := deadline - time.monotonic()) > 0:
                if fd is None:
                    time.sleep(left)
                    return False
                if select.select([fd], [], [], left)[0] and os.read(fd, 1) in (b"q", b"Q"):
                    return True
        except KeyboardInterrupt:
            return True
        return False

    try:
        yield pressed
    finally:
        if fd is not None and saved is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
