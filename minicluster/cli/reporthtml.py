"""`mc report`'s page: one self-contained HTML file, inline CSS and SVG drawn here, a few lines of inline JS for
tooltips; nothing fetched, so it opens from a file with no network.

Pure functions from a `Report` (reportdata.py) to strings. Every drawn mark carries its numbers in `data-`
attributes and a `<title>`, and every plot is followed by its numbers as a table.
"""
from __future__ import annotations

import datetime
import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from minicluster.cli.reportdata import KINDS, SEVERITY, JobInfo, Report, Timeline

COLORS = {"ok": "#4c9a2a", "failed": "#d62728", "retried": "#ff7f0e", "preempted": "#9467bd", "running": "#1f77b4"}
STATE_COLORS = {"COMPLETED": "#4c9a2a", "FAILED": "#d62728", "CANCELLED": "#7f7f7f", "TIMEOUT": "#d62728",
                "RUN": "#1f77b4", "SCHED": "#bcbd22", "DEPEND": "#bcbd22", "PRIORITY": "#bcbd22"}
WIDTH = 960
LEFT = 90
# The binned Gantt draws at most this many rows; more ranks share rows, consecutive ranks together.
GANTT_ROWS = 128
GROUP_COLORS = ("#2ca02c", "#e377c2", "#8c564b", "#17becf", "#bcbd22", "#ff7f0e")
LANE = 14
# Above this many jobs the dependency graph is given as a table only: boxes would be unreadable.
GRAPH_LIMIT = 400
# Rows of the cores-busy table: the curve's bins grouped so a table stays readable.
TABLE_ROWS = 60

_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;max-width:1000px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}code{background:#f3f3f3;padding:2px 4px}
svg text{font:11px system-ui,sans-serif}#tip{position:fixed;background:#ffe;border:1px solid #999;padding:3px 6px;
font-size:12px;pointer-events:none;display:none;white-space:pre}.legend span{display:inline-block;width:10px;
height:10px;margin:0 4px 0 12px}details{margin:.5em 0}
"""
# Tooltips: the <title> of the hovered mark, shown at once next to the pointer.
_JS = """
const tip=document.getElementById('tip');
document.addEventListener('mousemove',e=>{const t=e.target.closest&&e.target.closest('[data-tip]');
if(!t){tip.style.display='none';return}tip.textContent=t.getAttribute('data-tip');tip.style.display='block';
tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px'});
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds")


def _decimals(step: float) -> int:
    """Enough decimals that labels `step` seconds apart differ (0.02 s apart: 2), at most 3."""
    return min(3, max(0, math.ceil(-math.log10(step)))) if step > 0 else 3


def offset(t: float, step: float) -> str:
    """`t` seconds after the start, as a label among labels `step` apart: +0.25s, +41s, +1:02:05."""
    if step >= 60:
        return f"+{datetime.timedelta(seconds=round(t))}"
    return f"+{t:.{_decimals(step)}f}s"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], cls: str = "", left: int = 0) -> str:
    """An HTML table; the first `left` columns are text (left-aligned)."""
    def cell(tag: str, i: int, value: object) -> str:
        return f"<{tag}{' class=l' if i < left else ''}>{esc(value)}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def svg(width: int, height: int, body: str, name: str) -> str:
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" data-plot="{name}">{body}</svg>')


def _x(timeline: Timeline, t: float) -> float:
    return LEFT + (WIDTH - LEFT - 10) * (min(max(t, timeline.t0), timeline.t1) - timeline.t0) / (
        timeline.t1 - timeline.t0)


def _time_axis(timeline: Timeline, y: float) -> str:
    out = [f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - 10}" y2="{y}" stroke="#888"/>']
    step = (timeline.t1 - timeline.t0) / 5
    for i in range(6):
        t = timeline.t0 + step * i
        x = _x(timeline, t)
        anchor = "end" if i == 5 else "middle"  # the last label centred on the axis' end would be cut by the edge
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#888"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" text-anchor="{anchor}">{offset(t - timeline.t0, step)}</text>')
    return "".join(out)


def legend() -> str:
    return '<div class="legend">' + "".join(f'<span style="background:{COLORS[k]}"></span>{k}' for k in KINDS) + \
        "</div>"


# ------------------------------------------------------------------------------------------------ the Gantt chart


def gantt(timeline: Timeline) -> str:
    """Tasks per rank: one bar per attempt when there are few, else each rank's busy fraction per time bin with
    the bins where attempts failed, were retried or preempted marked."""
    if not timeline.ranks:
        return "<p>No task ran in this report's span.</p>"
    if timeline.detail is not None:
        return _gantt_bars(timeline)
    return _gantt_bins(timeline)


def _lanes(attempts: list[Any]) -> tuple[dict[int, int], dict[int, int]]:
    """Each attempt's lane within its rank (attempts that overlap in time get different lanes) and each rank's
    lane count; greedy by start time."""
    lane_of: dict[int, int] = {}
    ends: dict[int, list[float]] = {}
    for i in sorted(range(len(attempts)), key=lambda i: attempts[i].started):
        a = attempts[i]
        free = ends.setdefault(a.rank, [])
        end = a.ended if a.ended is not None else float("inf")
        lane = next((n for n, e in enumerate(free) if e <= a.started), len(free))
        if lane == len(free):
            free.append(end)
        else:
            free[lane] = end
        lane_of[i] = lane
    return lane_of, {rank: len(e) for rank, e in ends.items()}


def _gantt_bars(timeline: Timeline) -> str:
    attempts = timeline.detail or []
    lane_of, lanes = _lanes(attempts)
    top: dict[int, int] = {}
    y = 5
    out = []
    for rank in sorted(lanes):
        top[rank] = y
        out.append(f'<text x="4" y="{y + LANE - 3}">rank {rank}</text>')
        y += lanes[rank] * LANE + 4
        out.append(f'<line x1="{LEFT}" y1="{y - 2}" x2="{WIDTH - 10}" y2="{y - 2}" stroke="#eee"/>')
    for i, a in enumerate(attempts):
        x0 = _x(timeline, a.started)
        x1 = _x(timeline, a.ended if a.ended is not None else timeline.t1)
        tip = (f"job {a.job} task {a.task} index {a.index} attempt {a.attempt}\nrank {a.rank}: {a.kind}"
               f" (status {a.status})\n{when(a.started)} for {seconds((a.ended or timeline.t1) - a.started)} s")
        out.append(f'<rect class="task" x="{x0:.1f}" y="{top[a.rank] + lane_of[i] * LANE}" '
                   f'width="{max(1.0, x1 - x0):.1f}" height="{LANE - 2}" fill="{COLORS[a.kind]}" '
                   f'data-job="{a.job}" data-task="{a.task}" data-index="{a.index}" data-attempt="{a.attempt}" '
                   f'data-rank="{a.rank}" data-kind="{a.kind}" data-tip="{esc(tip)}"/>')
    out.append(_time_axis(timeline, y + 2))
    return legend() + svg(WIDTH, y + 24, "".join(out), "gantt")


def _rank_rows(timeline: Timeline) -> list[tuple[str, list[float], dict[int, str]]]:
    """The binned Gantt's rows: one per rank, or per run of consecutive ranks when there are more than GANTT_ROWS
    (busy summed, the worst mark of each bin kept), so the drawing stays bounded however many ranks ran."""
    ranks = sorted(timeline.ranks)
    per_row = -(-len(ranks) // GANTT_ROWS)
    rows = []
    for i in range(0, len(ranks), per_row):
        chunk = ranks[i:i + per_row]
        busy = [sum(col) for col in zip(*(timeline.ranks[r].busy for r in chunk), strict=True)]
        marked: dict[int, str] = {}
        for r in chunk:
            for b, kind in timeline.ranks[r].marked.items():
                if SEVERITY[kind] > SEVERITY.get(marked.get(b, ""), 0):
                    marked[b] = kind
        label = f"rank {chunk[0]}" if len(chunk) == 1 else f"ranks {chunk[0]}-{chunk[-1]}"
        rows.append((label, busy, marked))
    return rows


def _runs(values: list[float], peak: float) -> list[tuple[int, int, int]]:
    """(first bin, bins, shade 1-10) of each run of busy bins whose busy fraction of `peak` shades alike."""
    out: list[tuple[int, int, int]] = []
    for b, v in enumerate(values):
        shade = 0 if v <= 0 else 1 + min(9, int(10 * v / peak))
        if out and shade and out[-1][2] == shade and out[-1][0] + out[-1][1] == b:
            out[-1] = (out[-1][0], out[-1][1] + 1, shade)
        elif shade:
            out.append((b, 1, shade))
    return out


def _gantt_bins(timeline: Timeline) -> str:
    rows = _rank_rows(timeline)
    row_h = max(3, min(LANE, 600 // len(rows)))
    bin_w = (WIDTH - LEFT - 10) / timeline.nbins
    out = []
    for n, (label, busy, marked) in enumerate(rows):
        y = 5 + n * row_h
        peak = max(busy) or 1.0
        if row_h >= 9 or n % max(1, 10 // row_h) == 0:
            out.append(f'<text x="4" y="{y + row_h - 2}">{label}</text>')
        for first, count, shade in _runs(busy, peak):
            out.append(f'<rect x="{LEFT + first * bin_w:.1f}" y="{y}" width="{count * bin_w + 0.2:.1f}" '
                       f'height="{row_h - 1}" fill="#1f77b4" fill-opacity="{0.1 * shade:.1f}"/>')
        for b, kind in sorted(marked.items()):
            out.append(f'<rect class="mark" x="{LEFT + b * bin_w:.1f}" y="{y}" width="{max(2.0, bin_w):.1f}" '
                       f'height="{row_h - 1}" fill="{COLORS[kind]}" data-ranks="{label}" data-kind="{kind}" '
                       f'data-tip="{label}: {kind} attempts near {offset(b * timeline.width, timeline.width)}"/>')
    y = 5 + len(rows) * row_h
    out.append(_time_axis(timeline, y + 2))
    note = (f"<p>{timeline.count:,} attempts: each row shows how busy its ranks were in each of "
            f"{timeline.nbins} time bins ({timeline.width:.2f} s each, darker is busier, relative to the row's "
            "busiest bin); bins where an attempt failed, was retried or preempted are drawn in that kind's "
            "color.</p>")
    return note + legend() + svg(WIDTH, y + 24, "".join(out), "gantt")


def gantt_table(timeline: Timeline) -> str:
    rows = [[rank, *(row.kinds[k] for k in KINDS), f"{sum(row.busy):.1f}"]
            for rank, row in sorted(timeline.ranks.items())]
    detail = ""
    if timeline.detail:
        detail = "<details><summary>every attempt</summary>" + table(
            ["job", "task", "index", "attempt", "rank", "kind", "status", "started", "seconds"],
            ([a.job, a.task, a.index, a.attempt, a.rank, a.kind, "-" if a.status is None else a.status,
              when(a.started), seconds((a.ended or timeline.t1) - a.started)] for a in timeline.detail),
            cls="attempts") + "</details>"
    return table(["rank", *KINDS, "core-seconds"], rows, cls="ranks") + detail


# ------------------------------------------------------------------------------------------------ cores busy


def by_group(per_rank: dict[int, list[float]], groups: dict[int, str]) -> dict[str, list[float]]:
    """The per-rank series summed per topology group (rack, zone); ranks outside any group are left out."""
    out: dict[str, list[float]] = {}
    for rank, values in per_rank.items():
        if rank in groups:
            sums = out.setdefault(groups[rank], [0.0] * len(values))
            for b, v in enumerate(values):
                sums[b] += v
    return dict(sorted(out.items()))


def cores_busy(timeline: Timeline, cores: dict[int, int], groups: dict[int, str]) -> str:
    """Mean cores busy per time bin, in total, per topology group and per rank, as step lines under the cores
    the ranks have."""
    per_rank = timeline.cores_busy()
    if not per_rank:
        return ""
    total = [sum(values) for values in zip(*per_rank.values(), strict=True)]
    per_group = by_group(per_rank, groups)
    available = sum(cores.values()) or max(total)
    height, plot_h = 240, 200
    top = max(available, max(total)) or 1.0

    def y(v: float) -> float:
        return 10 + plot_h * (1 - v / top)

    def path(values: list[float]) -> str:
        points = []
        for b, v in enumerate(values):
            x0 = _x(timeline, timeline.t0 + b * timeline.width)
            x1 = _x(timeline, timeline.t0 + (b + 1) * timeline.width)
            points.append(f"{'M' if b == 0 else 'L'}{x0:.1f},{y(v):.1f}L{x1:.1f},{y(v):.1f}")
        return "".join(points)

    out = [f'<line x1="{LEFT}" y1="{y(available):.1f}" x2="{WIDTH - 10}" y2="{y(available):.1f}" stroke="#d62728" '
           f'stroke-dasharray="4 3" data-tip="cores available: {available}"/>',
           f'<text x="4" y="{y(available) + 4:.1f}">{available} cores</text>', '<text x="4" y="214">0</text>']
    if len(per_rank) <= 32:  # more ranks than that are a blur; their numbers are in the table
        for rank, values in per_rank.items():
            out.append(f'<path d="{path(values)}" fill="none" stroke="#aaa" stroke-width="0.8" data-rank="{rank}" '
                       f'data-tip="rank {rank} ({cores.get(rank, "?")} cores)"/>')
    for n, (name, values) in enumerate(per_group.items()):
        color = GROUP_COLORS[n % len(GROUP_COLORS)]
        out.append(f'<path d="{path(values)}" fill="none" stroke="{color}" stroke-width="1.5" '
                   f'stroke-dasharray="6 2" data-group="{esc(name)}" data-tip="{esc(name)}"/>')
    out.append(f'<path d="{path(total)}" fill="none" stroke="#1f77b4" stroke-width="2" data-tip="all ranks"/>')
    out.append(_time_axis(timeline, 10 + plot_h))
    named = "".join(f'<span style="background:{GROUP_COLORS[n % len(GROUP_COLORS)]}"></span>{esc(name)}'
                    for n, name in enumerate(per_group))
    return ("<p>Blue: cores busy in all ranks (mean per bin); grey: per rank; dashed red: cores the ranks "
            "have now" + ("; dashed colors: per topology group" if per_group else "") + ".</p>" +
            (f'<div class="legend">{named}</div>' if named else "") + svg(WIDTH, height, "".join(out), "cores") +
            _cores_table(timeline, {**{f"rank {r}": v for r, v in per_rank.items()}, **per_group}, total))


def _cores_table(timeline: Timeline, series: dict[str, list[float]], total: list[float]) -> str:
    """The curves' numbers, bins grouped to at most TABLE_ROWS rows; the groups' columns, then the first ranks'."""
    group = max(1, -(-timeline.nbins // TABLE_ROWS))
    step = group * timeline.width
    ranks = [name for name in series if not name.startswith("rank ")]
    ranks += [name for name in series if name.startswith("rank ")][:max(0, 16 - len(ranks))]
    rows = []
    for start in range(0, timeline.nbins, group):
        end = min(timeline.nbins, start + group)

        def mean(values: list[float], start: int = start, end: int = end) -> str:
            return f"{sum(values[start:end]) / (end - start):.2f}"
        rows.append([offset(start * timeline.width, step), mean(total), *(mean(series[r]) for r in ranks)])
    more = f" ({len(ranks)} of {len(series)} series)" if len(series) > len(ranks) else ""
    return (f"<details><summary>cores busy, mean per {offset(step, step)[1:]}{more}</summary>" +
            table(["from", "total", *ranks], rows, cls="cores") + "</details>")


# ------------------------------------------------------------------------------------------------ dependency graph


def layers(jobs: list[JobInfo]) -> dict[int, int]:
    """Each job's layer: 0 with no dependency among the jobs shown, else one more than its deepest dependency."""
    ids = {info.id for info in jobs}
    depth: dict[int, int] = {}
    for info in sorted(jobs, key=lambda i: i.id):  # a job depends only on earlier (smaller) ids
        depth[info.id] = 1 + max((depth[d] for d in info.depends if d in ids and d in depth), default=-1)
    return depth


def graph(jobs: list[JobInfo]) -> str:
    if not any(info.depends for info in jobs):
        return "<p>No dependencies between these jobs.</p>"
    if len(jobs) > GRAPH_LIMIT:
        return f"<p>{len(jobs):,} jobs: too many to draw; the table below lists each job's dependencies.</p>"
    depth = layers(jobs)
    by_layer: dict[int, list[JobInfo]] = {}
    for info in sorted(jobs, key=lambda i: i.id):
        by_layer.setdefault(depth[info.id], []).append(info)
    box_w, box_h, gap_x, gap_y = 150, 36, 20, 40
    width = max(WIDTH, max(len(v) for v in by_layer.values()) * (box_w + gap_x) + 20)
    pos = {info.id: (10 + n * (box_w + gap_x), 10 + layer * (box_h + gap_y))
           for layer, infos in by_layer.items() for n, info in enumerate(infos)}
    out = []
    for info in jobs:
        for dep in info.depends:
            if dep in pos:
                (x0, y0), (x1, y1) = pos[dep], pos[info.id]
                out.append(f'<line class="edge" x1="{x0 + box_w / 2}" y1="{y0 + box_h}" x2="{x1 + box_w / 2}" '
                           f'y2="{y1}" stroke="#888" data-from="{dep}" data-to="{info.id}"/>')
    for info in jobs:
        x, y = pos[info.id]
        r = info.record
        state = str(r.get("result") or r.get("state"))
        color = STATE_COLORS.get(state, "#bbb")
        out.append(f'<g class="job" data-job="{info.id}" data-state="{esc(state)}" '
                   f'data-tip="job {info.id} {esc(r.get("name"))}: {esc(state)}, {seconds(r.get("runtime"))} s">'
                   f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="{color}" fill-opacity="0.25"'
                   f' stroke="{color}"/><text x="{x + 5}" y="{y + 14}">{info.id} {esc(str(r.get("name"))[:18])}'
                   f'</text><text x="{x + 5}" y="{y + 29}">{esc(state)} {seconds(r.get("runtime"))} s</text></g>')
    height = 20 + (max(by_layer) + 1) * (box_h + gap_y)
    return svg(width, height, "".join(out), "graph")


def jobs_table(jobs: list[JobInfo]) -> str:
    rows = []
    for info in sorted(jobs, key=lambda i: i.id):
        r = info.record
        counts = r.get("counts") or {}
        eff = r.get("eff") or {}
        rows.append([info.id, r.get("name"), r.get("user"), r.get("project") or "-", r.get("state"), r.get("result"),
                     r.get("ntasks"), counts.get("succeeded", 0), counts.get("failed", 0), counts.get("cancelled", 0),
                     r.get("retries", 0), seconds(r.get("runtime")), percent(eff.get("cpu")), percent(eff.get("mem")),
                     " ".join(map(str, info.depends)) or "-"])
    return table(["id", "name", "user", "bank", "state", "result", "ntasks", "succeeded", "failed", "cancelled",
                  "retries", "runtime s", "cpu eff", "mem eff", "depends on"], rows, cls="jobs", left=0)


# ------------------------------------------------------------------------------------------------ efficiency, usage


def histogram(jobs: list[JobInfo], key: str, label: str) -> str:
    """Jobs per tenth of efficiency (the last bin also holds 100% and above)."""
    values = [v for v in ((info.record.get("eff") or {}).get(key) for info in jobs) if v is not None]
    counts = [0] * 10
    for v in values:
        counts[min(9, max(0, int(v * 10)))] += 1
    bins = [f"{10 * i}-{10 * i + 10}%" for i in range(10)]
    if not values:
        return f"<p>{label}: no finished job has this measure.</p>"
    peak = max(counts)
    bar_w, plot_h = 44, 120
    out = []
    for i, n in enumerate(counts):
        h = plot_h * n / peak
        out.append(f'<rect class="bin" x="{40 + i * bar_w}" y="{10 + plot_h - h:.1f}" width="{bar_w - 4}" '
                   f'height="{h:.1f}" fill="#1f77b4" data-count="{n}" data-tip="{bins[i]}: {n} jobs"/>'
                   f'<text x="{40 + i * bar_w + 4}" y="{plot_h + 24}">{10 * i}%</text>')
    out.append(f'<text x="4" y="18">{peak}</text><text x="4" y="{plot_h + 10}">0</text>')
    return (f"<h3>{esc(label)}</h3>" + svg(40 + 10 * bar_w, plot_h + 32, "".join(out), f"hist-{key}") +
            table(["efficiency", *bins], [["jobs", *counts]], cls=f"hist-{key}", left=1))


def usage_section(usage: list[dict[str, Any]]) -> str:
    if not usage:
        return "<p>No finished job with a usage record.</p>"
    peak = max(r["core_hours"] for r in usage) or 1.0
    out = []
    for n, r in enumerate(usage[:30]):
        w = (WIDTH - 260) * r["core_hours"] / peak
        out.append(f'<text x="4" y="{n * 18 + 14}">{esc(r["user"])}/{esc(r["project"])}</text>'
                   f'<rect x="200" y="{n * 18 + 3}" width="{max(1.0, w):.1f}" height="14" fill="#1f77b4" '
                   f'data-tip="{r["core_hours"]:.4f} core-hours"/>')
    rows = [[r["user"], r["project"], r["jobs"], f"{r['core_hours']:.4f}", f"{r['cpu_hours']:.4f}"] for r in usage]
    return (svg(WIDTH, min(30, len(usage)) * 18 + 8, "".join(out), "usage") +
            table(["user", "bank", "jobs", "core-hours", "cpu-hours"], rows, cls="usage", left=2))


# ------------------------------------------------------------------------------------------------ the page


def page(report: Report) -> str:
    t = report.timeline
    sections = [
        ("Tasks per rank", gantt(t) + gantt_table(t)),
        ("Cores busy", cores_busy(t, report.cores, report.groups) or "<p>No task ran in this report's span.</p>"),
        ("Jobs and their dependencies", graph(report.jobs) + jobs_table(report.jobs)),
        ("Efficiency", histogram(report.jobs, "cpu", "CPU efficiency per job") +
         histogram(report.jobs, "mem", "Memory efficiency per job")),
        ("Usage per user and bank", usage_section(report.usage)),
    ]
    body = "".join(f"<h2>{esc(title)}</h2>{content}" for title, content in sections)
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{esc(report.title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{esc(report.title)}</h1><p>Made by <code class=\"command\">{esc(report.command)}</code> at "
            f"{esc(when(report.generated))}; span {esc(when(t.t0))} to {esc(when(t.t1))} "
            f"({t.t1 - t.t0:.1f} s), {len(report.jobs):,} jobs, {t.count:,} attempts.</p>"
            f'{body}<div id="tip"></div><script>{_JS}</script></body></html>\n')
