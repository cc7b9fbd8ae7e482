"""No process outlives its task (issue 10 item 6): children that leave the task's process group (setsid) end
with the task, whether it ends by itself or is cancelled; rank 0's tasks do not outlive a kill -9 of the broker
(the restarted broker kills them, like a worker's previous run, so their cores are not handed out twice).

Where this process may write a cgroup v2 tree the ranks use it; elsewhere a child subreaper, tested on its own
below in a process of its own (a subreaper adopts every orphan of the process that becomes one)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for

# The task forks a child that calls setsid and forks again: the grandchild, in a session of its own, writes its
# pid next to the task's own and sleeps; the task then sleeps ARGV[2] seconds.
ESCAPE = textwrap.dedent("""
    import os, sys, time
    out = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(out + ".tmp", "w") as f:
                f.write(f"{os.getpid()} {os.getsid(0)}")
            os.rename(out + ".tmp", out)
            time.sleep(300)
        os._exit(0)
    while not os.path.exists(out):
        time.sleep(0.01)
    with open(out + ".task", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(float(sys.argv[2]))
""")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return not stat[stat.rindex(b")") + 2:].startswith(b"Z")


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def escaping_task(tmp_path: Path, name: str, seconds: float) -> tuple[dict, Path]:
    out = tmp_path / name
    return job([sys.executable, "-c", ESCAPE, str(out), str(seconds)], ntasks=1), out


def escaped_pid(out: Path) -> int:
    """The escapee's pid, once it and its task wrote theirs."""
    task = Path(f"{out}.task")
    deadline = time.monotonic() + 20
    while not task.exists():
        assert time.monotonic() < deadline, "the task never forked its escapee"
        time.sleep(0.05)
    pid, sid = (int(x) for x in out.read_text().split())
    assert os.getpgid(pid) == sid != int(task.read_text()), "the escapee left its task's session and group"
    return pid


@pytest.mark.parametrize("helpers", [0, 1])
def test_an_escaped_child_ends_with_its_task_and_with_a_cancel(tmp_path: Path, helpers: int) -> None:
    with LocalCluster(tmp_path / "mc", size=2, spawn_helpers=helpers) as cluster, cluster.client() as c:
        spec, out = escaping_task(tmp_path, "ends", 0.2)
        ends = c.submit(spec)
        pid = escaped_pid(out)
        assert wait_for(c, ends)["status"] == 0
        assert gone(pid), "a setsid child outlived its task's normal end"

        spec, out = escaping_task(tmp_path, "cancelled", 300)
        cancelled = c.submit(spec)
        pid = escaped_pid(out)
        c.cancel([cancelled])
        assert wait_for(c, cancelled)["exception"] == "cancel"
        assert gone(pid), "a setsid child outlived its cancelled task"


@pytest.mark.slow
@pytest.mark.parametrize("helpers", [0, 1])
def test_rank_0_tasks_do_not_survive_a_broker_kill(tmp_path: Path, helpers: int) -> None:
    cluster = LocalCluster(tmp_path / "mc", size=1, resources="cores=1", spawn_helpers=helpers)
    try:
        cluster.start()
        with cluster.client() as c:
            spec, out = escaping_task(tmp_path, "rank0", 300)
            held = c.submit(spec)
            started(c, held)
            escapee = escaped_pid(out)
            task = int(Path(f"{out}.task").read_text())
        cluster.kill(0)
        # A spawn helper kills its tasks' process groups when its agent goes (docs/architecture.md, "Spawn
        # helpers"); what left the group waits for the rank's next run, as without helpers.
        assert (gone(task) if helpers else alive(task)) and alive(escapee)
        cluster.restart(0)
        assert gone(task, timeout=1) and gone(escapee, timeout=1), "the restarted broker left rank 0's tasks running"
        with cluster.client() as c:
            assert wait_for(c, held)["exception"] == "broker-restart"
            # The only core is free again, and only once: a new job runs on it alone.
            assert wait_for(c, c.submit(job(["true"], ntasks=1)))["status"] == 0
    finally:
        cluster.stop()


SUBREAPER = textwrap.dedent("""
    import asyncio, os, sys
    from worker.containment import Subreaper
    from worker.executor import TaskExecutor, TaskSpec

    async def main():
        ended = []
        both = asyncio.get_running_loop().create_future()
        def result(r):
            ended.append(r)
            if len(ended) == 2:
                both.set_result(None)
        ex = TaskExecutor(lambda *a: None, result, containment=Subreaper(), spawn_helpers=int(sys.argv[3]))
        env = {"PATH": "/usr/bin:/bin", "MC_JOB_ID": "7", "MC_TASK_RANK": "0"}
        ex.start(TaskSpec((7, 0), (sys.executable, "-c", sys.argv[1], sys.argv[2], "0.2"), env))
        # A child left in the task's own group: killed with it at its end, an orphan of ours by then.
        env = {**env, "MC_TASK_RANK": "1"}
        ex.start(TaskSpec((7, 1), ("sh", "-c", "sleep 30 & sleep 0.3; exit 0"), env))
        await both
        await asyncio.sleep(2.5)  # sweeps run at a task's end, and once a second
        zombies = 0
        for tid in os.listdir("/proc/self/task"):
            for pid in open(f"/proc/self/task/{tid}/children").read().split():
                stat = open(f"/proc/{pid}/stat").read()
                zombies += stat.rpartition(")")[2].split()[0] == "Z"
        print("ended", zombies)

    asyncio.run(main())
""")


@pytest.mark.parametrize("helpers", [0, 1])
def test_a_subreaper_kills_what_escaped_an_ended_task(tmp_path: Path, helpers: int) -> None:
    out = tmp_path / "escapee"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    done = subprocess.run([sys.executable, "-c", SUBREAPER, ESCAPE, str(out), str(helpers)], env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.stdout.strip() == "ended 0", f"left zombies or failed: {done.stdout} {done.stderr}"
    pid = int(out.read_text().split()[0])
    assert gone(pid, timeout=2), "an escapee of an ended task outlived the worker's sweep"
