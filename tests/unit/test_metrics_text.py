"""The Prometheus text the broker and the operator serve: a histogram's cumulative buckets, the per-rank, topology
and fair-share gauges, and the operator's series present before anything happened (issue 30 item 1)."""
from __future__ import annotations

from broker.status_http import metrics_text
from minicluster.model.histogram import Histogram
from minicluster.operator.metrics import Metrics


def test_histogram_buckets_are_cumulative_and_count_matches_inf() -> None:
    h = Histogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        h.observe(seconds)
    assert h.lines("x_seconds", "what") == [
        "# HELP x_seconds what", "# TYPE x_seconds histogram",
        'x_seconds_bucket{le="0.1"} 2', 'x_seconds_bucket{le="1.0"} 3', 'x_seconds_bucket{le="+Inf"} 4',
        "x_seconds_sum 3.65", "x_seconds_count 4"]


def test_cores_and_fair_share_series_have_their_labels_escaped() -> None:
    h = Histogram()
    h.observe(0.002)
    status = {"ranks": {"up": 2}, "jobs": {}, "ready": True, "counters": {"tasks_completed": 7},
              "cores": {"ranks": [(0, 4, 1), (1, 4, 4)], "domains": [("rack", 'rack=r"1', 8, 5)]},
              "fairshare": {"banks": [("bio", 12.5, 0.25)], "users": [("bio", 1000, "ana", 12.5, 0.5)]},
              "journal": {"stalled": False, "commit_seconds": h}}
    lines = metrics_text(status).splitlines()
    for line in ('minicluster_tasks_completed_total 7', 'minicluster_rank_cores{rank="1"} 4',
                 'minicluster_rank_cores_busy{rank="0"} 1',
                 'minicluster_topology_cores_busy{level="rack",domain="rack=r\\"1"} 5',
                 'minicluster_fairshare_bank_usage_core_seconds{bank="bio"} 12.5',
                 'minicluster_fairshare_bank_shares_ratio{bank="bio"} 0.25',
                 'minicluster_fairshare_usage_core_seconds{bank="bio",user="ana",uid="1000"} 12.5',
                 'minicluster_fairshare_factor{bank="bio",user="ana",uid="1000"} 0.5',
                 "minicluster_journal_stalled 0", "minicluster_journal_commit_duration_seconds_count 1"):
        assert line in lines, line


def test_status_without_the_metrics_only_parts_still_renders() -> None:
    # The status dict alone (as /status has it): no per-rank series, no histogram, no error.
    text = metrics_text({"ranks": {"up": 1}, "jobs": {"queued": 0}, "ready": True})
    assert 'minicluster_ranks{state="up"} 1' in text and "minicluster_journal_commit" not in text


def test_operator_error_series_exist_before_the_first_error() -> None:
    text = Metrics().render()
    assert 'minicluster_operator_errors_total{handler="reconcile"} 0' in text
    assert 'minicluster_operator_errors_total{handler="status"} 0' in text
