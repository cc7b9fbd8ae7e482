"""Every integer and time option of mc-submit and mc run, given a value beyond its range, against a real broker:
one line naming the option and its range, exit status 2, nothing submitted.  A value past 64 bits used to end in
msgpack's OverflowError traceback while the job was being sent (issue 24, items 11 and 12)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster

MC_SUBMIT = str(Path(__file__).resolve().parents[2] / "scripts" / "mc-submit")
HUGE = "1000000000000000000000"
# (the options, what the message must say)
CASES = [
    (["--retries", HUGE], "argument --retries: must be a number of retries from 0 to 1000000, got " + HUGE),
    (["--cc", "0-3", "--max-retries-per-index", HUGE], "argument --max-retries-per-index: must be a number of "
                                                        "retries from 0 to 1000000"),
    (["--cc", "0-3", "--max-failed-indexes", HUGE], "argument --max-failed-indexes: must be a number of indexes"),
    (["--cc", "0-3", "--success-count", HUGE], "argument --success-count: must be a number of indexes from 1 to"),
    (["-n", "2", "--success-task", HUGE], "argument --success-task: must be a task rank from 0 to"),
    (["-N", HUGE], "argument -N/--nodes: must be a number of nodes from 1 to 16777216"),
    (["-n", HUGE], "argument -n/--ntasks: must be a number of tasks from 1 to 16777216"),
    (["-c", HUGE], "argument -c/--cores-per-task: must be a number of cores from 1 to 16777216"),
    (["-g", HUGE], "argument -g/--gpus-per-task: must be a number of GPUs from 0 to 16777216"),
    (["--tasks-per-node", HUGE], "argument --tasks-per-node: must be a number of tasks from 1 to 16777216"),
    (["--mem", HUGE + "G"], "argument --mem: memory size '" + HUGE + "G' is more than the largest"),
    (["--urgency", HUGE], "argument --urgency: must be an urgency from 0 to 31"),
    (["-t", "99999999999d"], "argument -t/--time-limit: time limit must be above 0 and below 100000000000 seconds"),
    (["--retries", "1", "--retry-delay", "99999999d"], "argument --retry-delay: must be at most 86400 seconds"),
    (["--begin-time", "+99999999d"], "'+99999999d' is not between @0 (1970-01-01) and @100000000000 (5138-11-16)"),
    (["--begin-time", "@-1"], "'@-1' is not between @0"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with LocalCluster(tmp_path_factory.mktemp("ranges"), size=1, resources="cores=2") as cluster:
        yield {**os.environ, "MC_URI": cluster.uri}


@pytest.mark.parametrize(("options", "says"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_out_of_range_option_is_one_line(env: dict[str, str], options: list[str], says: str) -> None:
    for tool in ([sys.executable, MC_SUBMIT], [sys.executable, "-m", "minicluster", "run"]):
        out = subprocess.run([*tool, *options, "true"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    jobs = subprocess.run([sys.executable, "-m", "minicluster", "jobs", "-a"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "true" not in jobs.stdout  # nothing was submitted


def test_a_node_too_small_says_what_the_largest_holds(env: dict[str, str]) -> None:
    # `mc run -N 1 -n 4` on ranks of 2 cores said "needs 1 nodes that each hold 4 tasks of 1 core, the MiniCluster
    # has 0" and no more (issue 24, item 13).
    out = subprocess.run([sys.executable, "-m", "minicluster", "run", "-N", "1", "-n", "4", "true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert ("needs 1 node that holds 4 tasks of 1 core, the MiniCluster has 0; the largest node holds 2 such tasks"
            " (2 cores)") in out.stderr, out.stderr
