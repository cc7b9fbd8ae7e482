"""CLI option parsing, jobspec building and output formatting (no broker needed)."""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import pytest
from rich.console import Console

from minicluster.cli import format as fmt
from minicluster.cli.bulk import parse_lines
from minicluster.cli.common import UsageError, exit_status, guarded, ranks
from minicluster.cli.main import COMMANDS, main as mc_main
from minicluster.cli.options import (add_command_argument, add_job_options, build_env, command_of,
                                     jobspec_from_args, memory_mb, parse_job_args, time_limit)
from minicluster.client import ClientError, socket_path
from minicluster.config import ConfigError
from minicluster.model.jobspec import InvalidJobspec, from_wire


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_job_options(parser)
    add_command_argument(parser)
    return parser.parse_args(list(argv))


def spec(*argv: str, environ: dict[str, str] | None = None) -> dict:
    args = parse(*argv)
    return jobspec_from_args(args, command_of(args), environ={"HOME": "/root"} if environ is None else environ,
                             cwd="/tmp")


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("5:00", 300), ("1:30", 90), ("1:00:00", 3600), ("2-0", 2 * 86400),
    ("1-2:03:04", 86400 + 7384), ("1-2", 86400 + 7200), ("90s", 90), ("10m", 600), ("2h", 7200),
    ("1d", 86400), ("1.5h", 5400), (" 45 ", 2700),
])
def test_time_limit_formats(text: str, seconds: float) -> None:
    assert time_limit(text) == seconds


@pytest.mark.parametrize("text", ["0", "0s", "", "5x", "1:2:3:4", "-5", "a-1", "1:xx", "h", "1-"])
def test_time_limit_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        time_limit(text)


def test_memory_sizes() -> None:
    assert [memory_mb(t) for t in ("512", "512M", "4G", "4g", "1T", "2GB")] == [512, 512, 4096, 4096, 1 << 20, 2048]
    with pytest.raises(argparse.ArgumentTypeError):
        memory_mb("lots")


def test_remainder_belongs_to_the_command() -> None:
    assert command_of(parse("-n", "2", "hostname", "-n", "3", "--env", "X")) == ["hostname", "-n", "3", "--env", "X"]
    assert command_of(parse("-n2", "--", "-weird-cmd", "--help")) == ["-weird-cmd", "--help"]
    assert command_of(parse("ls", "--", "x")) == ["ls", "--", "x"]
    assert command_of(parse()) == []


def test_defaults_give_a_minimal_valid_jobspec() -> None:
    s = spec("echo", "hi")
    assert s["argv"] == ["echo", "hi"] and s["ntasks"] == 1 and s["nnodes"] == 0
    assert s["cwd"] == "/tmp" and s["env"] == {"HOME": "/root"} and s["urgency"] == 16
    for absent in ("time_limit", "name", "output", "array", "policy", "mpi"):
        assert absent not in s
    assert from_wire(s).name == "echo"


def test_full_option_set_maps_to_jobspec_fields() -> None:
    s = spec("-N", "2", "--tasks-per-node", "4", "-c", "2", "-g", "1", "--mem", "1G", "--exclusive",
             "-t", "1:00:00", "--name", "sim", "--urgency", "31", "--requires", "zone=a", "--requires", "ssd",
             "--policy", "pack", "--mpi", "none", "--output", "out.{id}", "--cwd", "/work", "sim", "-x")
    assert s["ntasks"] == 8 and s["nnodes"] == 2 and s["tasks_per_node"] == 4
    assert (s["cores_per_task"], s["gpus_per_task"], s["mem_per_task"]) == (2, 1, 1024)
    assert s["exclusive"] is True and s["time_limit"] == 3600.0 and s["name"] == "sim" and s["urgency"] == 31
    assert s["requires"] == ["zone=a", "ssd"] and s["policy"] == "pack" and s["mpi"] == "none"
    assert s["output"] == "out.{id}" and s["cwd"] == "/work" and s["argv"] == ["sim", "-x"]


def test_topology_options_and_resource_trees() -> None:
    s = spec("-N", "4", "--locality", "rack", "--spread", "node-group", "-g", "1", "--gpu-affinity", "true")
    assert (s["locality"], s["spread"], s["gpu_affinity"]) == ("rack", "node-group", True)
    assert from_wire(s).shape().groups == (("rack", 1, False), ("node-group", 4, False))
    t = spec("--resources", "rack[1]>node[2]>slot[3]>core[1]", "true")
    assert "ntasks" not in t and from_wire(t).ntasks == 6
    assert from_wire(t).resources == [{"type": "rack", "count": 1, "with": [
        {"type": "node", "count": 2, "with": [{"type": "slot", "count": 3, "with": [
            {"type": "core", "count": 1}]}]}]}]
    with pytest.raises(InvalidJobspec, match="replaces nnodes"):
        spec("--resources", "node[2]", "-N", "2", "true")
    with pytest.raises(InvalidJobspec, match="ntasks: the resource tree has 2"):
        spec("--resources", "node[2]", "-n", "3", "true")
    with pytest.raises(InvalidJobspec, match="no GPU"):
        spec("--gpu-affinity", "true")
    with pytest.raises(InvalidJobspec, match="level name 'Rack'"):
        spec("--locality", "Rack", "true")
    with pytest.raises(InvalidJobspec, match="resources 'node\\[2'"):
        spec("--resources", "node[2", "true")


def test_nodes_alone_mean_one_task_per_node() -> None:
    assert spec("-N", "3", "true")["ntasks"] == 3
    assert spec("-N", "2", "-n", "8", "true")["ntasks"] == 8


def test_relative_cwd_is_made_absolute() -> None:
    assert spec("--cwd", "sub", "true")["cwd"].endswith("/sub")
    assert spec("--cwd", "sub", "true")["cwd"].startswith("/")


def test_array_option_keeps_the_idset_and_cc() -> None:
    s = spec("--cc", "1-2,5", "echo", "{cc}")
    assert s["array"] == "1-2,5" and s["argv"] == ["echo", "{cc}"]


def test_array_with_many_tasks_is_refused_locally() -> None:
    with pytest.raises(InvalidJobspec, match="array"):
        spec("--cc", "0-3", "-n", "2", "true")


@pytest.mark.parametrize("bad", [["--cc", "3-1", "x"], ["--cc", "a", "x"], ["-n", "0", "x"],
                                 ["--urgency", "32", "x"], ["--policy", "best", "x"], ["--mpi", "ompi", "x"],
                                 ["-c", "two", "x"], ["-t", "soon", "x"]])
def test_bad_options_are_usage_errors(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from minicluster.cli.submit import main as submit_main

    with pytest.raises(SystemExit) as exit_info:
        submit_main(bad)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mc-submit: error:") and err.count("\n") == 1


def test_env_is_the_submitters_then_each_setting_in_order() -> None:
    here = {"PATH": "/bin", "HOME": "/root", "SECRET": "x"}
    assert build_env(["A=1", "-SECRET", "B=x=y"], False, here) == {"PATH": "/bin", "HOME": "/root", "A": "1",
                                                                    "B": "x=y"}
    assert build_env(["PATH", "A="], True, here) == {"PATH": "/bin", "A": ""}
    with pytest.raises(InvalidJobspec, match="NOPE"):
        build_env(["NOPE"], True, here)
    with pytest.raises(InvalidJobspec):
        build_env(["=1"], True, here)


@pytest.mark.parametrize("argv", [["--env", "-SECRET", "true"], ["--env=-SECRET", "true"]])
def test_env_minus_drops_a_variable_as_documented(argv: list[str]) -> None:
    from minicluster.cli.submit import _parser

    args = parse_job_args(_parser("mc run", "", run=True), argv)
    assert args.env == ["-SECRET"] and command_of(args) == ["true"]
    spec = jobspec_from_args(args, command_of(args), environ={"SECRET": "x", "KEEP": "1"}, cwd="/tmp")
    assert spec["env"] == {"KEEP": "1"}


def test_values_after_the_command_are_the_commands() -> None:
    from minicluster.cli.submit import _parser

    args = parse_job_args(_parser("mc run", "", run=True), ["-n", "2", "env", "--env", "-x"])
    assert args.ntasks == 2 and args.env == [] and command_of(args) == ["env", "--env", "-x"]


def test_negative_counts_say_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    from minicluster.cli.submit import main as submit_main

    with pytest.raises(SystemExit):
        submit_main(["-n", "-1", "true"])
    assert capsys.readouterr().err == (
        "mc-submit: error: argument -n/--ntasks: must be a number of tasks from 1 to 16777216, got -1 (see --help)\n")


def test_env_clear_sends_nothing_by_default() -> None:
    assert spec("--env-clear", "true", environ={"X": "1"})["env"] == {}
    assert spec("--env", "Y=2", "true", environ={"X": "1"})["env"] == {"X": "1", "Y": "2"}


def test_no_command_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    from minicluster.cli.submit import main as submit_main

    assert submit_main(["-n", "2"]) == 2
    assert capsys.readouterr().err == "mc-submit: error: no command given\n"


def test_bulk_lines_split_like_a_shell() -> None:
    lines = ["echo a\n", "\n", "# comment\n", "sh -c 'exit 3'  # trailing\n", 'echo "b c"\n']
    assert parse_lines(lines) == [(1, ["echo", "a"]), (4, ["sh", "-c", "exit 3"]), (5, ["echo", "b c"])]
    with pytest.raises(UsageError, match="line 2"):
        parse_lines(["true\n", "echo 'unterminated\n"])


def test_ranks_accept_idsets() -> None:
    assert ranks(["1-3", "7", "2"]) == [1, 2, 3, 7]
    with pytest.raises(UsageError):
        ranks(["x"])


def test_exit_status() -> None:
    assert exit_status(0, None) == 0 and exit_status(3, None) == 3 and exit_status(143, "cancel") == 143
    assert exit_status(None, "cancel") == 1 and exit_status(None, None) == 0 and exit_status(300, None) == 255


def test_guarded_turns_errors_into_one_line(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MC_DEBUG", raising=False)

    def fail(exc: BaseException):
        def run() -> int:
            raise exc
        return run

    assert guarded("mc", fail(ClientError("not-found", "job 9 not found"))) == 1
    assert guarded("mc", fail(FileNotFoundError(2, "No such file or directory", "cmds.txt"))) == 1
    assert guarded("mc", fail(InvalidJobspec("ntasks: bad"))) == 2
    assert guarded("mc", fail(ConfigError("size: bad"))) == 2
    assert guarded("mc", fail(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err.splitlines() == [
        "mc: error: job 9 not found", "mc: error: cmds.txt: No such file or directory", "mc: error: ntasks: bad",
        "mc: error: size: bad"]
    with pytest.raises(ValueError, match="a bug"):  # any other ValueError is a bug: its traceback is shown
        guarded("mc", fail(ValueError("a bug")))


def test_socket_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC_URI", "unix:///x/broker.sock")
    assert socket_path() == "/x/broker.sock"
    assert socket_path("unix:///y.sock") == "/y.sock"
    with pytest.raises(ClientError, match="unix://"):
        socket_path("tcp://host:1")
    monkeypatch.delenv("MC_URI")
    monkeypatch.setattr("minicluster.client.DEFAULT_SOCKETS", ("/nonexistent/broker.sock",))
    with pytest.raises(ClientError, match="no MiniCluster found"):
        socket_path()


def test_default_socket_is_where_a_default_config_broker_listens(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    # `kubectl exec POD -- mc-submit ...` has no MC_URI unless the pod sets it: the client must look where a
    # broker with the default state_dir (the pods' one) listens.
    from minicluster.client import DEFAULT_SOCKETS
    from minicluster.config import InstanceConfig
    from minicluster.operator import manifests

    assert InstanceConfig().socket_path in DEFAULT_SOCKETS
    assert InstanceConfig(state_dir=manifests.STATE_DIR).socket_path in DEFAULT_SOCKETS
    monkeypatch.delenv("MC_URI", raising=False)
    sock = tmp_path / "broker.sock"
    sock.touch()
    monkeypatch.setattr("minicluster.client.DEFAULT_SOCKETS", ("/nonexistent/broker.sock", str(sock)))
    assert socket_path() == str(sock)


def test_mc_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert mc_main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("run", "submit", "bulksubmit", "jobs", "cancel", "attach", "logs", "eventlog", "resources",
                 "drain", "undrain", "shutdown", "status", "start", "broker", "worker", "boot", "operator"):
        assert f"\n  {name} " in out
    assert set(COMMANDS) <= set(out.split())
    assert mc_main(["nope"]) == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert mc_main(["--version"]) == 0
    assert capsys.readouterr().out == "mc (minicluster) 0.1.0\n"


def test_errors_name_the_subcommand(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC_URI", "unix:///nonexistent/broker.sock")
    assert mc_main(["jobs"]) == 1
    assert capsys.readouterr().err.startswith("mc jobs: error: cannot reach the MiniCluster")


def test_missing_subcommand_module_fails_alone(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMMANDS, "ghost", ("minicluster.cli.no_such_module", "main", "x"))
    assert mc_main(["ghost"]) == 1
    assert "`mc ghost` is unavailable" in capsys.readouterr().err


SUMMARY = {"id": 7, "name": "sim", "uid": 0, "state": "INACTIVE", "urgency": 16, "t_submit": 100.0,
           "t_run": 101.0, "t_inactive": 111.5, "ntasks": 1, "nnodes": 1, "ranks": "2", "status": 1,
           "exception": None, "counts": {"pending": 0, "running": 0, "succeeded": 3, "failed": 1, "cancelled": 0},
           "est_start": None}


def test_job_json_shape_is_stable() -> None:
    out = fmt.job_json(SUMMARY, now=200.0)
    assert tuple(out) == fmt.JOB_KEYS
    assert out["user"] == "root" and out["result"] == "FAILED" and out["runtime"] == 10.5
    assert out["counts"] == {"pending": 0, "running": 0, "succeeded": 3, "failed": 1, "cancelled": 0}
    json.dumps(out)
    sparse = fmt.job_json({"id": 1, "state": "SCHED"}, now=0.0)
    assert tuple(sparse) == fmt.JOB_KEYS and sparse["runtime"] is None and sparse["counts"]["pending"] == 0


@pytest.mark.parametrize("changes, shown", [
    ({"status": 0}, "COMPLETED"), ({"exception": "cancel", "status": 143}, "CANCELLED"),
    ({"exception": "timeout"}, "TIMEOUT"), ({"state": "RUN"}, "RUN"), ({"state": "SCHED"}, "SCHED"),
])
def test_result_words(changes: dict, shown: str) -> None:
    assert fmt.result({**SUMMARY, **changes}) == shown


def render(table) -> str:
    c = Console(width=300, record=True, color_system=None)
    c.print(table)
    return c.export_text()


def test_jobs_table_shows_arrays_on_one_line_and_estimates() -> None:
    pending = {**SUMMARY, "id": 8, "state": "SCHED", "t_run": None, "t_inactive": None, "status": None,
               "counts": {"pending": 1}, "est_start": 400.0}
    text = render(fmt.jobs_table([SUMMARY, pending], now=100.0))
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "NAME", "USER", "STATE", "NTASKS", "NODES", "RANKS", "TIME", "STATUS", "INFO"]
    assert "3 ok, 1 failed" in lines[1] and "FAILED" in lines[1] and "10.5s" in lines[1]
    assert "starts in ~5m00s" in lines[2] and "SCHED" in lines[2]
    unknown = {**pending, "est_start": None}
    assert render(fmt.jobs_table([unknown], now=100.0)).splitlines()[1].split()[-1] == "-"
    failed = {**SUMMARY, "ntasks": 1, "counts": {"failed": 1}, "reason": "task 0 on rank 1: x: command not found"}
    row = render(fmt.jobs_table([failed], now=100.0)).splitlines()[1]
    assert row.endswith("task 0 on rank 1: x: command not found")


def test_durations() -> None:
    assert [fmt.duration(s) for s in (None, 0.412, 12.34, 303, 7500, 3 * 86400 + 4 * 3600)] == \
        ["-", "0.41s", "12.3s", "5m03s", "2h05m", "3d04h"]


def test_event_lines() -> None:
    event = [3, 105.25, "exception", {"type": "cancel", "severity": 0, "note": "by user"}]
    assert fmt.event_line(event, 100.0) == '+5.250s exception type=cancel severity=0 note="by user"'
    when = 1_700_000_000.25
    stamp = datetime.datetime.fromtimestamp(when).strftime("%Y-%m-%dT%H:%M:%S") + ".250"
    assert fmt.eventlog_line([0, when, "depend", {}]) == f"0 {stamp} depend"
    assert json.loads(fmt.eventlog_json([4, when, "finish", {"status": 0}])) == {
        "seq": 4, "time": when, "name": "finish", "context": {"status": 0}}


def test_resources_and_status_tables() -> None:
    rows = [{"rank": 1, "hostname": "n1", "state": "drained", "reason": "bad dimm", "cores_total": 8,
             "cores_free": 6, "gpus_total": 2, "gpus_free": 2, "memory_mb_total": 1000, "memory_mb_free": 10,
             "properties": {"zone": "a"}}]
    text = render(fmt.resources_table(rows))
    assert "6/2" in text and "2/0" in text and "10/990" in text and "zone=a" in text and "bad dimm" in text
    status = {"name": "mc", "size": 2, "fanout": 32, "epoch": 3, "queue": {"RUN": 2, "SCHED": 0},
              "ranks": [{"rank": 0, "state": "up", "pid": 42, "hostname": "h", "endpoint": "tcp://h:1", "since": 90}]}
    assert fmt.status_lines(status) == ["mc: size 2, fanout 32, epoch 3", "queue: 2 RUN"]
    assert "tcp://h:1" in render(fmt.status_table(status["ranks"], now=100.0))


def test_client_matches_responses_by_id_whatever_their_order(tmp_path) -> None:
    """A scripted broker answers pipelined requests out of order; the Client sorts them out."""
    import socket
    import threading

    from minicluster import Client
    from minicluster.proto.frames import pack, read_blocking

    path = str(tmp_path / "broker.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def broker() -> None:
        conn, _ = listener.accept()
        with conn:
            reqs = [read_blocking(conn) for _ in range(4)]
            assert [r["op"] for r in reqs] == ["submit", "eventlog", "submit", "job"]
            sub1, log, sub2, job = (r["id"] for r in reqs)
            for message in ({"id": log, "ok": True, "events": [[0, 1.0, "submit", {}]], "more": True},
                            {"id": sub2, "ok": True, "job": 8},
                            {"id": job, "ok": False, "error": {"code": "not-found", "message": "job 9 gone"}},
                            {"id": log, "ok": True, "events": [[1, 2.0, "depend", {}]], "more": True},
                            {"id": sub1, "ok": True, "job": 7},
                            # An id nobody asked for, sent before the last event: the client hangs up after
                            # that one, so anything later would race its close (EPIPE here).
                            {"id": 999, "ok": True},
                            {"id": log, "ok": True, "events": [[2, 3.0, "clean", {}]]}):
                conn.sendall(pack({"v": 1, **message}))

    thread = threading.Thread(target=broker)
    thread.start()
    with Client(f"unix://{path}") as client:
        client.submit_async({"argv": ["a"]})
        log = client.request("eventlog", job=7, follow=True)
        client.submit_async({"argv": ["b"]})
        bad = client.request("job", job=9)
        assert client.collect() == [7, 8]
        with pytest.raises(ClientError) as err:
            client.response(bad)
        assert (err.value.code, err.value.message) == ("not-found", "job 9 gone")
        names = []
        while True:
            _rid, msg = client.next_response([log])
            names += [e[2] for e in msg["events"]]
            if not msg.get("more"):
                break
        assert names == ["submit", "depend", "clean"]
        with pytest.raises(ClientError, match=r"invalid|argv"):
            client.submit({"argv": []})
    thread.join(5)
    listener.close()
