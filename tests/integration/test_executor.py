"""TaskExecutor against real processes, spawned on the loop (inline) and by a spawn helper process, and the
TestExecutor mock."""
import asyncio
import hashlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import ClassVar

import pytest

from tests.host import alive  # a zombie counts as dead: nobody may reap reparented processes here
from worker.containment import CgroupTasks, kill_orphans
from worker.executor import TaskExecutor, TaskResult, TaskSpec, TestExecutor

ENV = {"PATH": os.environ.get("PATH", os.defpath)}
PY = sys.executable


class Harness:
    """Collects output and results; fails if output ever follows the exit."""

    helpers = 0  # spawn helpers of the TaskExecutors made (the `spawning` fixture's choice)
    made: ClassVar[list["Harness"]] = []

    def __init__(self, cls=TaskExecutor, **kw):
        if cls is TaskExecutor:
            kw.setdefault("spawn_helpers", self.helpers)
        self.made.append(self)
        self.out: dict[tuple, bytearray] = defaultdict(bytearray)
        self.results: dict[tuple, TaskResult] = {}
        self.waiters: dict[tuple, asyncio.Future] = {}
        self.keys = itertools.count()
        self.ex = cls(self._on_output, self._on_exit, **kw)

    def _on_output(self, key, stream, data):
        assert key not in self.results, f"output for {key} after its exit"
        self.out[key, stream] += data

    def _on_exit(self, result):
        assert result.key not in self.results
        self.results[result.key] = result
        fut = self.waiters.pop(result.key, None)
        if fut is not None:
            fut.set_result(result)

    def start(self, *argv, env=ENV, **kw):
        key = (1, next(self.keys))
        pid = self.ex.start(TaskSpec(key, tuple(argv), env, **kw))
        return key, pid

    async def wait(self, key, timeout=10.0) -> TaskResult:
        if key not in self.results:
            self.waiters[key] = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self.waiters[key], timeout)
        return self.results[key]

    async def run(self, *argv, **kw) -> tuple[TaskResult, bytes, bytes]:
        key, _ = self.start(*argv, **kw)
        r = await self.wait(key)
        return r, bytes(self.out[key, "stdout"]), bytes(self.out[key, "stderr"])

    async def spawned(self, timeout=10.0):
        """Once every running task has its pid (a helper reports it after the spawn)."""
        deadline = time.monotonic() + timeout
        while not all(t.pid for t in self.ex._tasks.values()):
            assert time.monotonic() < deadline, "a spawn helper did not report its spawns"
            await asyncio.sleep(0.01)

    async def wait_output(self, key, stream, needle: bytes, timeout=5.0):
        deadline = time.monotonic() + timeout
        while needle not in self.out[key, stream]:
            assert time.monotonic() < deadline, f"no {needle!r} on {stream}"
            await asyncio.sleep(0.01)


@pytest.fixture(autouse=True, params=["inline", "helpers"])
def spawning(request):
    """Every TaskExecutor test runs twice: spawning on the loop, and in one spawn helper."""
    if request.param == "helpers" and "mock" in request.node.name:
        pytest.skip("the mock executor spawns nothing")
    Harness.helpers = 1 if request.param == "helpers" else 0
    yield request.param
    Harness.helpers = 0
    for h in Harness.made:
        helpers = getattr(h.ex, "_helpers", None)
        for helper in helpers._helpers if helpers is not None else ():  # its executor was not shut down
            helper.channel.close()  # the helper kills its tasks and exits
            os.waitpid(helper.pid, 0)
            os.close(helper.pidfd)
    Harness.made.clear()


async def wait_dead(pid: int, timeout=3.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.smoke
async def test_stdout_stderr_separate_and_exit_code():
    h = Harness()
    r, out, err = await h.run("sh", "-c", "echo out; echo err >&2; exit 7")
    assert (out, err) == (b"out\n", b"err\n")
    assert (r.status, r.exit_code, r.signal, r.error) == (7, 7, None, None)
    assert r.pid and r.started <= r.ended <= time.time()


async def test_task_leads_own_session_with_default_signals():
    h = Harness()
    _, out, _ = await h.run(PY, "-c", "import os; print(os.getsid(0) == os.getpgid(0) == os.getpid())")
    assert out == b"True\n"
    # The worker (Python) ignores SIGPIPE; ignored signals would survive exec.
    # (glibc's posix_spawn leaves its internal signals 32 and 33 ignored.)
    _r, out, _ = await h.run("cat", "/proc/self/status")
    sig_ign = next(int(line.split()[1], 16) for line in out.decode().splitlines()
                   if line.startswith("SigIgn:"))
    assert sig_ign & ((1 << 31) - 1) == 0, hex(sig_ign)


async def test_large_output_intact():
    h = Harness()
    script = ("import sys\n"
              "o = bytes(range(256)) * 12288\n"   # 3 MiB
              "e = b'stderr-line\\n' * 150000\n"  # ~1.7 MiB
              "sys.stdout.buffer.write(o); sys.stderr.buffer.write(e)\n")
    r, out, err = await h.run(PY, "-c", script)
    assert r.status == 0
    assert hashlib.sha256(out).digest() == hashlib.sha256(bytes(range(256)) * 12288).digest()
    assert err == b"stderr-line\n" * 150000


async def test_killed_by_signal_is_128_plus_sig():
    h = Harness()
    r, _, _ = await h.run("sh", "-c", "kill -9 $$")
    assert (r.status, r.exit_code, r.signal) == (137, None, 9)

    key, _ = h.start("sleep", "30")
    h.ex.signal(key, signal.SIGTERM)
    r = await h.wait(key)
    assert (r.status, r.signal) == (143, 15)


async def test_command_not_found_uses_the_tasks_path():
    h = Harness()
    key, pid = h.start("hostnamex")
    assert pid is None
    r = await h.wait(key)
    assert (r.status, r.error, r.pid) == (127, "hostnamex: command not found", None)
    # `true` exists on the worker's PATH but not on the task's
    r, _, _ = await h.run("true", env={"PATH": "/nonexistent"})
    assert r.status == 127


async def test_permission_denied_is_126(tmp_path):
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    h = Harness()
    r, _, _ = await h.run(str(script))
    assert (r.status, r.error) == (126, f"{script}: permission denied")
    r, _, _ = await h.run("script", env={"PATH": str(tmp_path)})
    assert (r.status, r.error) == (126, "script: permission denied")
    script.chmod(0o755)
    r, out, _ = await h.run("script", env={"PATH": str(tmp_path)})
    assert (r.status, out) == (0, b"hi\n")


async def test_cwd_applied_and_bad_cwd_reported(tmp_path):
    h = Harness()
    before = os.getcwd()
    r, out, _ = await h.run("pwd", cwd=str(tmp_path))
    assert (r.status, out) == (0, f"{tmp_path}\n".encode())
    assert os.getcwd() == before
    r, _, _ = await h.run("./rel.sh", cwd=str(tmp_path))  # relative to the task's cwd
    assert r.error == "./rel.sh: command not found"
    r, _, _ = await h.run("true", cwd="/x/nonexistent")
    assert (r.status, r.error) == (126, "cwd /x/nonexistent: no such directory")


async def test_env_passed_exactly_and_gpus():
    h = Harness()
    env = {"PATH": ENV["PATH"], "FOO": "bar baz", "EMPTY": ""}
    r, out, _ = await h.run("env", env=env)
    assert r.status == 0
    # A task without GPUs sees none (worker/jobenv.py), whatever the submitter's environment said.
    no_gpus = {"CUDA_VISIBLE_DEVICES": "-1", "ROCR_VISIBLE_DEVICES": "-1", "HIP_VISIBLE_DEVICES": "-1"}
    assert sorted(out.decode().splitlines()) == sorted(f"{k}={v}" for k, v in {**env, **no_gpus}.items())
    r, out, _ = await h.run("env", env={**env, "CUDA_VISIBLE_DEVICES": "5"}, gpus=(0, 2))
    assert "CUDA_VISIBLE_DEVICES=0,2" in out.decode().splitlines()
    assert "CUDA_VISIBLE_DEVICES" not in env  # the spec's dict is not modified


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1")
async def test_affinity_applied_and_worker_affinity_restored():
    h = Harness()
    before = os.sched_getaffinity(0)
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    r, out, _ = await h.run(PY, "-c", show, cores=(1,))
    assert (r.status, out) == (0, b"[1]\n")
    assert os.sched_getaffinity(0) == before
    r, out, _ = await h.run(PY, "-c", show)
    assert out == f"{sorted(before)}\n".encode()
    r, _, _ = await h.run("true", cores=(1, 99))
    assert r.status == 126 and "[99]" in r.error
    assert os.sched_getaffinity(0) == before


async def test_terminate_escalates_to_sigkill_after_grace():
    h = Harness()
    # os.write: a print() in the handler could re-enter the 'ready' print.
    script = ("import os, signal, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: os.write(1, b'got TERM\\n'))\n"
              "print('ready', flush=True)\n"
              "while True: time.sleep(1)\n")
    key, _ = h.start(PY, "-c", script)
    await h.wait_output(key, "stdout", b"ready")
    t0 = time.monotonic()
    h.ex.terminate(key, 0.4)
    r = await h.wait(key)
    assert (r.status, r.signal) == (137, 9)
    assert 0.4 <= time.monotonic() - t0 < 3
    assert b"got TERM" in h.out[key, "stdout"]


async def test_signal_reaches_grandchild_through_process_group():
    h = Harness()
    script = ("import signal, subprocess\n"
              "signal.signal(signal.SIGUSR1, lambda *a: None)\n"
              "p = subprocess.Popen(['sleep', '30'])\n"
              "print('ready', flush=True)\n"
              "print('child', p.wait(), flush=True)\n")
    key, _ = h.start(PY, "-c", script)
    await h.wait_output(key, "stdout", b"ready")
    h.ex.signal(key, signal.SIGUSR1)  # only the group signal can reach `sleep`
    r = await h.wait(key)
    assert r.status == 0
    assert bytes(h.out[key, "stdout"]).endswith(f"child -{signal.SIGUSR1}\n".encode())


async def test_background_grandchild_holding_pipe_does_not_hang():
    h = Harness()
    t0 = time.monotonic()
    r, out, _ = await h.run("sh", "-c", "sleep 30 & echo $!")
    assert r.status == 0 and time.monotonic() - t0 < 3
    assert await wait_dead(int(out)), "leftover group member survived the task"


async def test_output_files_appended(tmp_path):
    out_file, err_file = tmp_path / "out", tmp_path / "err"
    out_file.write_text("old\n")
    h = Harness()
    r, out, err = await h.run("sh", "-c", "echo new; echo oops >&2",
                              stdout_path=str(out_file), stderr_path=str(err_file))
    assert (r.status, out, err) == (0, b"", b"")
    assert out_file.read_text() == "old\nnew\n"
    assert err_file.read_text() == "oops\n"
    r, _, _ = await h.run("true", stdout_path=str(tmp_path / "no" / "such"))
    assert r.status == 126 and r.error.startswith("stdout ")
    # One file for both streams (--output) is opened once and shared, as with 2>&1: both land, in order.
    both = tmp_path / "both"
    r, out, err = await h.run("sh", "-c", "echo one; echo two >&2; echo three",
                              stdout_path=str(both), stderr_path=str(both))
    assert (r.status, out, err) == (0, b"", b"") and both.read_text() == "one\ntwo\nthree\n"


async def test_cgroup_tree_is_reused_and_left_empty_even_after_spawns_that_failed(tmp_path):
    tree = CgroupTasks.detect(str(tmp_path), 0)
    if tree is None:
        pytest.skip("no writable cgroup v2 tree here")
    h = Harness(containment=tree)
    try:
        # A NUL byte in the environment fails posix_spawn itself, inside the task's group.
        r, _, _ = await h.run("true", env={**ENV, "BAD": "a\0b"})
        assert r.status == 126 and r.pid is None
        for _ in range(3):
            r, _, _ = await h.run("true")
            assert r.status == 0
        # Groups serve one task after another: not one per task.
        assert len([e for e in os.scandir(tree.base) if e.is_dir()]) == 1
    finally:
        await h.ex.shutdown(0)
    assert not tree.base.exists()  # nothing was left in it


async def test_pass_fds_inherited_at_same_number_only():
    passed_r, passed_w = os.pipe()
    other_r, other_w = os.pipe()
    try:
        script = ("import os, sys\n"
                  "os.write(int(sys.argv[1]), b'via fd')\n"
                  "try: os.fstat(int(sys.argv[2])); print('leaked')\n"
                  "except OSError: print('closed')\n")
        h = Harness()
        r, out, _ = await h.run(PY, "-c", script, str(passed_w), str(other_w),
                                pass_fds=(passed_w,))
        assert (r.status, out) == (0, b"closed\n")
        assert os.read(passed_r, 100) == b"via fd"
        assert os.get_inheritable(passed_w) is False  # the worker's fd was not touched
    finally:
        for fd in (passed_r, passed_w, other_r, other_w):
            os.close(fd)


async def test_200_concurrent_tasks():
    h = Harness()
    keys = [h.start("/bin/true")[0] for _ in range(200)]
    assert h.ex.running == 200
    results = await asyncio.gather(*(h.wait(k, timeout=20) for k in keys))
    assert [r.status for r in results] == [0] * 200
    assert h.ex.running == 0


async def test_duplicate_key_is_a_programming_error():
    h = Harness()
    h.ex.start(TaskSpec((9, 9), ("sleep", "5"), ENV))
    with pytest.raises(ValueError):
        h.ex.start(TaskSpec((9, 9), ("true",), ENV))
    await h.ex.shutdown(0.5)
    assert h.results[9, 9].status == 143


async def test_shutdown_waits_for_everything():
    h = Harness()
    keys = [h.start("sleep", "30")[0] for _ in range(5)]
    await h.ex.shutdown(1.0)
    assert h.ex.running == 0
    assert {h.results[k].status for k in keys} == {143}


async def test_kill_orphans_kills_recorded_groups_and_skips_reused_pids(tmp_path):
    pidfile = tmp_path / "tasks-rank0.pids"
    h = Harness(pidfile=str(pidfile))
    keys = [h.start("sleep", "30")[0] for _ in range(2)]
    await h.spawned()
    lines = pidfile.read_text().splitlines()
    assert len(lines) == 2
    # A live process whose pid was "reused": recorded start time differs.
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with open(pidfile, "a") as f:
            f.write(f"{stranger.pid} {stranger.pid} 1\n")
            f.write(f"{(1 << 22) + 7} {(1 << 22) + 7} 12345\n")  # long gone
        assert kill_orphans(str(pidfile)) == 2
        assert not pidfile.exists()
        assert kill_orphans(str(pidfile)) == 0
        assert stranger.poll() is None
        for k in keys:
            assert (await h.wait(k)).status == 137
    finally:
        stranger.kill()
        stranger.wait()
    await h.ex.shutdown(0)
    assert pidfile.read_text() == ""  # rewritten with what still runs: nothing


# -- TestExecutor ----------------------------------------------------------

def mock_env(**kw):
    return {f"MC_TEST_{k.upper()}": str(v) for k, v in kw.items()}


async def test_mock_zero_duration_completes_next_iteration():
    h = Harness(TestExecutor)
    key, pid = h.start("anything", env=mock_env(exit_code=3))
    assert pid is not None and h.ex.running == 1 and key not in h.results
    await asyncio.sleep(0)
    r = h.results[key]
    assert (r.status, r.exit_code, r.signal, r.pid) == (3, 3, None, pid)
    assert h.ex.running == 0


async def test_mock_duration_and_termination():
    h = Harness(TestExecutor)
    t0 = time.monotonic()
    r, _, _ = await h.run("x", env=mock_env(run_duration=0.2))
    assert 0.2 <= time.monotonic() - t0 < 1 and r.status == 0
    a, _ = h.start("x", env=mock_env(run_duration=30))
    b, _ = h.start("x", env=mock_env(run_duration=30))
    c, _ = h.start("x", env=mock_env(run_duration=30))
    h.ex.terminate(a, 5)
    h.ex.signal(b, signal.SIGKILL)
    h.ex.signal(c, signal.SIGCHLD)  # default action: ignore
    assert (await h.wait(a, 1)).status == 143
    assert (await h.wait(b, 1)).signal == 9
    await asyncio.sleep(0.05)
    assert c not in h.results
    await h.ex.shutdown(1)
    assert h.results[c].status == 143 and h.ex.running == 0


async def test_mock_bad_env_is_an_error_result():
    h = Harness(TestExecutor)
    r, _, _ = await h.run("x", env=mock_env(exit_code="seven"))
    assert r.status == 126 and "mock task" in r.error


async def test_mock_executor_completes_a_large_batch_in_one_iteration():
    # Its rate is measured in benchmarks/throughput.py; here only that every task ends, once.
    done = []
    ex = TestExecutor(lambda *a: None, done.append)
    env = mock_env(exit_code=0)
    specs = [TaskSpec((2, i), ("x",), env) for i in range(50_000)]
    for spec in specs:
        ex.start(spec)
    await asyncio.sleep(0)
    assert sorted(r.key for r in done) == [s.key for s in specs] and ex.running == 0


async def test_pidfile_is_compacted_as_tasks_come_and_go(tmp_path):
    pidfile = tmp_path / "tasks-rank0.pids"
    h = Harness(pidfile=str(pidfile))
    for _ in range(3):
        keys = [h.start("true")[0] for _ in range(200)]
        for k in keys:
            await h.wait(k)
    sleeper = h.start("sleep", "30")[0]
    await h.spawned()
    lines = pidfile.read_text().splitlines()
    assert len(lines) <= 2 * 1 + 256 + 1
    assert lines[-1].split()[0] == str(h.ex._tasks[sleeper].pid)
    await h.ex.shutdown(0)
