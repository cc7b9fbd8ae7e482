"""Sharing a real instance between two Unix users (root, the owner, and a guest uid): queues and their limits,
pending reasons, queue switches, banks and fair share, preemption, usage accounting and efficiency, the metrics,
and all of it after a broker kill -9 and a purge."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from minicluster import config as config_mod
from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import event_names, job, wait_for
from tests.integration.test_access import GUEST, NOGROUP, as_user

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="a second user needs root (CI runs as root)")

SHARING: dict[str, Any] = {
    "queues": {
        "batch": {"user_limits": {"running_jobs": 2}, "max_time_limit": "1h"},
        "high": {"priority": 100},
        "scav": {"preemptible": True, "preempt_mode": "cancel"},
        "gpu": {"requires": ["zone=gpu"]},
        "spot": {"preemptible": True},   # preempt_mode requeue
    },
    "banks": {"physics": {"shares": 2, "users": ["0"]}, "chem": {"shares": 1, "users": [str(GUEST)]}},
    "priority": {"fairshare_interval": 0.2},
}


def _state_dir() -> str:
    state = tempfile.mkdtemp(prefix="mc-share-")
    os.chmod(state, 0o711)  # the guest must traverse to the socket's directory
    return state


@pytest.fixture(scope="module")
def shared() -> Iterator[LocalCluster]:
    cluster = LocalCluster(_state_dir(), size=2, resources="cores=4", access_group="nogroup", **SHARING).start()
    yield cluster
    cluster.stop()


def guest(cluster: LocalCluster, fn: Any) -> Any:
    return as_user(GUEST, NOGROUP, lambda: fn(Client(cluster.uri)))


def mc(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minicluster", *argv], env={**os.environ, "MC_URI": cluster.uri},
                          capture_output=True, text=True, timeout=60)


def _until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout}s: {check}")


def test_user_limit_holds_jobs_with_its_reason_and_other_users_run(shared: LocalCluster) -> None:
    with shared.client() as c:
        # Mine run until cancelled: the held one must still be held when `mc jobs` looks, however slow the host.
        mine = [c.submit(job(["sleep", "300"])) for _ in range(3)]
        theirs = guest(shared, lambda g: g.submit(job(["sleep", "1"])))["ok"]
        _until(lambda: c.job(mine[1])["state"] == "RUN" and c.job(theirs)["state"] in ("RUN", "INACTIVE"))
        held = c.job(mine[2])
        assert held["state"] == "SCHED" and held["queue"] == "batch" and held["project"] == "physics"
        assert held["pending_reason"] == "UserMaxRunningJobs: uid 0 in queue batch has 2 of 2 jobs in use"
        listing = mc(shared, "jobs")
        assert "(UserMaxRunningJobs: uid 0 in queue batch has 2 of 2 jobs in use)" in listing.stdout
        status = mc(shared, "queue", "status", "batch", "--json")
        batch = json.loads(status.stdout)["queues"][0]
        assert batch["user_limits"]["running_jobs"] == 2 and batch["running"] >= 2
        assert {u["uid"] for u in batch["users"]} >= {0}
        assert wait_for(c, theirs)["status"] == 0
        assert c.job(theirs)["project"] == "chem"
        c.cancel(mine)
        for j in mine:
            assert wait_for(c, j)["exception"] == "cancel"


def test_submissions_get_their_queue_and_bank_or_a_clear_refusal(shared: LocalCluster) -> None:
    refused = mc(shared, "submit", "-q", "nosuch", "true")
    assert refused.returncode == 1
    assert "queue: no queue 'nosuch' (queues: batch, high, scav, gpu, spot)" in refused.stderr
    nowhere = mc(shared, "submit", "-q", "gpu", "true")   # the queue's nodes: none here has zone=gpu
    assert nowhere.returncode == 1 and "no node has zone=gpu" in nowhere.stderr
    too_long = mc(shared, "submit", "-t", "2h", "true")
    assert "time_limit: 7200s exceeds queue batch's maximum of 3600s" in too_long.stderr
    not_member = guest(shared, lambda g: g.submit(job(["true"], project="physics")))
    assert not_member["error"] == "invalid-jobspec" and "not a member of bank 'physics'" in not_member["message"]
    with shared.client() as c:
        ok = c.submit(job(["true"], queue="high", project="physics"))
        assert wait_for(c, ok)["status"] == 0
        assert (c.job(ok)["queue"], c.job(ok)["project"]) == ("high", "physics")


def test_queue_switches_are_the_owners_and_do_what_flux_does(shared: LocalCluster) -> None:
    denied = guest(shared, lambda g: g.queue_control("stop", ["high"]))
    assert denied["error"] == "permission"
    assert mc(shared, "queue", "stop", "high", "--reason", "maintenance").returncode == 0
    with shared.client() as c:
        waiting = c.submit(job(["true"], queue="high"))    # stopped: accepted, not run
        # A later job of a started queue runs: scheduling passes went by, and passed the stopped queue's job over.
        assert wait_for(c, c.submit(job(["true"])))["status"] == 0
        summary = c.job(waiting)
        assert summary["state"] == "SCHED" and summary["pending_reason"] == "QueueStopped: queue high is stopped"
        assert "enabled,stopped (maintenance)" in mc(shared, "queue", "list").stdout
        assert mc(shared, "queue", "disable", "high").returncode == 0
        refused = mc(shared, "submit", "-q", "high", "true")
        assert "queue high is disabled (not accepting jobs): disabled by the instance owner" in refused.stderr
        assert mc(shared, "queue", "start", "--all").returncode == 0
        assert mc(shared, "queue", "enable", "--all").returncode == 0
        assert wait_for(c, waiting)["status"] == 0
        assert all(q["enabled"] and q["started"] for q in c.queues()["queues"])


def test_preemption_cancels_the_lowest_cost_scavenger_work(shared: LocalCluster) -> None:
    with shared.client() as c:
        c.drain([0], "keep the test on rank 1")
        try:
            old = c.submit(job(["sleep", "60"], queue="scav", cores_per_task=2))
            _until(lambda: c.job(old)["state"] == "RUN")
            time.sleep(1.0)  # kept: the work a preemption loses is run time, and the old job must have run longer
            young = c.submit(job(["sleep", "60"], queue="scav", array="0-1"))
            _until(lambda: c.job(young)["counts"]["running"] == 2)
            urgent = c.submit(job(["sh", "-c", "echo ran"], queue="high", cores_per_task=2))
            assert wait_for(c, urgent)["status"] == 0
            # The two young 1-core elements lost less work than the 2-core job that ran for a second longer.
            assert c.job(old)["state"] == "RUN"
            elements = wait_for(c, young)
            assert c.job(young)["counts"]["cancelled"] == 2 and elements["state"] == "INACTIVE"
            notes = [e[3]["note"] for e in c.eventlog(young) if e[2] == "exception"]
            assert notes and all(f"preempted by job {urgent} of queue high" in n for n in notes)
            c.cancel([old])
            wait_for(c, old)
            plain = c.submit(job(["sleep", "60"], queue="scav", cores_per_task=4))
            _until(lambda: c.job(plain)["state"] == "RUN")
            again = c.submit(job(["true"], queue="high"))
            assert wait_for(c, again)["status"] == 0
            ended = wait_for(c, plain)
            assert ended["exception"] == "preempt" and ended["status"] == 143
            assert "exception" in event_names(c, plain)
        finally:
            c.undrain([0])


def test_preemption_requeues_where_the_queue_says_so_and_it_is_not_a_retry(shared: LocalCluster) -> None:
    with shared.client() as c:
        c.drain([0], "keep the test on rank 1")
        try:
            plain = c.submit(job(["sh", "-c", "sleep 1; echo done"], queue="spot", cores_per_task=4))
            _until(lambda: c.job(plain)["state"] == "RUN")
            urgent = c.submit(job(["sleep", "0.5"], queue="high", cores_per_task=4))
            assert wait_for(c, urgent)["status"] == 0
            assert wait_for(c, plain)["status"] == 0     # it ran again, to its end
            events = list(c.eventlog(plain))
            requeues = [e[3] for e in events if e[2] == "requeue"]
            assert requeues and requeues[0]["reason"] == "preempted"
            notes = [e[3]["note"] for e in events if e[2] == "exception"]
            assert notes == [f"preempted by job {urgent} of queue high"]
            assert c.job(plain)["retries"] == 0
            array = c.submit(job(["sleep", "1"], queue="spot", array="0-3"))
            _until(lambda: c.job(array)["counts"]["running"] == 4)
            urgent = c.submit(job(["true"], queue="high", cores_per_task=2))
            assert wait_for(c, urgent)["status"] == 0
            assert wait_for(c, array)["status"] == 0
            summary = c.job(array)
            assert summary["counts"]["succeeded"] == 4 and summary["retries"] == 0
            requeued = [e[3] for e in c.eventlog(array) if e[2] == "requeue"]
            assert requeued and all(r["reason"] == "preempted" for r in requeued)
        finally:
            c.undrain([0])


def test_usage_and_efficiency_reports(shared: LocalCluster) -> None:
    with shared.client() as c:
        spin = "import time\nt = time.time()\nwhile time.time() - t < 1: pass"
        busy = c.submit(job([sys.executable, "-c", spin], cores_per_task=4, mem_per_task=64))
        assert wait_for(c, busy)["status"] == 0
        # What earlier tests on this shared instance left, so the guest's job below is counted on its own.
        guest_jobs_before = sum(r["jobs"] for r in c.usage(user=GUEST) if r["project"] == "chem")
        guest_job = guest(shared, lambda g: g.submit(job(["sleep", "0.5"], cores_per_task=2)))["ok"]
        wait_for(c, guest_job)
        eff = c.job_usage(busy)
        assert eff["cores"] == 4 and eff["core_seconds"] >= 4.0
        # One core of four busy (less when this shared machine is loaded: 0.04 under a load of 15), never more.
        assert 0 < eff["cpu_efficiency"] <= 0.26
        assert eff["max_rss_kb"] > 1000 and eff["memory_efficiency"] is not None
        report = mc(shared, "job", "eff", str(busy))
        assert "CPU Efficiency:" in report.stdout and "of 64 MiB per task" in report.stdout
        rows = json.loads(mc(shared, "usage", "--json").stdout)["usage"]
        by_user = {(r["uid"], r["project"]): r for r in rows}
        assert by_user[(0, "physics")]["core_hours"] > 0 and by_user[(GUEST, "chem")]["jobs"] == guest_jobs_before + 1
        only_guest = c.usage(user=GUEST)
        assert {r["uid"] for r in only_guest} == {GUEST}
        assert c.usage(since=time.time() + 7200) == []
        # The same filters through the tool, as a user types them.
        chem = json.loads(mc(shared, "usage", "--project", "chem", "--json").stdout)["usage"]
        assert chem and {r["project"] for r in chem} == {"chem"} and {r["uid"] for r in chem} == {GUEST}
        assert json.loads(mc(shared, "usage", "--until", "2000-01-01", "--json").stdout)["usage"] == []
        per_queue = json.loads(mc(shared, "usage", "--by-queue", "--json").stdout)["usage"]
        assert {r["queue"] for r in per_queue} >= {"batch"}
        assert sum(r["jobs"] for r in per_queue) == sum(r["jobs"] for r in rows)
        text = mc(shared, "usage", "--by-queue").stdout.splitlines()
        assert text[0].split()[:3] == ["USER", "PROJECT", "QUEUE"] and text[-1].startswith("TOTAL")
        table = mc(shared, "jobs", "-a", "-o", "eff", str(busy)).stdout
        assert "CPU EFF" in table and "%" in table.splitlines()[1]


def test_fair_share_puts_the_user_of_the_lighter_bank_first(shared: LocalCluster) -> None:
    # Usage of its own in both banks, not what earlier tests of the module left: it runs alone too.
    with shared.client() as c:
        wait_for(c, c.submit(job(["sleep", "0.3"], cores_per_task=2)))
        wait_for(c, guest(shared, lambda g: g.submit(job(["sleep", "0.3"])))["ok"])

    def used_by_both() -> list[dict[str, Any]] | None:  # usage is folded in every fairshare_interval (0.2 s)
        nodes: list[dict[str, Any]] = mc_json(shared, "bank", "list")["banks"]
        usage = {n["parent"]: n["usage"] for n in nodes if n.get("uid") in (0, GUEST)}
        return nodes if usage.get("physics", 0) > 0 and usage.get("chem", 0) > 0 else None

    nodes = _until(used_by_both)
    level = {n["name"]: n["level_fs"] for n in nodes if "uid" not in n}     # None: no usage yet (infinite)
    lighter_bank = max(level, key=lambda b: float("inf") if level[b] is None else level[b])
    with shared.client() as c:
        c.drain([0, 1], "hold everything")
        try:
            mine = c.submit(job(["true"]))
            theirs = guest(shared, lambda g: g.submit(job(["true"])))["ok"]
            parts = {s["id"]: s["priority_components"] for s in c.jobs(ids=[mine, theirs], priority=True)}
            lighter, heavier = (mine, theirs) if lighter_bank == "physics" else (theirs, mine)
            assert parts[lighter]["factors"]["fairshare"] == 1.0
            assert parts[lighter]["priority"] > parts[heavier]["priority"]
            assert c.job(lighter)["priority"] == pytest.approx(parts[lighter]["priority"], rel=0.01)
            assert "FAIRSHARE" in mc(shared, "jobs", "--priority").stdout
        finally:
            c.undrain([0, 1])
        wait_for(c, mine)
        wait_for(c, theirs)


def mc_json(cluster: LocalCluster, *argv: str) -> Any:
    done = mc(cluster, *argv, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_banks_are_the_owners_to_change(shared: LocalCluster) -> None:
    assert guest(shared, lambda g: g.bank_add("bio"))["error"] == "permission"
    assert mc(shared, "bank", "add", "bio", "--shares", "3").returncode == 0
    assert mc(shared, "bank", "add", "bio", "--user", str(GUEST), "--default").returncode == 0
    config_owned = mc(shared, "bank", "remove", "chem", "--user", str(GUEST))
    assert "by the config; remove it there" in config_owned.stderr
    names = [n["name"] for n in mc_json(shared, "bank", "list")["banks"]]
    assert "bio" in names
    with shared.client() as c:
        moved = guest(shared, lambda g: g.submit(job(["true"])))["ok"]
        wait_for(c, moved)
        assert c.job(moved)["project"] == "bio"
    busy = mc(shared, "bank", "remove", "physics")
    assert "defined in the config" in busy.stderr
    assert mc(shared, "bank", "remove", "bio").returncode == 0
    assert "bio" not in [n["name"] for n in mc_json(shared, "bank", "list")["banks"]]


def test_metrics_show_queue_and_user_gauges(tmp_path: Any) -> None:
    port = 18000 + os.getpid() % 2000
    with (LocalCluster(tmp_path, size=1, resources="cores=2", status_port=port, **SHARING) as cluster,
          cluster.client() as c):
        c.drain([0], "hold")
        held = c.submit(job(["true"], queue="high"))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'minicluster_queue_pending{queue="high"} 1' in text
        assert 'minicluster_queue_open{queue="scav",switch="started"} 1' in text
        assert 'minicluster_user_pending{user="root",uid="0"} 1' in text
        # The operator reads the same gauges as JSON from /status.
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10).read())
        assert status["queues"]["high"]["pending"] == 1 and status["queues"]["batch"]["pending"] == 0
        assert status["queues"]["scav"]["started"] is True and status["queues"]["scav"]["enabled"] is True
        assert status["users"]["0"]["name"] == "root" and status["users"]["0"]["pending"] == 1
        c.undrain([0])
        wait_for(c, held)


@pytest.mark.slow
def test_queues_banks_and_usage_survive_kill9_and_purge(tmp_path: Any) -> None:
    settings = dict(SHARING, purge_max_count=0)
    with LocalCluster(tmp_path, size=1, resources="cores=2", **settings) as cluster:
        with cluster.client() as c:
            done = c.submit(job(["sleep", "0.3"], cores_per_task=2))
            wait_for(c, done)
            c.queue_control("stop", ["high"], "for the test")
            c.queue_control("disable", ["scav"])
            c.bank_add("bio", shares=5)
            c.bank_add("bio", user=0, default=True)
            before = c.usage()
            running = c.submit(job(["sleep", "1"]))
            _until(lambda: c.job(running)["state"] == "RUN")
            # Kept: fair-share usage is saved every fairshare_interval (0.2 s here), a write no client sees
            # acknowledged (mc banks computes its own): a bounded wait over two saves.
            time.sleep(0.5)
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            queues = {q["name"]: q for q in c.queues()["queues"]}
            assert not queues["high"]["started"] and queues["high"]["reason"] == "for the test"
            assert not queues["scav"]["enabled"] and queues["batch"]["enabled"] and queues["batch"]["started"]
            assert any(n["name"] == "bio" and n["shares"] == 5 for n in c.banks())
            assert c.usage() == before   # finished jobs, and the purged job's usage is still counted
            wait_for(c, running)
            fresh = c.submit(job(["true"]))
            wait_for(c, fresh)
            assert c.job(fresh)["project"] == "bio"
            _until(lambda: sum(r["jobs"] for r in c.usage()) == before[0]["jobs"] + 2)
            _until(lambda: done not in {j["id"] for j in c.jobs(all=True)})  # purged, still counted above
            fairshare = {(n["parent"], n.get("uid")): n["usage"] for n in c.banks() if "uid" in n}
            assert fairshare[("physics", 0)] > 0  # decayed usage came back from the journal


@pytest.mark.slow
def test_queue_settings_follow_the_config_file(tmp_path: Any) -> None:
    """What the operator does when spec.queues changes: rewrite config.toml; the broker applies it live."""
    with LocalCluster(tmp_path, size=1, resources="cores=2", **SHARING) as cluster, cluster.client() as c:
        queues = dict(SHARING["queues"], night={"priority": 5}, batch={"user_limits": {"running_jobs": 7}})
        config_mod.write(cluster.config.replace(queues=queues), cluster.config_path)
        found = _until(lambda: {q["name"]: q for q in c.queues()["queues"]}.get("night"), timeout=30)
        assert found["priority"] == 5
        batch = next(q for q in c.queues()["queues"] if q["name"] == "batch")
        assert batch["user_limits"]["running_jobs"] == 7 and batch["max_time_limit"] == 0
        assert wait_for(c, c.submit(job(["true"], queue="night")))["status"] == 0


def test_a_queues_default_time_limit_and_queued_jobs_limit_hold_on_a_real_broker(tmp_path: Any) -> None:
    # 3 s, not 1: a loaded CI machine once took over a second to run `true` (status 143).
    queues = {"short": {"default_time_limit": "3s", "user_limits": {"queued_jobs": 2}}, "long": {}}
    with (LocalCluster(tmp_path, size=1, resources="cores=1", queues=queues, default_queue="long") as cluster,
          cluster.client() as c):
        # No -t: the queue's default applies (3 s), not the instance's (an hour).
        timed = c.submit(job(["sleep", "30"], queue="short"))
        result = wait_for(c, timed, timeout=20)
        assert result["exception"] == "timeout"
        assert any(e[2] == "exception" and "time limit of 3s" in e[3]["note"] for e in c.eventlog(timed))
        # Two waiting jobs of this user in `short` at most: the core is held, so these queue up.
        blocker = c.submit(job(["sleep", "30"], queue="long"))
        waiting = [c.submit(job(["true"], queue="short")) for _ in range(2)]
        refused = mc(cluster, "submit", "--queue", "short", "true")
        assert refused.returncode != 0
        assert "has 2 jobs waiting; 1 more would exceed the per-user limit of 2 (max queued jobs)" in refused.stderr
        c.cancel([blocker])
        assert [wait_for(c, j)["status"] for j in waiting] == [0, 0]
        # Room again once they ran.
        assert wait_for(c, c.submit(job(["true"], queue="short")))["status"] == 0
