"""Finished jobs live in the journal, not in the broker's memory (issue 17 item 4; protocol.md §3.3 `jobs`
paging): a real broker whose cache holds two finished jobs still lists, shows, replays and counts every one of
them, before and after a restart and a purge."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
import time

import pytest

from broker.durable import store
from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.integration.conftest import job

TIMEOUT = 60.0


def finish(c: Client, count: int, start: int = 0) -> list[int]:
    """`count` jobs that each print their number, one after the other (so they end in id order, which the purge
    follows); every third one exits 1."""
    ids = []
    for i in range(start, start + count):
        ids.append(c.submit(job(["sh", "-c", f"echo job-{i}; exit {int(i % 3 == 2)}"])))
        assert next(c.wait(ids[-1:]))["state"] == "INACTIVE"
    return ids


def all_pages(c: Client, limit: int, between=lambda: None) -> list[int]:
    """Every job id, paging through `jobs` with `before`/`next` as a client does."""
    listed: list[int] = []
    fields = {"all": True, "limit": limit}
    while True:
        page = c.call("jobs", **fields)
        assert len(page["jobs"]) <= limit
        listed += [s["id"] for s in page["jobs"]]
        if page["next"] is None:
            return listed
        fields["before"] = page["next"]
        between()


def assert_visible(c: Client, ids: list[int], first: int = 0) -> None:
    """Each finished job answers `job`, `output` and a followed `eventlog` (what `mc attach` reads)."""
    for n, job_id in enumerate(ids, first):
        summary = c.job(job_id)
        assert (summary["state"], summary["status"]) == ("INACTIVE", int(n % 3 == 2)), summary
        assert b"".join(d for _, _, d in c.output(job_id)) == f"job-{n}\n".encode()
        assert [e[2] for e in c.eventlog(job_id, follow=True)][-1] == "clean"


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_finished_jobs_stay_listed_visible_and_counted_out_of_the_cache_and_after_a_restart(tmp_path) -> None:
    with LocalCluster(tmp_path, size=1, finished_cache=2) as cluster:
        with cluster.client() as c:
            ids = finish(c, 6)
            assert sorted(all_pages(c, 4)) == ids
            assert_visible(c, ids)
            assert c.status()["queue"]["INACTIVE"] == 6
            assert [s["id"] for s in c.jobs(all=True)] == ids[::-1], "newest first, across pages"
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            assert c.status()["queue"]["INACTIVE"] == 6
            assert_visible(c, ids)
            assert all_pages(c, 5) == ids[::-1]


def test_paging_lists_each_job_exactly_once_while_jobs_are_submitted(tmp_path) -> None:
    with LocalCluster(tmp_path, size=1, finished_cache=3, test_exec=True) as cluster, cluster.client() as c:
        before = finish(c, 12)
        queued = c.submit(job(["true"], hold=True))  # held: active for the whole walk
        submitted: list[int] = []

        def submit_two() -> None:
            submitted.extend(c.submit(job(["true"])) for _ in range(2))

        listed = all_pages(c, 3, between=submit_two)
        assert len(listed) == len(set(listed)), "no job twice"
        assert set(before) | {queued} <= set(listed), "every job that existed through the walk"
        assert set(listed) <= set(before) | {queued} | set(submitted)
        assert listed == sorted(listed, reverse=True)


@pytest.mark.long
def test_counts_match_a_full_listing_after_purge_and_restart(tmp_path) -> None:
    with LocalCluster(tmp_path, size=1, finished_cache=1, purge_max_count=4) as cluster:
        with cluster.client() as c:
            ids = finish(c, 7)
            wait_until(lambda: len(all_pages(c, 2)) == 4, "the purge keeps 4")
            assert c.status()["queue"]["INACTIVE"] == 4
            assert all_pages(c, 2) == ids[:2:-1]
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            assert c.status()["queue"]["INACTIVE"] == len(all_pages(c, 3)) == 4
            more = finish(c, 2, start=7)
            wait_until(lambda: c.status()["queue"]["INACTIVE"] == 4, "the purge keeps 4 after a restart")
            assert all_pages(c, 3) == (ids[5:] + more)[::-1]
            assert_visible(c, ids[5:] + more, first=5)


@pytest.mark.long
def test_status_counts_follow_concurrent_clients(tmp_path) -> None:
    """`status` (protocol.md §3.3) counts finished jobs as they end, from other clients too."""
    with LocalCluster(tmp_path, size=1, finished_cache=2, test_exec=True) as cluster:
        errors: list[BaseException] = []

        def submitter() -> None:
            try:
                with cluster.client() as c:
                    finish(c, 5)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=submitter) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert not errors
        with cluster.client() as c:
            assert c.status()["queue"]["INACTIVE"] == len(all_pages(c, 4)) == 15


@pytest.mark.long
def test_finished_jobs_keep_their_nodes_and_ranks_after_a_restart(tmp_path) -> None:
    """`mc jobs -a` after a restart shows where finished jobs ran, as before it (not `-`)."""
    with LocalCluster(tmp_path, size=3, resources="cores=1", finished_cache=2) as cluster:
        with cluster.client() as c:
            spread = c.submit(job(["true"], ntasks=3, nnodes=3, mpi="none"))
            array = c.submit(job(["true"], array="0-5"))
            single = c.submit(job(["true"]))
            ended = list(c.wait([spread, array, single]))
            assert all(s["status"] == 0 for s in ended), ended
            before = {s["id"]: s["ranks"] for s in c.jobs(all=True)}
        assert before[spread] == "0-2" and before[single] != ""

        def listing() -> dict[int, list[str]]:
            env = {**os.environ, "MC_URI": cluster.uri}
            out = subprocess.run(["mc", "jobs", "-a"], capture_output=True, text=True, env=env, timeout=30)
            assert out.returncode == 0, out.stderr
            rows = [line.split() for line in out.stdout.splitlines()[1:]]
            return {int(row[0]): row[5:7] for row in rows}  # NODES, RANKS

        shown = listing()
        cluster.kill(0)
        cluster.restart(0)
        with cluster.client() as c:
            assert {s["id"]: s["ranks"] for s in c.jobs(all=True)} == before
        assert listing() == shown
        assert shown[spread] == ["3", "0-2"]


def test_a_journal_with_names_from_before_the_control_character_rule_still_starts(tmp_path) -> None:
    """Names with control characters were accepted once: a journal holding such a name (active or finished)
    starts as before, the name made printable, and no job is lost."""
    with LocalCluster(tmp_path, size=1) as cluster:
        with cluster.client() as c:
            finished = c.submit(job(["true"]))
            next(c.wait([finished]))
            waiting = c.submit(job(["true"], hold=True))
        cluster.kill(0)
        with contextlib.closing(sqlite3.connect(tmp_path / "journal.sqlite")) as db, db:
            for job_id in (finished, waiting):
                (blob,) = db.execute("SELECT spec FROM jobs WHERE id=?", (job_id,)).fetchone()
                spec = {**store.unpack(blob), "name": "old\033[2J\0name"}
                db.execute("UPDATE jobs SET spec=? WHERE id=?", (store.pack(spec), job_id))
        cluster.restart(0)
        with cluster.client() as c:
            names = {s["id"]: s["name"] for s in c.jobs(all=True)}
            assert names == {finished: "old\\033[2J\\000name", waiting: "old\\033[2J\\000name"}
            c.release([waiting])
            assert next(c.wait([waiting]))["status"] == 0
