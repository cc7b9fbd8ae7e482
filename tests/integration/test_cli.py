"""The user commands end to end: a real local instance from `mc start`, the real `mc`/`mc-submit` as processes."""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster import Client, ClientError, config
from minicluster.cli.format import JOB_KEYS

SIZE = 3


def mc(*argv: str, input: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    tool = "mc-submit" if argv[0] == "submit" else "mc"
    args = list(argv[1:]) if tool == "mc-submit" else list(argv)
    return subprocess.run([tool, *args], input=input, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("mc")
    proc = subprocess.Popen([sys.executable, "-m", "minicluster", "start", "--size", str(SIZE), "--state-dir",
                             str(state)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    saved = os.environ.get("MC_URI")
    try:
        uri = _wait_ready(state, proc)
        os.environ["MC_URI"] = uri
        yield uri
    finally:
        subprocess.run(["mc", "shutdown"], capture_output=True, timeout=15)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if saved is None:
            os.environ.pop("MC_URI", None)
        else:
            os.environ["MC_URI"] = saved


def _wait_ready(state: Path, proc: subprocess.Popen[bytes]) -> str:
    """The instance's URI once every rank is up (the socket's place comes from the config mc start wrote)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        assert proc.poll() is None, "mc start exited early"
        try:
            uri = f"unix://{config.load(state / 'config.toml').socket_path}"
            with Client(uri) as c:
                if all(r["state"] == "up" for r in c.status()["ranks"]) and len(c.resources()) == SIZE:
                    return uri
        except (ClientError, OSError, config.ConfigError):
            pass
        time.sleep(0.05)
    raise TimeoutError("the instance did not come up")


def job_json(job: int) -> dict:
    out = mc("jobs", "--json", str(job))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["jobs"][0]


def wait_state(job: int, state: str, timeout: float = 15) -> None:
    deadline = time.time() + timeout
    with Client() as client:
        while client.job(job)["state"] != state:
            assert time.time() < deadline, f"job {job} never reached {state}"
            time.sleep(0.05)


@pytest.mark.smoke
def test_mc_start_runs_a_command_across_nodes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MC_URI"}
    out = subprocess.run(["mc", "start", "--size", "2", "--", "mc", "run", "-N", "2", "-n", "4", "hostname"],
                         capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [os.uname().nodename] * 4


def test_submit_prints_the_id_and_wait_exits_with_the_status() -> None:
    out = mc("submit", "--wait", "sh", "-c", "exit 3")
    assert out.returncode == 3
    job = int(out.stdout)
    summary = job_json(job)
    assert summary["status"] == 3 and summary["result"] == "FAILED" and summary["name"] == "sh"
    plain = mc("submit", "true")
    assert plain.returncode == 0 and int(plain.stdout) > job


# The installed `mc-submit` script run as is, under -S (so that no .pth path finder of an editable install loads re
# and pathlib first) with sys.path as the install has it; it prints what it imported once it exits.
SCRIPT_IMPORTS = """
import atexit, sys
before = set(sys.modules)
atexit.register(lambda: sys.stderr.write(repr(sorted(set(sys.modules) - before))))
script = sys.argv[1]
sys.argv = sys.argv[1:]
exec(compile(open(script).read(), script, "exec"), {"__name__": "__main__"})
"""


def test_mc_submit_script_imports() -> None:
    """mc-submit of a plain line imports neither argparse, re, socket.py nor msgpack (issue 17 item 6), and the
    broker takes its job: what tests/unit/test_client_imports.py pins, through the installed script."""
    script = shutil.which("mc-submit")
    assert script is not None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[1:]))
    out = subprocess.run([sys.executable, "-S", "-c", SCRIPT_IMPORTS, script, "-n", "1", "--mem", "10", "-t", "5m",
                          "--env", "A=1", "true"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    job = int(out.stdout)
    loaded = ast.literal_eval(out.stderr)
    assert "minicluster.cli.submit" in loaded
    top = {name.split(".")[0] for name in loaded}
    heavy = {"argparse", "re", "socket", "selectors", "select", "enum", "collections", "msgpack", "datetime"}
    assert top & heavy == set()
    with Client() as client:
        assert [done["status"] for done in client.wait([job])] == [0]


def test_run_streams_both_streams_and_exits_with_the_status() -> None:
    out = mc("run", "-N", "2", "-n", "2", "--mpi", "none", "sh", "-c", "echo out $MC_TASK_RANK; echo err >&2; exit 4")
    assert out.returncode == 4
    assert sorted(out.stdout.splitlines()) == ["out 0", "out 1"]
    assert out.stderr.count("err\n") == 2


def test_run_passes_environment_cwd_and_arguments(tmp_path: Path) -> None:
    out = subprocess.run(["mc", "run", "--env", "GREETING=hi there", "sh", "-c", 'echo "$GREETING" "$1" "$PWD"',
                          "sh", "-n x"], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"hi there -n x {tmp_path}\n"


def test_cancel_then_attach_reports_the_cancellation() -> None:
    job = int(mc("submit", "sleep", "60").stdout)
    wait_state(job, "RUN")
    assert mc("cancel", str(job)).returncode == 0
    attach = mc("attach", str(job))
    assert attach.returncode == 143
    assert "exception type=cancel" in attach.stderr
    assert job_json(job)["result"] == "CANCELLED"


def test_run_ctrl_c_cancels_the_job() -> None:
    proc = subprocess.Popen(["mc", "run", "sleep", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 15
    with Client() as client:
        while not [j for j in client.jobs() if j["name"] == "sleep" and j["state"] == "RUN"]:
            assert time.time() < deadline
            time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 143
    assert "cancelling job" in err


def test_jobs_json_shape_and_table() -> None:
    job = int(mc("submit", "--wait", "--name", "shape", "true").stdout)
    entry = job_json(job)
    assert tuple(entry) == JOB_KEYS
    assert entry["state"] == "INACTIVE" and entry["result"] == "COMPLETED" and entry["status"] == 0
    assert set(entry["counts"]) == {"pending", "running", "succeeded", "failed", "cancelled"}
    assert isinstance(entry["t_submit"], float) and entry["runtime"] is not None
    listing = mc("jobs", "-a")
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "USER", "STATE"]
    assert any(r.split()[:2] == [str(job), "shape"] and "COMPLETED" in r for r in rows)
    assert str(job) not in [r.split()[0] for r in mc("jobs").stdout.splitlines()[1:]]


def test_array_logs_by_index_and_failed_indices() -> None:
    out = mc("submit", "--wait", "--cc", "0-3", "sh", "-c", "echo idx {cc}; exit $(( {cc} % 2 ))")
    assert out.returncode == 1 and out.stderr == ""
    job = int(out.stdout)
    assert mc("logs", "--index", "2", str(job)).stdout == "idx 2\n"
    assert sorted(mc("logs", str(job)).stdout.splitlines()) == [f"idx {i}" for i in range(4)]
    assert mc("jobs", str(job), "--failed").stdout == "1,3\n"
    assert json.loads(mc("jobs", str(job), "--failed", "--json").stdout) == {"jobs": [{"id": job, "failed": "1,3"}]}
    table = mc("jobs", str(job)).stdout.splitlines()
    assert len(table) == 2 and "2 ok, 2 failed" in table[1]


def test_bulksubmit_submits_every_line_and_waits() -> None:
    out = mc("bulksubmit", "--wait", input="echo a\n# a comment\n\necho 'b c'\nsh -c 'exit 7'\n")
    assert out.returncode == 7, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    assert len(ids) == 3 and ids == sorted(ids)
    assert mc("logs", str(ids[1])).stdout == "b c\n"
    bad = mc("bulksubmit", input="echo ok\necho 'unterminated\n")
    assert bad.returncode == 2 and bad.stderr.startswith("mc bulksubmit: error: line 2:") and bad.stdout == ""


def test_eventlog_lists_the_job_lifecycle() -> None:
    job = int(mc("submit", "--wait", "true").stdout)
    lines = mc("eventlog", str(job)).stdout.splitlines()
    names = [line.split()[2] for line in lines]
    assert names[0] == "submit" and names[-1] == "clean" and "finish" in names
    assert [int(line.split()[0]) for line in lines] == list(range(len(lines)))
    later = mc("eventlog", "--from", "2", str(job)).stdout.splitlines()
    assert later == lines[2:]


def test_resources_drain_and_status() -> None:
    assert mc("drain", "2", "--reason", "bad dimm").returncode == 0
    try:
        ranks = json.loads(mc("resources", "--json").stdout)["ranks"]
        assert [(r["rank"], r["state"]) for r in ranks] == [(0, "up"), (1, "up"), (2, "drained")]
        assert ranks[2]["reason"] == "bad dimm"
        assert "bad dimm" in mc("resources").stdout
    finally:
        assert mc("undrain", "2").returncode == 0
    status = json.loads(mc("status", "--json").stdout)
    assert status["size"] == SIZE and [r["state"] for r in status["ranks"]] == ["up"] * SIZE


@pytest.mark.parametrize("argv, code, message", [
    (("submit", "-N", "99", "true"), 1, "mc-submit: error: nnodes: needs 99 nodes"),
    (("submit", "-t", "soon", "true"), 2, "mc-submit: error: argument -t/--time-limit: bad time limit"),
    (("submit", "--cc", "0-3", "-n", "2", "true"), 2, "mc-submit: error: array:"),
    (("submit",), 2, "mc-submit: error: no command given"),
    (("logs", "999999"), 1, "mc logs: error: job 999999"),
    (("cancel", "999999"), 1, "mc cancel: error: job 999999"),
    (("jobs", "abc"), 2, "mc jobs: error: argument ID: 'abc' is not a job id"),
    (("frobnicate",), 2, "mc: error: unknown command 'frobnicate'"),
])
def test_bad_input_is_one_clear_line(argv: tuple[str, ...], code: int, message: str) -> None:
    out = mc(*argv)
    assert out.returncode == code
    assert out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr


def test_client_pipelines_submissions() -> None:
    spec = {"argv": ["true"], "cwd": "/"}
    with Client() as client:
        for _ in range(50):
            client.submit_async(spec)
        client.submit_async({**spec, "nnodes": 99, "ntasks": 99})
        results = client.collect()
        assert all(isinstance(r, int) for r in results[:50]) and results[:50] == sorted(results[:50])
        assert isinstance(results[50], ClientError) and results[50].code == "infeasible"
        many = client.submit_many([spec] * 200)
        assert len(many) == 200 and all(isinstance(j, int) for j in many)
        finished = {r["job"]: r["status"] for r in client.wait(many + results[:50])}
        assert set(finished) == set(many + results[:50]) and set(finished.values()) == {0}
        with pytest.raises(ClientError) as err:
            client.job(10**9)
        assert err.value.code == "not-found"
        assert client.hello()["size"] == SIZE
