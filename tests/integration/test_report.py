"""`mc report` against real instances: the HTML it writes is read back with html.parser and checked against what
the broker says through the same requests `mc jobs` uses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for


class Page(HTMLParser):
    """Every element's tag and attributes, and each table's cells by its class."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {k: v or "" for k, v in attrs}
        self.elements.append((tag, named))
        if tag == "table":
            self._table = named.get("class", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def all(self, tag: str, **wanted: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in wanted.items())]

    def rows(self, cls: str) -> list[dict[str, str]]:
        header, *body = self.tables[cls]
        return [dict(zip(header, row, strict=True)) for row in body]


def mc(cluster: LocalCluster, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minicluster", *args], env={**os.environ, "MC_URI": cluster.uri},
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def read(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def self_contained(page: Page) -> None:
    for tag, attrs in page.elements:
        assert tag not in ("link", "img", "iframe", "object", "embed"), (tag, attrs)
        for name in ("src", "href", "xlink:href"):
            assert name not in attrs, (tag, attrs)


def test_report_of_a_workflow_shows_each_task_its_rank_failures_and_dependencies(tmp_path) -> None:
    with LocalCluster(tmp_path / "state", size=2, resources="cores=2") as cluster, cluster.client() as c:
        first = c.submit(job(["sh", "-c", "sleep 0.2"], ntasks=2))
        array = c.submit(job(["sh", "-c", '[ "$MC_TASK_INDEX" != 3 ] || exit 3; sleep 0.1'], array="0-5",
                             dependencies=[{"type": "afterok", "jobs": [first]}]))
        last = c.submit(job(["true"], dependencies=[{"type": "afterany", "jobs": [array]}]))
        assert wait_for(c, last)["state"] == "INACTIVE"
        results = {j: c.task_results(j) for j in (first, array, last)}

        done = mc(cluster, "report", "--deps", str(array), "-o", "r.html", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        page = read(tmp_path / "r.html")
        self_contained(page)
        bars = page.all("rect", **{"class": "task"})
        drawn = {(int(b["data-job"]), int(b["data-task"])): (int(b["data-rank"]), b["data-kind"]) for b in bars}
        expected = {(j, row[0]): (row[2], "ok" if row[3] == 0 else "failed") for j, rows in results.items()
                    for row in rows}
        assert drawn == expected
        assert [k for (j, _t), (_r, k) in drawn.items() if j == array].count("failed") == 1

        listed = json.loads(mc(cluster, "jobs", "-a", "--json", str(first), str(array), str(last),
                               cwd=tmp_path).stdout)["jobs"]
        rows = {int(r["id"]): r for r in page.rows("jobs")}
        assert set(rows) == {first, array, last}
        for j in listed:
            row = rows[j["id"]]
            assert (row["state"], row["result"], int(row["ntasks"])) == (j["state"], j["result"], j["ntasks"])
            assert [int(row[k]) for k in ("succeeded", "failed", "cancelled")] == \
                [j["counts"][k] for k in ("succeeded", "failed", "cancelled")]
        edges = {(int(e["data-from"]), int(e["data-to"])) for e in page.all("line", **{"class": "edge"})}
        assert edges == {(first, array), (array, last)}
        assert f"mc report --deps {array} -o r.html" in "".join(page.text)

        unknown = mc(cluster, "report", "999", "-o", "x.html", cwd=tmp_path)
        assert (unknown.returncode, unknown.stderr) == (2, "mc report: error: job 999 not found\n")
        backwards = mc(cluster, "report", "--since", "1h", "--until", "2h", cwd=tmp_path)
        assert backwards.returncode == 2 and len(backwards.stderr.splitlines()) == 1, backwards.stderr
        assert not (tmp_path / "x.html").exists()


def test_report_of_a_time_span_finds_the_jobs_that_ran_in_it(tmp_path) -> None:
    with LocalCluster(tmp_path / "state", size=1, test_exec=True) as cluster, cluster.client() as c:
        jobs = [c.submit(job(["true"], array="0-9")) for _ in range(3)]
        for j in jobs:
            wait_for(c, j)
        done = mc(cluster, "report", "--since", "1h", "-o", "-", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        page = Page()
        page.feed(done.stdout)
        assert {int(r["id"]) for r in page.rows("jobs")} == set(jobs)
        assert sum(int(r["ok"]) for r in page.rows("ranks")) == 30


def test_a_requeued_job_shows_its_preempted_attempt_then_its_final_one(tmp_path) -> None:
    with LocalCluster(tmp_path / "state", size=1, test_exec=True) as cluster, cluster.client() as c:
        j = c.submit(job(["true"], env={"MC_TEST_RUN_DURATION": "1"}))
        next(e for e in c.eventlog(j, follow=True) if e[2] == "start")
        c.requeue([j])
        assert wait_for(c, j)["status"] == 0
        done = mc(cluster, "report", str(j), "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = Page()
    page.feed(done.stdout)
    bars = sorted((int(b["data-attempt"]), b["data-kind"]) for b in page.all("rect", **{"class": "task"}))
    assert bars == [(0, "preempted"), (1, "ok")]


def test_cores_busy_is_drawn_per_rack_and_the_racks_add_up_to_the_total(tmp_path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=4, resources="cores=2", topology="rack", test_exec=True)
    try:
        for rank in range(4):
            cluster.start_rank(rank, env={"MC_PROPERTIES": f"rack=r{rank // 2}"})
        cluster.wait_up()
        with cluster.client() as c:
            array = c.submit(job(["true"], array="0-15", env={"MC_TEST_RUN_DURATION": "0.3"}))
            wait_for(c, array)
        done = mc(cluster, "report", str(array), "-o", "-", cwd=tmp_path)
    finally:
        cluster.stop()
    assert done.returncode == 0, done.stderr
    page = Page()
    page.feed(done.stdout)
    assert {p["data-group"] for p in page.all("path") if "data-group" in p} == {"rack=r0", "rack=r1"}
    rows = page.rows("cores")
    assert any(float(r["total"]) > 0 for r in rows)
    for r in rows:
        assert abs(float(r["rack=r0"]) + float(r["rack=r1"]) - float(r["total"])) < 0.02, r


@pytest.mark.slow
@pytest.mark.long
def test_a_20000_task_array_makes_a_bounded_report(tmp_path) -> None:
    with LocalCluster(tmp_path / "state", size=2, test_exec=True, resources="cores=4") as cluster, \
            cluster.client() as c:
        array = c.submit(job(["true"], array="0-19999", max_retries_per_index=1,
                             env={"MC_TEST_RUN_DURATION": "0.001", "MC_TEST_FAIL_ONCE": "5,17"}))
        assert wait_for(c, array, timeout=300)["status"] == 0
        done = mc(cluster, "report", str(array), "-o", "big.html", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    size = (tmp_path / "big.html").stat().st_size
    print(f"report of 20,000 tasks: {size:,} bytes")
    assert size < 1_500_000
    page = read(tmp_path / "big.html")
    self_contained(page)
    assert not page.all("rect", **{"class": "task"})  # binned, not one bar per task
    ranks = page.rows("ranks")
    assert sum(int(r["ok"]) for r in ranks) == 20_000 and sum(int(r["retried"]) for r in ranks) == 2
    assert {m["data-kind"] for m in page.all("rect", **{"class": "mark"})} == {"retried"}

