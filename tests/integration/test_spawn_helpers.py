"""Spawn helper processes (docs/architecture.md, "Spawn helpers"): tasks are the helpers' children and start in
their cgroup; a signal sent before the spawn is reported reaches the task; a helper killed with kill -9 loses only
its own tasks, each reported once with the reason, nothing of them left running, and a new helper takes over.
The executor's and the task start failures' tests also run with a helper (test_executor.py,
test_task_start_failures.py)."""
from __future__ import annotations

import array
import os
import signal
import time
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster, until_true
from tests.integration.conftest import job, wait_for
from tests.integration.test_executor import ENV, PY, Harness, wait_dead
from tests.integration.test_window import each_once, progressed
from worker.containment import CgroupTasks
from worker.helpers import RESTART_DELAY
from worker.memlimit import MemoryLimits
from worker.spawn import Order
from worker.spawnhelper import Request, _above_targets

# Every task of this module carries this variable, so a leftover is recognised by its environment.
MARK = f"MC_SPAWNHELP_TEST={os.getpid()}"
MARKED = {**ENV, MARK.split("=")[0]: MARK.split("=")[1]}


def leftovers() -> list[int]:
    """Live processes of this module's tasks (zombies count as gone)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if MARK.encode() in environ and state not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def no_leftovers(timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while leftovers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def helpers_of(pid: int) -> list[int]:
    """The spawn helpers among a process's children."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"worker.spawnhelper" in Path(f"/proc/{c}/cmdline").read_bytes()]


@pytest.fixture
def tree(tmp_path: Path):
    tree = CgroupTasks.detect(str(tmp_path), 0)
    if tree is None:
        pytest.skip("no writable cgroup v2 tree here")
    return tree


async def test_a_task_is_a_helpers_child_in_its_cgroup_from_its_first_instruction(tree: CgroupTasks) -> None:
    h = Harness(containment=tree, spawn_helpers=2)
    try:
        key, _ = h.start("sh", "-c", "echo $PPID; cat /proc/self/cgroup")
        # Signals for the worker's process group are the agent's business: the helpers stay, also when one comes
        # while they are still starting (here: right after the first task made the agent spawn them).
        helpers = h.ex._helpers.pids
        for helper in helpers:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                os.kill(helper, sig)
        r = await h.wait(key)
        assert r.status == 0
        parent, *groups = h.out[key, "stdout"].decode().split()
        assert int(parent) in h.ex._helpers.pids, "the task's parent is a spawn helper"
        # `sh` ran in its task's group under the rank's tree, so `cat`, its child, did too.
        assert f"0::/{tree.base.relative_to(tree.own)}/t" in "".join(groups).replace(str(tree.own), "")
        for helper in h.ex._helpers.pids:  # and the helpers are back in the worker's own group
            assert Path(f"/proc/{helper}/cgroup").read_text() == Path("/proc/self/cgroup").read_text()
        for helper in helpers:  # and once they run
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                os.kill(helper, sig)
        r, out, _ = await h.run("sh", "-c", "echo $PPID")
        assert r.status == 0 and int(out) in helpers and h.ex._helpers.pids == helpers
    finally:
        await h.ex.shutdown(0)


@pytest.mark.skipif(MemoryLimits.detect() is None, reason="no writable cgroup v1 memory controller here")
async def test_a_helpers_task_starts_in_its_memory_group() -> None:
    limits = MemoryLimits.detect()
    assert limits is not None
    group = limits.create(99, 0, 64)
    h = Harness(spawn_helpers=1)
    try:
        r, out, _ = await h.run("cat", "/proc/self/cgroup", memory_group=group)
        assert r.status == 0
        [line] = [x for x in out.decode().splitlines() if ":memory:" in x]
        assert line.endswith(f"/{group.path.name}"), "the task started in its memory group"
        [helper] = h.ex._helpers.pids
        assert f"/{group.path.name}" not in Path(f"/proc/{helper}/cgroup").read_text(), "the helper went back"
    finally:
        await h.ex.shutdown(0)
        group.remove()


async def test_an_order_too_large_for_a_helpers_channel_is_spawned_on_the_loop_and_runs() -> None:
    """A host's wmem_max may cap a channel packet near 208 KiB, below what execve takes: a 1 MiB environment
    must run with helpers as it does without them."""
    h = Harness(spawn_helpers=1)
    big = {**MARKED, **{f"BIG{i}": "x" * 100_000 for i in range(10)}}
    try:
        small, _ = h.start("sh", "-c", "echo $PPID", env=MARKED)
        large, _ = h.start("sh", "-c", 'echo $PPID ${#BIG9}', env=big)
        for key in (small, large):
            assert (await h.wait(key)).status == 0
        assert int(h.out[small, "stdout"].split()[0]) in h.ex._helpers.pids
        assert h.out[large, "stdout"].split() == [str(os.getpid()).encode(), b"100000"], "spawned by the agent itself"
    finally:
        await h.ex.shutdown(0)


async def test_a_kill_before_the_spawn_is_reported_reaches_the_task() -> None:
    h = Harness(spawn_helpers=1)
    killed, _ = h.start("sleep", "30", env=MARKED)
    h.ex.signal(killed, signal.SIGKILL)  # before the helper even got the request
    terminated, _ = h.start("sleep", "30", env=MARKED)
    h.ex.terminate(terminated, 0.2)
    unstarted, _ = h.start("no-such-command-here", env=MARKED)
    h.ex.terminate(unstarted, 0)
    assert (await h.wait(killed)).signal == signal.SIGKILL
    assert (await h.wait(terminated)).signal == signal.SIGTERM
    assert (await h.wait(unstarted)).status == 127
    assert no_leftovers()
    await h.ex.shutdown(0)


async def test_a_helper_killed_with_kill_9_loses_its_tasks_once_and_leaves_nothing(tree: CgroupTasks) -> None:
    """Its tasks end once, with the reason, and are killed; what it was not yet sent goes to the new helper."""
    h = Harness(containment=tree, spawn_helpers=1)
    try:
        running = [h.start("sleep", "30", env=MARKED)[0] for _ in range(10)]
        await h.spawned()
        [helper] = h.ex._helpers.pids
        queued = [h.start("sh", "-c", "echo $PPID", env=MARKED)[0] for _ in range(5)]  # not sent: the loop goes on
        os.kill(helper, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{helper}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
            assert time.monotonic() < deadline  # dead before the loop sends it anything: its channel is closed
            time.sleep(0.01)  # noqa: ASYNC251 (the loop must not run meanwhile)
        for key in running:
            r = await h.wait(key)
            assert (r.status, r.error) == (255, f"spawn helper (pid {helper}) killed by signal 9: exit status lost")
        assert no_leftovers(), "a task of the dead helper still runs"
        [new] = h.ex._helpers.pids
        assert new != helper
        for key in queued:
            r = await h.wait(key)
            assert r.status == 0 and int(h.out[key, "stdout"]) == new, "the new helper spawns what was not sent"
        r, out, _ = await h.run("sh", "-c", "echo $PPID")
        assert r.status == 0 and int(out) == new, "the new helper spawns"
    finally:
        await h.ex.shutdown(0)
    assert await wait_dead(helper)


async def test_a_helper_that_dies_before_it_ever_reported_is_replaced_a_second_later() -> None:
    """As a helper that cannot start at all would: not restarted in a busy loop, and no spawn waits for it."""
    h = Harness(spawn_helpers=1)
    try:
        first, _ = h.start("true")
        [helper] = h.ex._helpers.pids
        os.kill(helper, signal.SIGKILL)
        assert "spawn helper" in (await h.wait(first)).error
        assert h.ex._helpers.pids == []
        r, _, _ = await h.run("true")
        assert (r.status, r.error) == (126, "no spawn helper runs: they die as they start")
        await until_true(lambda: h.ex._helpers.pids, "a helper started again", timeout=RESTART_DELAY + 10)
        r, _, _ = await h.run("true")
        assert r.status == 0
    finally:
        await h.ex.shutdown(0)


async def test_stdin_and_passed_fds_reach_a_helpers_task_at_their_numbers() -> None:
    h = Harness(spawn_helpers=1)
    stdin_r, stdin_w = os.pipe()
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    try:
        os.write(stdin_w, b"from stdin\n")
        os.close(stdin_w)
        os.write(a_w, b"A")
        os.write(b_w, b"B")
        # The task sees pipe a's read end at b's number and b's at a's: the helper's dup2s must not clobber.
        script = f"import os, sys; print(sys.stdin.read().strip(), os.read({b_r}, 1), os.read({a_r}, 1))"
        first = os.dup(a_r)
        second = os.dup(b_r)
        os.dup2(first, b_r)
        os.dup2(second, a_r)
        os.close(first)
        os.close(second)
        r, out, err = await h.run(PY, "-c", script, stdin_fd=stdin_r, pass_fds=(a_r, b_r))
        assert (r.status, out) == (0, b"from stdin b'A' b'B'\n"), err
    finally:
        for fd in (stdin_r, a_r, a_w, b_r, b_w):
            os.close(fd)
        await h.ex.shutdown(0)


def test_received_fds_are_moved_above_every_target() -> None:
    r, w = os.pipe()
    order = Order(("true",), {}, None, (), None, None, None, (w + 2, w + 1))
    fds = array.array("i", [r, w])
    moved = _above_targets(fds, [Request((1, 0), order, False, (False, False), None, None)])
    try:
        assert min(moved) > w + 2 and len(moved) == 2
        os.write(moved[1], b"x")
        assert os.read(moved[0], 1) == b"x"
        for fd in (r, w):  # the originals are closed
            with pytest.raises(OSError):
                os.fstat(fd)
    finally:
        for fd in moved:
            os.close(fd)


@pytest.mark.slow
@pytest.mark.long
def test_kill9_of_a_helper_mid_array_ends_every_element_once(tmp_path: Path) -> None:
    record = tmp_path / "ran"
    spec = job(["sh", "-c", f'echo "{{cc}}" >> {record}; sleep 0.3'], array="0-39")
    spec["env"] = MARKED
    with LocalCluster(tmp_path / "mc", size=2, resources="cores=2", broker_runs_tasks=False, spawn_helpers=1,
                      dispatch_window=4) as cluster, cluster.client() as c:
        array = c.submit(spec)
        progressed(c, array, 4)
        [helper] = helpers_of(cluster.procs[1].pid)
        os.kill(helper, signal.SIGKILL)
        wait_for(c, array, timeout=120)
        rows = each_once(c, array, 40)
        assert no_leftovers(), "a task outlived its array"
        lost = [row for row in rows if row[6] and "spawn helper" in row[6]]
        assert 1 <= len(lost) <= 4, "what the helper had when it died, and no more"
        assert all(row[3] == 0 for row in rows if row not in lost)
        [new] = helpers_of(cluster.procs[1].pid)
        assert new != helper
    ran = record.read_text().split()
    assert len(ran) == len(set(ran)) >= 40 - len(lost), "the rest ran, once each"


def test_cancelling_an_array_while_its_elements_are_spawned_ends_every_element(tmp_path: Path) -> None:
    spec = job(["sleep", "30"], array="0-63")
    spec["env"] = MARKED
    with LocalCluster(tmp_path / "mc", size=2, resources="cores=8", broker_runs_tasks=False, spawn_helpers=2,
                      kill_grace=0.5) as cluster, cluster.client() as c:
        array = c.submit(spec)
        deadline = time.monotonic() + 30
        while not leftovers():  # the first spawns happened; others are on their way
            assert time.monotonic() < deadline, "nothing started"
            time.sleep(0.01)
        c.cancel([array])
        assert wait_for(c, array, timeout=60)["exception"] == "cancel"
        started = [row[1] for row in c.task_results(array)]  # the elements that had started: each once
        assert started and len(started) == len(set(started))
        assert no_leftovers(), "an element spawned around the cancel still runs"


def test_the_helper_path_runs_in_an_agent(tmp_path: Path) -> None:
    """spawn_helpers reaches the agent: a rank with 2 helpers has them as children once it ran a task."""
    with LocalCluster(tmp_path / "mc", size=2, resources="cores=2", broker_runs_tasks=False,
                      spawn_helpers=2) as cluster, cluster.client() as c:
        assert wait_for(c, c.submit(job(["true"])))["status"] == 0
        assert len(helpers_of(cluster.procs[1].pid)) == 2

