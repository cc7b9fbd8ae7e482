"""Human output (rich tables, event lines) and the stable `--json` shapes.

Built from the broker's answers, no request of their own; the I/O here is writing tables to stdout
(print_table) and naming users from the password database (user_name)."""
from __future__ import annotations

import datetime
import json
import pwd
import signal
import sys
from functools import lru_cache
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from minicluster.model.idset import IdSet
from minicluster.model.text import printable

# Keys of one job in `mc jobs --json`, in order. Adding keys is allowed; removing or renaming is not.
JOB_KEYS = ("id", "name", "uid", "user", "state", "result", "urgency", "t_submit", "t_run",
            "t_inactive", "runtime", "ntasks", "nnodes", "ranks", "status", "exception", "counts",
            "est_start", "reason", "waiting", "held", "retries", "queue", "project", "priority", "pending_reason",
            "eff")
COUNT_KEYS = ("pending", "running", "succeeded", "failed", "cancelled")
_COUNT_LABELS = {"pending": "pending", "running": "running", "succeeded": "ok", "failed": "failed",
                 "cancelled": "cancelled"}
_RESULT_STYLE = {"COMPLETED": "green", "FAILED": "red", "CANCELLED": "yellow", "TIMEOUT": "red",
                 "RUN": "cyan"}


RANK_STYLE = {"up": "green", "drained": "yellow", "down": "red", "unresponsive": "yellow", "lost": "red"}


def styled(word: str, styles: dict[str, str]) -> str:
    """`word` in rich markup with its style, if it has one."""
    style = styles.get(word, "")
    return f"[{style}]{word}[/]" if style else word


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, soft_wrap=False)


# Above this many rows a terminal gets the plain layout too: rich lays out a few thousand cells a second, and
# `mc resources` at 10,000 ranks took 14 s to print.
RICH_ROWS = 1000


def print_table(t: Table) -> None:
    """On a terminal, rich's table (up to RICH_ROWS rows); piped, whole rows without trailing blanks for grep and
    awk."""
    if sys.stdout.isatty() and t.row_count <= RICH_ROWS:
        console().print(t)
        return
    sys.stdout.write(plain_text(t))


def plain_text(t: Table) -> str:
    """The table laid out as rich lays out `table()`'s (no box, no edge padding: columns as wide as their widest
    cell, two spaces apart), in plain text and without trailing blanks; laid out here, in a few ms for 10,000 rows."""
    columns = [[_plain(c.header), *map(_plain, c.cells)] for c in t.columns]
    widths = [max(map(cell_len, cells)) for cells in columns]
    right = [c.justify == "right" for c in t.columns]
    lines = []
    for row in zip(*columns, strict=True):
        parts = []
        for cell, width, to_right in zip(row, widths, right, strict=True):
            pad = " " * (width - cell_len(cell))
            parts.append(pad + cell if to_right else cell + pad)
        lines.append("  ".join(parts).rstrip() + "\n")
    return "".join(lines)


def _plain(cell: Any) -> str:
    """A cell's text without its markup (styles, escaped brackets)."""
    if isinstance(cell, Text):
        return cell.plain
    text = str(cell)
    return Text.from_markup(text).plain if "[" in text else text


class TextTable(Table):
    """A table whose cells are shown as text: a control character a user put in a job name, a command or a reason
    is escaped (model/text.py's printable), never sent to the terminal. Cells keep rich markup (styled()); a cell
    of user text also goes through shown(), so that `[bold]` in a name is not markup either."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(printable(c) if isinstance(c, str) else c for c in cells), **kwargs)


def shown(value: Any) -> str:
    """User-controlled text for a table cell: its markup escaped (TextTable escapes its control characters)."""
    return escape(str(value))


def table(*headers: str) -> Table:
    t = TextTable(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for h in headers:
        t.add_column(h, no_wrap=True, justify="right" if h in ("ID", "RANK", "NTASKS", "NODES") else "left")
    return t


@lru_cache(maxsize=256)
def user_name(uid: int | None) -> str:
    if uid is None:
        return "-"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def duration(seconds: float | None) -> str:
    """Compact and readable: 0.41s, 12.3s, 5m03s, 2h05m, 3d04h."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def result(summary: dict[str, Any]) -> str:
    """What happened to the job: its state while active, then COMPLETED/FAILED/CANCELLED/TIMEOUT/..."""
    state = summary.get("state") or "?"
    if state != "INACTIVE":
        return state
    exception = summary.get("exception")
    if exception == "cancel":
        return "CANCELLED"
    if exception:
        return exception.upper()
    return "COMPLETED" if not summary.get("status") else "FAILED"


def runtime(summary: dict[str, Any], now: float) -> float | None:
    start = summary.get("t_run")
    if not start:
        return None
    return (summary.get("t_inactive") or now) - start


def job_json(summary: dict[str, Any], now: float) -> dict[str, Any]:
    """One job of `mc jobs --json`: the protocol summary plus user, result and runtime."""
    derived = {"user": user_name(summary.get("uid")), "result": result(summary),
               "runtime": runtime(summary, now)}
    counts = summary.get("counts") or {}
    out = {key: derived[key] if key in derived else summary.get(key) for key in JOB_KEYS}
    out["counts"] = {key: int(counts.get(key, 0)) for key in COUNT_KEYS}
    if "alloc" in summary:
        out["alloc"] = summary["alloc"]
    if "priority_components" in summary:
        out["priority_components"] = summary["priority_components"]
    return out


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False)


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[k]} {_COUNT_LABELS[k]}" for k in COUNT_KEYS if counts.get(k))


def jobs_table(summaries: list[dict[str, Any]], now: float) -> Table:
    t = table("ID", "NAME", "USER", "STATE", "NTASKS", "NODES", "RANKS", "TIME", "STATUS", "INFO")
    for s in summaries:
        state = result(s)
        counts = s.get("counts") or {}
        info = []
        if sum(counts.values()) > 1 or s.get("array"):
            info.append(counts_text(counts))
        if s.get("est_start") and s.get("state") != "RUN":
            info.append(f"starts in ~{duration(max(0.0, s['est_start'] - now))}")
        if s.get("pending_reason"):
            info.append(f"({s['pending_reason']})")
        if s.get("reason"):
            info.append(s["reason"])
        info.extend(workflow_info(s))
        status = s.get("status")
        t.add_row(str(s.get("id")), shown(s.get("name", "")), user_name(s.get("uid")),
                  styled(state, _RESULT_STYLE), str(s.get("ntasks", "")),
                  _nodes(s), s.get("ranks") or "-", duration(runtime(s, now)),
                  "-" if status is None else str(status), escape("; ".join(i for i in info if i)) or "-")
    return t


def workflow_info(summary: dict[str, Any]) -> list[str]:
    """What a job waits for, its hold and its retries, for the INFO column."""
    out = []
    if summary.get("held"):
        out.append("held")
    waiting = summary.get("waiting") or []
    if waiting:
        shown = ", ".join(waiting[:3]) + (f" and {len(waiting) - 3} more" if len(waiting) > 3 else "")
        out.append(f"waits for {shown}")
    if summary.get("retries"):
        out.append(f"{summary['retries']} retr{'y' if summary['retries'] == 1 else 'ies'}")
    return out


_OUTCOMES = {"retry": "retried", "requeue": "requeued", "node-lost": "node lost, requeued",
             "broker-restart": "broker restarted, requeued", "final": "final"}


def attempt_text(row: list[Any]) -> str:
    """One attempt of `attempts` (protocol.md §3.3): `1: exit 3 (retried)`."""
    _task, _index, attempt, _rank, status, exit_code, sig, error, *_times, outcome = row
    if sig is not None:
        try:
            how = f"signal {signal.Signals(sig).name}"
        except ValueError:
            how = f"signal {sig}"
    elif error:
        how = str(error)
    elif status is None:
        how = "no exit"
    else:
        how = f"exit {exit_code if exit_code is not None else status}"
    return printable(f"{attempt}: {how} ({_OUTCOMES.get(outcome, outcome)})")


def eff_table(summaries: list[dict[str, Any]], now: float) -> Table:
    """`mc jobs -o eff`: CPU and memory efficiency of finished jobs (`mc job eff ID` for one in full)."""
    t = table("ID", "NAME", "USER", "QUEUE", "PROJECT", "STATE", "NTASKS", "TIME", "CPU EFF", "MEM EFF")
    for s in summaries:
        eff = s.get("eff") or {}
        t.add_row(str(s.get("id")), shown(s.get("name", "")), user_name(s.get("uid")), s.get("queue") or "-",
                  s.get("project") or "-", styled(result(s), _RESULT_STYLE), str(s.get("ntasks", "")),
                  duration(runtime(s, now)), percent(eff.get("cpu")), percent(eff.get("mem")))
    return t


def priority_table(summaries: list[dict[str, Any]]) -> Table:
    """`mc jobs --priority`: each pending job's priority and its weighted parts, like Slurm's sprio."""
    t = table("ID", "USER", "QUEUE", "PROJECT", "PRIORITY", "FAIRSHARE", "QUEUE_PRIO", "URGENCY", "AGE",
              "JOBSIZE")
    for s in summaries:
        parts = s.get("priority_components")
        if not parts:
            continue
        weighted, factors = parts["weighted"], parts["factors"]
        t.add_row(str(s.get("id")), user_name(s.get("uid")), s.get("queue") or "-", s.get("project") or "-",
                  f"{parts['priority']:.0f}", f"{weighted['fairshare']:.0f} ({factors['fairshare']:.3f})",
                  f"{weighted['queue']:.0f}", f"{weighted['urgency']:.0f}", f"{weighted['age']:.0f}",
                  f"{weighted['jobsize']:.0f}")
    return t


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _nodes(summary: dict[str, Any]) -> str:
    """Nodes the job holds once allocated, else the number it asked for."""
    if summary.get("ranks"):
        return str(len(IdSet.parse(summary["ranks"])))
    return str(summary.get("nnodes") or "-")


def resources_table(ranks: list[dict[str, Any]]) -> Table:
    t = table("RANK", "HOST", "STATE", "CORES free/used", "GPUS free/used", "MiB free/used",
              "PROPERTIES", "REASON")
    for r in ranks:
        props = ",".join(f"{k}={v}" if v else k for k, v in (r.get("properties") or {}).items())
        state = r.get("state", "?")
        t.add_row(str(r.get("rank")), shown(r.get("hostname", "")), styled(state, RANK_STYLE),
                  free_used(r, "cores"), free_used(r, "gpus"), free_used(r, "memory_mb"),
                  shown(props or "-"), shown(r.get("reason") or ""))
    return t


def tree_lines(vertex: dict[str, Any], depth: int = 0) -> list[str]:
    """`mc resources --tree`: one line per vertex, indented, free/used per resource.

        cluster            nodes 3/4 idle  cores 9 free 3 used/16  gpus 6 free 0 used/8 ...
          zone a
            rack r0
              node n0 (rank 0)
                socket0
    """
    kind = vertex.get("type", "?")
    if kind == "node":
        name = f"node {vertex.get('name')} (rank {vertex.get('rank')})"
        if vertex.get("state") != "up":
            name += f" {vertex.get('state')}" + (f": {vertex['reason']}" if vertex.get("reason") else "")
    elif kind in ("cluster", "socket"):
        name = str(vertex.get("name"))
    else:
        name = f"{kind} {vertex.get('name')}"
    parts = []
    if "nodes" in vertex:
        idle, usable, total = vertex["nodes"]
        parts.append(f"nodes {idle} idle/{usable} up/{total}")
    for key, unit in (("cores", "cores"), ("gpus", "gpus"), ("memory_mb", "MiB")):
        free, used, total = vertex.get(key) or (0, 0, 0)
        if total or key == "cores":
            parts.append(f"{unit} {free} free {used} used/{total}")
    lines = [f"{'  ' * depth}{printable(name):<{max(1, 40 - 2 * depth)}}  " + "  ".join(parts)]
    for child in vertex.get("children") or ():
        lines += tree_lines(child, depth + 1)
    return lines


def alloc_table(summaries: list[dict[str, Any]], now: float) -> Table:
    """`mc jobs -o alloc`: where each job landed, by topology vertex."""
    t = table("ID", "NAME", "STATE", "NODES", "RANKS", "ALLOC")
    for s in summaries:
        placed = " ".join(f"{a['path']}[{a['ranks']}]" for a in s.get("alloc") or ())
        t.add_row(str(s.get("id")), shown(s.get("name", "")), styled(result(s), _RESULT_STYLE),
                  _nodes(s), s.get("ranks") or "-", escape(placed) or "-")
    return t


def free_used(r: dict[str, Any], kind: str) -> str:
    free, total = r.get(f"{kind}_free"), r.get(f"{kind}_total")
    if free is None or total is None:
        return "?"
    return f"{free}/{total - free}"


def status_lines(status: dict[str, Any]) -> list[str]:
    queue = status.get("queue") or {}
    queued = ", ".join(f"{n} {state}" for state, n in queue.items() if n) or "empty"
    name = printable(str(status.get("name", "?")))
    lines = [f"{name}: size {status.get('size', '?')}, fanout {status.get('fanout', '?')}, "
             f"epoch {status.get('epoch', '?')}", f"queue: {queued}"]
    stalled = (status.get("journal") or {}).get("stalled")
    if stalled:
        lines.append(f"journal: cannot be written ({printable(str(stalled))}); submissions are refused until it can")
    return lines


def status_table(ranks: list[dict[str, Any]], now: float) -> Table:
    t = table("RANK", "STATE", "PID", "HOST", "ENDPOINT", "SINCE")
    for r in ranks:
        since = r.get("since")
        t.add_row(str(r.get("rank")), str(r.get("state", "?")), str(r.get("pid") or "-"),
                  str(r.get("hostname") or "-"), str(r.get("endpoint") or "-"),
                  duration(now - since) + " ago" if since else "-")
    return t


def _context_value(value: Any) -> str:
    """A value as is when it is one printable word, else as JSON (which escapes control characters)."""
    if isinstance(value, str) and value and value.isprintable() and not any(c.isspace() for c in value):
        return value
    return json.dumps(value)


def context_text(context: dict[str, Any] | None) -> str:
    return " ".join(f"{k}={_context_value(v)}" for k, v in (context or {}).items())


def event_line(event: list[Any], t0: float) -> str:
    """`+1.234s exception type=cancel severity=0` (time relative to the job's first event)."""
    _seq, when, name, context = event
    text = f"+{when - t0:.3f}s {printable(str(name))}"
    ctx = context_text(context)
    return f"{text} {ctx}" if ctx else text


def local_time(when: float) -> str:
    """`2025-06-01T14:03:07.412` in local time: sortable, one word for awk, readable."""
    stamp = datetime.datetime.fromtimestamp(when)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}"


def eventlog_line(event: list[Any]) -> str:
    """`SEQ TIME NAME key=value...`, one event per line for `mc eventlog`."""
    seq, when, name, context = event
    ctx = context_text(context)
    return f"{seq} {local_time(when)} {printable(str(name))}" + (f" {ctx}" if ctx else "")


def eventlog_json(event: list[Any]) -> str:
    """One event of `mc eventlog --json`: a JSON object per line, the time as raw epoch seconds."""
    seq, when, name, context = event
    return json.dumps({"seq": seq, "time": when, "name": name, "context": context or {}})
