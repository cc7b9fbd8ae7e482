"""The Grafana dashboard (deploy/grafana/, docs/operator.md#monitoring) reads only metrics that are exported: every
panel's PromQL names a metric a real broker's /metrics (after running jobs) or the operator's /metrics serves; and
the metrics the dashboard needs count what happened (issue 30 item 1)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.durable.journal import Journal
from broker.status_http import metrics_text
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, until, wait_for
from tests.integration.test_disk_full import journal_stalled_on_a_full_disk

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "minicluster-dashboard.json"
RACKS = {0: "r0", 1: "r1"}

# What PromQL spells without being a metric: aggregation modifiers, binary operators and vector matching words.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions (followed by "("), keywords,
    label lists (`by (...)`), label matchers (`{...}`), ranges (`[...]`), numbers or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = _LABEL_LIST.sub(" ", expr)
    expr = re.sub(r"\b\d[\w.]*", " ", expr)  # numbers and durations (0.99, 5m)
    names = set()
    for found in _IDENT.finditer(expr):
        rest = expr[found.end():].lstrip()
        if not rest.startswith("(") and found.group().lower() not in _KEYWORDS:
            names.add(found.group())
    return names


def test_the_parser_finds_metrics_not_functions_labels_or_keywords() -> None:
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x=~"$x",y="by (z)"}[$__rate_interval])))'
            ' / ignoring(bank) group_left sum(b_total) and on (q) c offset 5m')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every panel target, rows' panels included."""
    board = json.loads(DASHBOARD.read_text())
    panels = [p for top in board["panels"] for p in (top, *top.get("panels", ()))]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", ())]


def exported(text: str) -> set[str]:
    """Metric names with at least one sample; a histogram's series also count under its own name."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = _IDENT.match(line)
            assert name is not None, line
            names.add(name.group())
    return names | {n.rsplit("_", 1)[0] for n in names if n.endswith(("_bucket", "_sum", "_count"))}


def value(text: str, series: str) -> float:
    """The sample of one series, e.g. 'minicluster_rank_cores_busy{rank="1"}'."""
    found = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(series + " ")]
    assert len(found) == 1, f"{series}: {found}"
    return float(found[0])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, int]]:
    port = free_port()
    c = LocalCluster(tmp_path_factory.mktemp("dash"), size=2, resources="cores=2", topology="rack",
                     status_port=port, banks={"physics": {"shares": 2, "users": ["0"]}},
                     priority={"fairshare_interval": 0.2})
    try:
        for rank, rack in RACKS.items():
            c.start_rank(rank, env={"MC_PROPERTIES": f"rack={rack}"})
        c.wait_up()
        yield c, port
    finally:
        c.stop()


def operator_metrics_text() -> str:
    """What a fresh operator's /metrics endpoint serves (minicluster/operator/metrics.py)."""
    import aiohttp

    from minicluster.operator.metrics import Metrics, serve

    async def fetch() -> str:
        port = free_port()
        runner = await serve(Metrics(), "127.0.0.1", port)
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                return await resp.text()
        finally:
            await runner.cleanup()

    return asyncio.run(asyncio.wait_for(fetch(), 30))


def test_every_dashboard_query_reads_an_exported_metric(cluster: tuple[LocalCluster, int]) -> None:
    c, port = cluster
    with c.client() as client:
        for argv in (["true"], ["false"]):
            wait_for(client, client.submit(job(argv)))
    deadline = time.monotonic() + 10
    text = scrape(port)
    # Fair-share series appear at the first refresh after a user's first job (every 0.2 s here).
    while "minicluster_fairshare_usage_core_seconds{" not in text and time.monotonic() < deadline:
        time.sleep(0.2)
        text = scrape(port)
    have = exported(text) | exported(operator_metrics_text())
    queries = dashboard_queries()
    assert len(queries) >= 20
    missing = [(title, name) for title, expr in queries for name in sorted(metric_names(expr)) if name not in have]
    assert not missing, f"dashboard panels read metrics nobody exports: {missing}"


def test_tasks_cores_and_commits_count_what_happened(cluster: tuple[LocalCluster, int]) -> None:
    c, port = cluster
    before = scrape(port)
    with c.client() as client:
        ids = [client.submit(job(["true"], ntasks=3)), client.submit(job(["false"]))]
        for job_id in ids:
            wait_for(client, job_id)
        # Both of rank 1's cores (rack r1), held while the job runs.
        held = client.submit(job(["sleep", "30"], ntasks=2, nnodes=1, requires=["rack=r1"]))
        try:
            deadline = time.monotonic() + 30
            while client.job(held)["state"] != "RUN":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            during = scrape(port)
        finally:
            client.cancel([held])
        wait_for(client, held)
    after = scrape(port)

    def grew(text: str, series: str) -> float:
        return value(text, series) - value(before, series)

    assert grew(during, "minicluster_tasks_completed_total") == 4   # 3 + 1 tasks ended before the sleeper
    assert grew(during, "minicluster_tasks_failed_total") == 1
    assert grew(after, "minicluster_tasks_completed_total") == 6    # and the sleeper's 2, cancelled
    assert value(during, 'minicluster_rank_cores_busy{rank="1"}') == 2
    assert value(during, 'minicluster_topology_cores_busy{level="rack",domain="rack=r1"}') == 2
    assert value(during, 'minicluster_rank_cores_busy{rank="0"}') == 0
    assert value(after, 'minicluster_rank_cores_busy{rank="1"}') == 0
    assert value(after, 'minicluster_topology_cores{level="rack",domain="rack=r1"}') == 2
    # One observation per commit: the histogram counts exactly the commits, and grew with them.
    commits = value(after, "minicluster_journal_commits_total")
    assert value(after, "minicluster_journal_commit_duration_seconds_count") == commits
    assert value(after, 'minicluster_journal_commit_duration_seconds_bucket{le="+Inf"}') == commits
    assert grew(after, "minicluster_journal_commit_duration_seconds_count") > 0
    assert value(after, "minicluster_journal_commit_duration_seconds_sum") > 0
    assert value(after, "minicluster_journal_stalled") == 0
    assert value(after, "minicluster_journal_stalls_total") == 0


def test_fair_share_usage_per_bank_and_user(cluster: tuple[LocalCluster, int]) -> None:
    c, port = cluster
    with c.client() as client:
        wait_for(client, client.submit(job(["sleep", "1"], ntasks=2)))
    series = 'minicluster_fairshare_usage_core_seconds{bank="physics",user="root",uid="0"}'

    def counted() -> str:  # 2 cores for about a second, decayed by a half-life of days
        text = scrape(port)
        return text if f"{series} " in text and value(text, series) >= 1.5 else ""

    text = until(counted, "a fair-share refresh (every 0.2 s here) counts the job's usage")
    user = value(text, series)
    assert value(text, 'minicluster_fairshare_bank_usage_core_seconds{bank="physics"}') == user
    assert value(text, 'minicluster_fairshare_bank_shares_ratio{bank="physics"}') == 1.0
    assert 0 < value(text, 'minicluster_fairshare_factor{bank="physics",user="root",uid="0"}') <= 1



@pytest.mark.needs("mount", "umount", root=True)  # a small tmpfs to fill
async def test_a_stall_is_counted_and_its_commit_latency_kept(tmp_path: Path) -> None:
    async with journal_stalled_on_a_full_disk(tmp_path / "state") as (journal, filler, pending):
        text = metrics_text(status(journal))
        assert "minicluster_journal_stalled 1" in text and "minicluster_journal_stalls_total 1" in text
        await asyncio.sleep(0.3)
        filler.unlink()
        await asyncio.wait_for(pending, 10)
        text = metrics_text(status(journal))
    assert "minicluster_journal_stalled 0" in text and "minicluster_journal_stalls_total 1" in text
    assert value(text, "minicluster_journal_commit_duration_seconds_count") == journal.commits == 2
    # The stalled commit waited at least the 0.3 s slept above: it is counted above the 0.25 s bucket.
    assert value(text, 'minicluster_journal_commit_duration_seconds_bucket{le="0.25"}') == 1


def status(journal: Journal) -> dict[str, Any]:
    """The journal's part of Broker.metrics_snapshot, around an otherwise empty status."""
    return {"ranks": {}, "jobs": {}, "ready": False, "counters": {"journal_stalls": journal.stalls},
            "journal": {"stalled": journal.stalled is not None, "commit_seconds": journal.commit_seconds}}


@pytest.mark.needs("prometheus")
@pytest.mark.long
def test_every_dashboard_query_returns_data_in_a_real_prometheus(cluster: tuple[LocalCluster, int],
                                                                 tmp_path: Path) -> None:
    c, port = cluster
    with c.client() as client:
        wait_for(client, client.submit(job(["true"], ntasks=2)))
    with operator_endpoint() as operator_port, prometheus(tmp_path, port, operator_port) as api:
        queries = {expr.replace("$__rate_interval", "15s").replace("$namespace", ".*")
                   .replace("$minicluster", ".*").replace("$level", ".*"): title
                   for title, expr in dashboard_queries()}
        deadline = time.monotonic() + 60
        empty = list(queries)
        while empty and time.monotonic() < deadline:  # rate() needs two scrapes of each series in its window
            time.sleep(1)
            empty = [expr for expr in empty if not instant_query(api, expr)]
    assert not empty, f"panels whose queries return no data: {[(queries[e], e) for e in empty]}"


def instant_query(api: str, expr: str) -> list[Any]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


@contextlib.contextmanager
def operator_endpoint() -> Iterator[int]:
    """The operator's /metrics (minicluster/operator/metrics.py) served from a thread of its own, with one
    MiniCluster running."""
    from minicluster.operator.metrics import Metrics, serve

    port = free_port()
    loop = asyncio.new_event_loop()
    metrics = Metrics()
    metrics.set_phase("test", "demo", "Running")
    runner = loop.run_until_complete(serve(metrics, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


@contextlib.contextmanager
def prometheus(tmp_path: Path, broker_port: int, operator_port: int) -> Iterator[str]:
    """Debian's Prometheus scraping the broker (labelled as deploy/monitoring's PodMonitor labels it) and the
    operator every second; yields its API's base URL."""
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "broker", "static_configs": [
                {"targets": [f"127.0.0.1:{broker_port}"], "labels": {"namespace": "test", "minicluster": "demo"}}]},
            {"job_name": "operator", "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]},
        ]}))
    web = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL, stderr=log)
    api = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{api}/-/ready", timeout=2).close()
                break
            time.sleep(0.2)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
