"""`mc report`'s pure parts: folding attempts into a Timeline and drawing the page, without a cluster."""
from __future__ import annotations

import re

from minicluster.cli.reportdata import (JobInfo, Report, Timeline, attempt_kind, dependency_targets, rank_groups,
                                         usage_by_user)
from minicluster.cli.reporthtml import GANTT_ROWS, by_group, layers, offset, page


def row(task: int, rank: int, started: float, ended: float | None, status: int | None = 0,
        outcome: str = "final", attempt: int = 0) -> list[object]:
    return [task, task, attempt, rank, status, status, None, None, started, ended, outcome]


def test_attempt_kinds() -> None:
    assert attempt_kind("final", 0, None, 5.0) == "ok"
    assert attempt_kind("final", 3, None, 5.0) == "failed"
    assert attempt_kind("final", 0, "node-lost", 5.0) == "failed"
    assert attempt_kind("retry", 1, None, 5.0) == "retried"
    assert attempt_kind("node-lost", None, None, 5.0) == "preempted"
    assert attempt_kind("final", None, None, None) == "running"


def test_dependencies_are_read_from_descriptions() -> None:
    assert dependency_targets("afterok:12") == [12]
    assert dependency_targets("aftercorr:7") == [7]
    assert dependency_targets("singleton") == []
    assert dependency_targets("begin-time=1700000000.0") == []


def test_busy_core_seconds_are_spread_over_the_bins_a_task_covers() -> None:
    timeline = Timeline(0.0, 10.0, bins=10)
    timeline.add(1, 2, row(0, 0, 2.5, 4.5), now=10.0)
    busy = timeline.ranks[0].busy
    assert busy[2] == 1.0 and busy[3] == 2.0 and busy[4] == 1.0  # half, whole, half a bin of 2 cores
    assert sum(busy) == 4.0
    assert timeline.cores_busy()[0][3] == 2.0


def test_beyond_the_detail_limit_only_bins_and_marks_are_kept() -> None:
    timeline = Timeline(0.0, 100.0, bins=50, detail_limit=3)
    for task in range(10):
        timeline.add(1, 1, row(task, task % 2, task, task + 1, status=1 if task == 7 else 0), now=100.0)
    assert timeline.detail is None and timeline.count == 10
    assert timeline.ranks[1].kinds["failed"] == 1 and timeline.ranks[1].marked == {4: "failed"}
    html = page(Report("mc report 1", "t", 0.0, [], timeline, {0: 2, 1: 2}, []))
    assert 'class="task"' not in html and 'class="mark"' in html


def test_overlapping_attempts_on_a_rank_get_lanes_and_each_is_a_bar() -> None:
    timeline = Timeline(0.0, 10.0)
    for task in range(3):
        timeline.add(4, 1, row(task, 0, 1.0, 5.0), now=10.0)
    html = page(Report("mc report 4", "t", 0.0, [JobInfo({"id": 4, "state": "INACTIVE"})], timeline, {0: 4}, []))
    ys = set(re.findall(r'<rect class="task" x="[^"]+" y="([^"]+)"', html))
    assert len(ys) == 3
    assert " src=" not in html and " href=" not in html


def test_layers_follow_the_longest_dependency_path() -> None:
    jobs = [JobInfo({"id": 1}), JobInfo({"id": 2}, [1]), JobInfo({"id": 3}, [1, 2]), JobInfo({"id": 4}, [99])]
    assert layers(jobs) == {1: 0, 2: 1, 3: 2, 4: 0}


def test_usage_is_summed_per_user_and_bank() -> None:
    jobs = [JobInfo({"id": i, "user": "a"}, usage={"project": "p", "core_seconds": 3600, "cpu_seconds": 1800})
            for i in range(2)] + [JobInfo({"id": 9, "user": "b"})]
    assert usage_by_user(jobs) == [{"user": "a", "project": "p", "jobs": 2, "core_hours": 2.0, "cpu_hours": 1.0}]


def test_text_from_jobs_is_escaped() -> None:
    timeline = Timeline(0.0, 1.0)
    jobs = [JobInfo({"id": 1, "name": "<script>x</script>", "state": "INACTIVE", "result": "COMPLETED"})]
    html = page(Report("mc report --name '<b>'", "t", 0.0, jobs, timeline, {}, []))
    assert "<script>x" not in html and "&lt;script&gt;x" in html and "<b>" not in html


def test_ranks_are_grouped_by_the_topology_levels_above_them() -> None:
    def node(rank: int) -> dict[str, object]:
        return {"type": "node", "name": f"n{rank}", "rank": rank, "children": [{"type": "socket", "id": 0}]}
    tree = {"type": "cluster", "name": "c", "children": [
        {"type": "zone", "name": "a", "children": [{"type": "rack", "name": "r0", "children": [node(0), node(1)]}]},
        {"type": "zone", "name": "b", "children": [{"type": "rack", "name": "r1", "children": [node(2)]}]}]}
    assert rank_groups(tree) == {0: "zone=a/rack=r0", 1: "zone=a/rack=r0", 2: "zone=b/rack=r1"}
    assert rank_groups({"type": "cluster", "name": "c", "children": [node(0)]}) == {}
    assert by_group({0: [1.0, 2.0], 1: [0.5, 0.0], 2: [3.0, 3.0]}, {0: "r0", 1: "r0", 2: "r1"}) == \
        {"r0": [1.5, 2.0], "r1": [3.0, 3.0]}


def test_thousands_of_ranks_share_a_bounded_number_of_gantt_rows() -> None:
    timeline = Timeline(0.0, 100.0, detail_limit=10)
    for rank in range(3000):
        timeline.add(1, 1, row(rank, rank, rank % 90, rank % 90 + 10, status=1 if rank == 2999 else 0), now=100.0)
    html = page(Report("mc report 1", "t", 0.0, [], timeline, dict.fromkeys(range(3000), 4), []))
    gantt = html[html.index('data-plot="gantt"'):html.index("</svg>", html.index('data-plot="gantt"'))]
    assert gantt.count("<text") <= GANTT_ROWS + 6 and "ranks 0-23" in gantt
    assert 'data-kind="failed"' in gantt
    assert len(html) < 1_000_000


def test_time_labels_differ_at_every_span() -> None:
    # Five steps across spans from 0.02 s to a day: the labels along an axis are all different.
    for span in (0.02, 0.1, 0.4, 3, 45, 299, 3_600, 86_400):
        step = span / 5
        labels = [offset(step * i, step) for i in range(6)]
        assert len(set(labels)) == 6, labels
    assert offset(0.25, 0.05) == "+0.25s"
    assert offset(41.2, 8) == "+41s"
    assert offset(3725, 720) == "+1:02:05"
