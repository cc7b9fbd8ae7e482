"""`mc report` opened in a real browser (headless Chromium over the DevTools protocol, tests/browser.py): for an
array, a failed workflow and a preempted job, the page loads from a file with no console error, no script error and
no failed load; every plot drew marks with a size on the screen, one per drawn attempt; the tooltip follows the
pointer.  A screenshot of each is kept in $MC_ARTIFACTS (CI sets it) or in the test's directory."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.browser import Browser, find_chromium
from tests.integration.conftest import job, wait_for
from tests.integration.test_report import mc, read

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: chromium-headless-shell)")

# Per plot: its svg's size on the screen, how many marks it holds and how many of them have a size there, and the
# labels that stick out of the plot (the edge cuts them).
DRAWN = """[...document.querySelectorAll('svg')].map(svg => {
  const box = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll('rect,path,line,circle,polyline')];
  const shown = marks.filter(m => { const b = m.getBoundingClientRect(); return b.width > 0 || b.height > 0; });
  const cut = [...svg.querySelectorAll('text')].filter(t => { const b = t.getBoundingClientRect();
    return b.left < box.left - 0.5 || b.right > box.right + 0.5 || b.top < box.top - 0.5 || b.bottom > box.bottom + 0.5;
  }).map(t => t.textContent);
  return {width: box.width, height: box.height, marks: marks.length, shown: shown.length, cut: cut};
})"""
# The centre of the first task bar on the screen, after scrolling it into view, and the text its tooltip should show.
FIRST_BAR = """(() => { const bar = document.querySelector('rect.task'); bar.scrollIntoView({block: 'center'});
  const b = bar.getBoundingClientRect(); return {x: b.x + b.width / 2, y: b.y + b.height / 2,
  tip: bar.closest('[data-tip]').getAttribute('data-tip')}; })()"""
TIP = "(() => { const t = document.getElementById('tip'); return [getComputedStyle(t).display, t.textContent]; })()"


def an_array(c: Client) -> list[int]:
    array = c.submit(job(["sh", "-c", '[ "$MC_TASK_INDEX" != 7 ] || exit 3; sleep 0.05'], array="0-23",
                         name="array"))
    wait_for(c, array)
    return [array]


def a_failed_workflow(c: Client) -> list[int]:
    prepare = c.submit(job(["sh", "-c", "sleep 0.1"], name="prepare", ntasks=2))
    sweep = c.submit(job(["sh", "-c", '[ "$MC_TASK_INDEX" != 2 ] || exit 1'], array="0-5", name="sweep",
                         dependencies=[{"type": "afterok", "jobs": [prepare]}]))
    summary = c.submit(job(["true"], name="summary", dependencies=[{"type": "afterok", "jobs": [sweep]}]))
    wait_for(c, summary)
    return [prepare]


def a_preempted_job(c: Client) -> list[int]:
    j = c.submit(job(["sleep", "0.5"], name="preempted"))
    next(e for e in c.eventlog(j, follow=True) if e[2] == "start")
    c.requeue([j])
    wait_for(c, j)
    return [j]


SCENARIOS: dict[str, tuple[Callable[[Client], list[int]], tuple[str, ...]]] = {
    "array": (an_array, ()),
    "failed-workflow": (a_failed_workflow, ("--deps",)),
    "preempted": (a_preempted_job, ()),
}


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    with Browser(CHROMIUM, tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_report_draws_in_a_browser_without_errors(scenario: str, browser: Browser, tmp_path: Path) -> None:
    run, options = SCENARIOS[scenario]
    with LocalCluster(tmp_path / "state", size=2, resources="cores=2") as cluster, cluster.client() as c:
        ids = run(c)
        done = mc(cluster, "report", *options, *map(str, ids), "-o", "report.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = read(tmp_path / "report.html")
    bars = page.all("rect", **{"class": "task"})
    kinds = {b["data-kind"] for b in bars}
    assert {"array": "failed", "failed-workflow": "failed", "preempted": "preempted"}[scenario] in kinds

    browser.errors.clear()
    browser.open((tmp_path / "report.html").as_uri())
    plots = browser.evaluate(DRAWN)
    assert browser.errors == []
    assert len(plots) >= 3 and len(plots) == len(page.all("svg"))
    for plot in plots:
        assert plot["width"] > 100 and plot["height"] > 20, plot
        assert plot["shown"] > 0 and plot["cut"] == [], plot
    assert browser.evaluate("document.querySelectorAll('rect.task').length") == len(bars)
    shown_bars = browser.evaluate("[...document.querySelectorAll('rect.task')]"
                                  ".filter(r => r.getBoundingClientRect().width > 0).length")
    assert shown_bars == len(bars)

    bar = browser.evaluate(FIRST_BAR)
    assert browser.evaluate(TIP)[0] == "none"
    browser.move_pointer(bar["x"], bar["y"])
    assert browser.evaluate(TIP) == ["block", bar["tip"]]
    browser.move_pointer(1, 1)
    browser.evaluate("window.scrollTo(0, 0)")

    png = browser.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    keep = Path(os.environ.get("MC_ARTIFACTS") or tmp_path)
    keep.mkdir(parents=True, exist_ok=True)
    (keep / f"report-{scenario}.png").write_bytes(png)
    assert browser.errors == []
