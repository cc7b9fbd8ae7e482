"""mc-submit parses a plain line without argparse (minicluster/cli/quickparse.py): from the same option table, to
the same result as argparse, and it leaves every line it is unsure of to argparse (which gives the message)."""
from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from minicluster.cli.options import _unit_time, memory_mb, parse_job_args
from minicluster.cli.submit import SUBMIT_HELP, _parser, _submit_args
from minicluster.model.workflowforms import WorkflowError, parse_duration

SAME = [
    ["true"], ["--", "true"], ["echo", "-n", "--wait"], ["-n", "2", "hostname"], ["--ntasks", "2", "hostname"],
    ["--ntasks=2", "hostname"], ["-N", "2", "-n", "4", "-c", "2", "-g", "1", "--mem", "4G", "-t", "1:00:00", "x"],
    ["-t", "90s", "--time-limit=2h", "x"], ["--env", "A=1", "--env", "B", "--env=-C", "--env-clear", "x"],
    ["--requires", "zone=a", "--requires", "ssd", "--policy", "pack", "x"], ["--cc", "0-9", "--", "echo", "{cc}"],
    ["--wait", "true"], ["--watch", "-l", "true"], ["--label", "--wait", "--", "-x"],
    ["--name", "n", "--urgency", "31", "--cwd", "/tmp", "--output", "o-{id}", "--mpi", "pmix", "x"],
    ["--exclusive", "--gpu-affinity", "--tasks-per-node", "2", "-q", "q", "--project", "p", "x"],
    ["--resources", "node[2]>core[4]", "--locality", "rack", "--spread", "zone", "x"],
    ["--hold", "--retries", "3", "--retry-delay", "10m", "--max-retries-per-index", "1", "--cc", "1-3", "x"],
    ["-d", "afterok:1", "--dependency", "afterany:2:3", "--begin-time", "+10m", "x"],
    ["--on-exit", "2=fail", "--on-signal", "KILL=retry", "--max-failed-indexes", "2", "x"],
    ["--success-indexes", "0", "--success-count", "1", "--success-task", "0", "x"], ["-n", "2", "-n", "3", "x"],
    ["-", "x"],
]

# Lines for argparse: help, abbreviations, attached short values, bad values, missing command or value, both
# --wait and --watch, an option's value that looks like an option.
TO_ARGPARSE = [
    [], ["-h"], ["--help", "x"], ["--nod", "2", "x"], ["-n2", "x"], ["-n=2", "x"], ["-n", "0", "x"],
    ["-n", "two", "x"], ["--mpi", "mvapich", "x"], ["--urgency", "32", "x"], ["-t", "soon", "x"], ["-n", "2"],
    ["--wait", "--watch", "x"], ["--name"], ["--env", "-FOO", "x"], ["--wait=1", "x"], ["-5"],
    ["--cc", "3-1", "x"], ["-d", "whenever:1", "x"], ["--unknown", "x"],
]


def _argparse(argv: list[str]) -> dict[str, object]:
    return vars(parse_job_args(_parser("mc-submit", SUBMIT_HELP, run=False), argv))


@pytest.mark.parametrize("argv", SAME, ids=" ".join)
def test_quick_parse_is_argparse(argv: list[str]) -> None:
    quick = _submit_args(argv, "mc-submit")
    assert type(quick).__name__ == "Args", "a plain line went through argparse"
    assert vars(quick) == _argparse(argv)


@pytest.mark.parametrize("argv", TO_ARGPARSE, ids=" ".join)
def test_unsure_lines_go_to_argparse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        args = _submit_args(argv, "mc-submit")
    except SystemExit as exc:
        assert exc.code in (0, 2)
        return
    assert type(args).__name__ == "Namespace", "quick_args took a line it should leave to argparse"


def test_argparse_errors_unchanged() -> None:
    """The messages of a line left to argparse are argparse's, through the installed mc-submit."""
    for argv, message in [(["--urgency", "32", "x"], "argument --urgency: must be an urgency from 0 to 31, got 32"),
                          (["--wait", "--watch", "x"], "argument --watch: not allowed with argument --wait"),
                          (["-t", "soon", "x"], "argument -t/--time-limit: bad time limit 'soon'")]:
        out = subprocess.run([sys.executable, "-m", "minicluster", "submit", *argv], capture_output=True,
                             text=True, timeout=60, env={"MC_URI": "/nonexistent"})
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_hand_parsed_sizes_match_the_regular_expressions() -> None:
    """time_limit's `90s` form, memory_mb and the workflow durations (--retry-delay, --begin-time +10m) parse
    without re exactly what the expressions they replace matched, in ASCII digits only (٣ is refused)."""
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    mib = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
    alphabet = ["", "1", "0", "٣", "²", ".", "m", "M", "b", "B", "g", "t", "s", "h", "d", "x", " ", "-"]
    for text in {"".join(p) for n in (1, 2, 3, 4) for p in itertools.product(alphabet, repeat=n)}:
        duration = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip(), re.ASCII)  # time_limit strips first
        assert _unit_time(text.strip()) == (float(duration[1]) * seconds[duration[2]] if duration else None), text
        workflow_duration = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip(), re.ASCII)
        try:
            parsed: float | None = parse_duration(text)
        except WorkflowError:
            parsed = None
        assert parsed == (float(workflow_duration[1]) * ({"": 1} | seconds)[workflow_duration[2]]
                          if workflow_duration else None), text
        size = re.fullmatch(r"(\d+)([mMgGtT]?)[bB]?", text.strip(), re.ASCII)
        try:
            got: int | None = memory_mb(text)
        except Exception:
            got = None
        assert got == (int(size[1]) * mib[size[2].lower()] if size else None), text
