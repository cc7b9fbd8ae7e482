"""What users see, end to end through `mc start` and the real tools: whole lines and labels, stdin, output at
the cap, why a task could not run, honest exit statuses and the job environment."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minicluster import Client, ClientError
from tests.integration.conftest import until
from tests.integration.test_cli import instance, job_json, mc  # noqa: F401  (module fixture)

# Each of 4 tasks writes 15 lines one byte per write(2), pausing now and then: forwarded as written, the
# bytes of different tasks would interleave inside lines.
UNBUFFERED = r"""
import os, time
rank = os.environ["MC_TASK_RANK"]
for i in range(15):
    for n, ch in enumerate(f"task {rank} line {i:02d} " + "x" * 20 + "\n"):
        os.write(1, ch.encode())
        if n % 8 == 0:
            time.sleep(0.002)
"""
LINE = re.compile(r"task (\d) line (\d\d) x{20}")


def last_job() -> int:
    return int(json.loads(mc("jobs", "-a", "--json", "-L", "1").stdout)["jobs"][0]["id"])


def run_unbuffered(*options: str) -> list[str]:
    out = mc("run", "-N", "2", "-n", "4", "--mpi", "none", *options, sys.executable, "-c", UNBUFFERED, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_lines_of_unbuffered_tasks_stay_whole() -> None:
    lines = run_unbuffered()
    assert len(lines) == 60 and all(LINE.fullmatch(line) for line in lines), lines
    per_task = {t: [line for line in lines if line.startswith(f"task {t} ")] for t in range(4)}
    assert all(len(v) == 15 and v == sorted(v) for v in per_task.values())


def test_label_puts_the_task_rank_before_each_line() -> None:
    lines = run_unbuffered("--label")
    assert len(lines) == 60
    for line in lines:
        label, _, rest = line.partition(": ")
        match = LINE.fullmatch(rest)
        assert match and match.group(1) == label, line
    for tool in ("logs", "attach"):
        again = mc(tool, "-l", str(last_job()))
        assert sorted(again.stdout.splitlines()) == sorted(lines), tool


def test_array_labels_are_indices() -> None:
    out = mc("run", "--cc", "7,9", "-l", "sh", "-c", "echo hi {cc}")
    assert out.returncode == 0 and sorted(out.stdout.splitlines()) == ["7: hi 7", "9: hi 9"]


def test_stdin_goes_to_task_0_by_default_and_to_all_by_option() -> None:
    assert mc("run", "cat", input="hello\n").stdout == "hello\n"
    two = mc("run", "-n", "2", "--mpi", "none", "sh", "-c", 'cat; echo "$MC_TASK_RANK done"', input="in\n")
    assert sorted(two.stdout.splitlines()) == ["0 done", "1 done", "in"]
    both = mc("run", "-n", "2", "-i", "all", "-l", "--mpi", "none", "cat", input="a\nb\n")
    assert sorted(both.stdout.splitlines()) == ["0: a", "0: b", "1: a", "1: b"]
    assert mc("run", "-i", "none", "cat", input="ignored\n").stdout == ""


@pytest.mark.long
def test_stdin_streams_more_than_a_frame_with_flow_control() -> None:
    data = "".join(f"{i:07d}\n" for i in range(400_000))  # 3.2 MB
    out = mc("run", "sh", "-c", "wc -l; wc -c < /dev/null", input=data, timeout=60)
    assert out.returncode == 0 and out.stdout.split()[:2] == ["400000", "0"]


def test_output_at_the_cap_reads_back_cut_at_a_line_end() -> None:
    # 20 MiB of 100-byte lines against the default 16 MiB output_cap.
    code = ("import sys\nline = b'y' * 99 + b'\\n'\n"
            "for _ in range(20 * 1024 * 1024 // 100): sys.stdout.buffer.write(line)")
    run = mc("run", sys.executable, "-c", code, timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
    assert "output truncated at 16777216 bytes" in run.stderr
    for tool in ("logs", "attach"):
        again = subprocess.run(["mc", tool, str(last_job())], capture_output=True, timeout=120)
        assert again.returncode == 0, again.stderr[-500:]
        assert len(again.stdout) == 16777216 // 100 * 100 and again.stdout.endswith(b"y\n"), tool
        assert set(again.stdout.splitlines()) == {b"y" * 99}
        assert b"output truncated at 16777216 bytes (output_cap)" in again.stderr


def test_a_task_that_cannot_start_says_why_everywhere() -> None:
    out = mc("run", "nonexistent-cmd-xyz")
    assert out.returncode == 127
    assert re.search(r"^mc run: job (\d+): task 0 on rank \d: nonexistent-cmd-xyz: command not found "
                     r"\(status 127\)$", out.stderr, re.M), out.stderr
    job = re.search(r"job (\d+)", out.stderr).group(1)  # type: ignore[union-attr]
    assert "nonexistent-cmd-xyz: command not found" in mc("jobs", job).stdout.splitlines()[1]
    assert job_json(int(job))["reason"] == "task 0 on rank 0: nonexistent-cmd-xyz: command not found"
    assert "nonexistent-cmd-xyz: command not found (status 127)" in mc("logs", job).stderr
    cwd = mc("run", "--cwd", "/nonexistent", "true")
    assert cwd.returncode == 126 and "cwd /nonexistent: no such directory (status 126)" in cwd.stderr
    for mode in ("--wait", "--watch"):
        submitted = mc("submit", mode, "nonexistent-cmd-xyz")
        assert submitted.returncode == 127
        assert "nonexistent-cmd-xyz: command not found (status 127)" in submitted.stderr, mode


def test_logs_of_a_job_with_an_output_file_say_where_it_went(tmp_path: Path) -> None:
    out = mc("submit", "--wait", "--output", f"{tmp_path}/out-{{id}}.txt", "echo", "to a file")
    assert out.returncode == 0, out.stderr
    job = int(out.stdout)
    logs = mc("logs", str(job))
    assert logs.stdout == ""
    assert logs.stderr == f"mc logs: job {job}: output went to {tmp_path}/out-{job}.txt on the nodes that ran it " \
                          "(--output), not to mc\n"
    assert (tmp_path / f"out-{job}.txt").read_text() == "to a file\n"


def test_a_cancelled_array_ends_non_zero_even_if_its_tasks_exit_0(tmp_path: Path) -> None:
    script = f'trap "exit 0" TERM; touch {tmp_path}/$MC_TASK_INDEX; sleep 30 & wait'
    waiter = subprocess.Popen(["mc-submit", "--wait", "--cc", "1-4", "sh", "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    job = int(waiter.stdout.readline())  # type: ignore[union-attr]
    until(lambda: len(list(tmp_path.iterdir())) == 4, "every task set its trap")
    assert mc("cancel", str(job)).returncode == 0
    _out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 143
    assert f"mc-submit: job {job}: ended by cancel: cancelled by uid {os.getuid()}" in err
    assert job_json(job)["status"] == 143 and job_json(job)["result"] == "CANCELLED"
    again = mc("cancel", str(job))
    assert again.returncode == 1 and again.stderr == f"mc cancel: error: job {job} has already ended\n"


def test_run_of_an_array_ctrl_c_exits_143() -> None:
    proc = subprocess.Popen(["mc", "run", "--cc", "1-2", "sleep", "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 15
    with Client() as client:
        while not [j for j in client.jobs() if j["name"] == "sleep" and j["counts"]["running"] == 2]:
            assert time.time() < deadline
            time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 143 and "cancelling job" in err


def test_job_environment() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "7", "DROP_ME": "1"}
    script = 'echo "idx=${MC_TASK_INDEX-unset} cuda=$CUDA_VISIBLE_DEVICES drop=${DROP_ME-unset}"'
    plain = subprocess.run(["mc", "run", "--env", "-DROP_ME", "sh", "-c", script], capture_output=True, text=True,
                           timeout=30, env=env)
    assert plain.stdout == "idx=unset cuda=-1 drop=unset\n", plain.stderr
    array = subprocess.run(["mc", "run", "--cc", "4", "sh", "-c", script], capture_output=True, text=True,
                           timeout=30, env=env)
    assert array.stdout == "idx=4 cuda=-1 drop=1\n", array.stderr


def test_eventlog_times_are_human_and_json_raw() -> None:
    job = int(mc("submit", "--wait", "true").stdout)
    lines = mc("eventlog", str(job)).stdout.splitlines()
    assert all(re.fullmatch(r"\d+ \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} \w[\w-]*( .*)?", line) for line in lines)
    events = [json.loads(line) for line in mc("eventlog", "--json", str(job)).stdout.splitlines()]
    assert [e["name"] for e in events] == [line.split()[2] for line in lines]
    assert all(isinstance(e["time"], float) and e["time"] > 1e9 for e in events)


def test_control_characters_are_refused_in_names_and_shown_escaped_everywhere(tmp_path: Path) -> None:
    """A guest's name or command full of terminal escapes reaches others' `mc jobs` and `mc top` as text
    (`\\033`), never as escapes; a name may not hold them at all (NUL included); `--json` keeps the exact value."""
    wipe = "\033]0;x\007\033[2J"
    refused = mc("submit", "--name", wipe, "true")
    assert refused.returncode == 2 and refused.stderr.startswith("mc-submit: error: name: "), refused.stderr
    assert "control character \\033" in refused.stderr and "\033" not in refused.stderr
    with Client() as client:
        for name in ("a\0b", "tab\there", wipe, "bell\x7f"):
            with pytest.raises(ClientError) as bad:
                client.submit({"argv": ["true"], "name": name}, check=False)  # the broker checks, not only mc
            assert bad.value.code == "invalid-jobspec" and "control character" in str(bad.value)
        # A command's own name may hold anything: the job is named after it, and everyone sees it escaped.
        command = f"/nonexistent/{wipe}wipe"
        held = client.submit({"argv": [command], "hold": True}, check=False)
        markup = client.submit({"argv": ["true"], "name": "[bold]x[/bold]", "hold": True})
        failed = mc("run", command)
        assert failed.returncode != 0 and "wipe" in failed.stderr and "\033" not in failed.stderr, failed.stderr
        try:
            assert job_json(held)["name"] == f"{wipe}wipe"  # --json: the exact value
            listing = mc("jobs", "-a")
            assert listing.returncode == 0 and "\033" not in listing.stdout + listing.stderr
            rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
            assert "\\033]0;x\\007\\033[2Jwipe" in rows[str(held)] and "[bold]x[/bold]" in rows[str(markup)]
            assert "\\033[2Jwipe: command not found" in rows[str(last_job())]  # the reason quotes the command
            top = subprocess.run(["mc", "top", "-n", "1"], capture_output=True, text=True, timeout=30,
                                 env={**os.environ, "COLUMNS": "200"})
            assert top.returncode == 0 and "\\033[2Jwipe" in top.stdout and "\033" not in top.stdout, top.stdout
            # mc update: a name with escapes is refused like at submit, and so is an empty one
            for value, code in ((wipe, 1), ("", 2)):
                update = mc("update", str(held), f"name={value}")
                assert update.returncode == code and "\033" not in update.stderr, update.stderr
                assert ("control character \\033" if value else "name cannot be empty") in update.stderr
            with pytest.raises(ClientError) as empty:
                client.update(held, name="")
            assert empty.value.code == "invalid-jobspec" and "cannot be empty" in str(empty.value)
            assert job_json(held)["name"] == f"{wipe}wipe"
        finally:
            client.cancel([held, markup])
