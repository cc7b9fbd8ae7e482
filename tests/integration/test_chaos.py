"""Chaos (issue 10): random kill -9 and SIGSTOP of the broker and the workers while arrays and pipelined
submissions flow. Invariants: every acknowledged id exists, each index has exactly one final result, counts never
go back, event logs are gapless, nothing is stuck. MC_CHAOS_SEED replays a run; the figures go to stderr."""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from typing import Any

import pytest

from minicluster.client import Client, ClientError
from minicluster.testing import LocalCluster
from tests.integration.conftest import job

ARRAY = 16
PLAIN = job(["sh", "-c", "echo plain; sleep 0.1"])
# Short enough (once a few ran) to go ahead in the dispatch window behind one another (protocol.md §2.10).
SMALL = job(["sh", "-c", "echo small"])
ELEMENTS = job(["sh", "-c", "echo $MC_TASK_INDEX; sleep 0.05"], array=f"1-{ARRAY}")


class Submitter(threading.Thread):
    """Pipelines batches of plain jobs, small ones and an array, reconnecting whenever the broker goes away;
    cancels about one array in four 0.3 s after its submission, while its elements run and wait in the dispatch
    window."""

    def __init__(self, cluster: LocalCluster, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.rng = random.Random(rng.random())  # its own: the main thread's draws stay replayable
        self.stop = threading.Event()
        self.acked: list[int] = []
        self.arrays: set[int] = set()
        self.small: set[int] = set()
        self.cancelled: set[int] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with self.cluster.client() as c:
                    while not self.stop.is_set():
                        answers = c.submit_many([ELEMENTS, PLAIN, PLAIN, SMALL, SMALL, SMALL, SMALL])
                        if isinstance(answers[0], int):
                            self.arrays.add(answers[0])
                        self.small.update(a for a in answers[3:] if isinstance(a, int))
                        self.acked.extend(a for a in answers if isinstance(a, int))
                        time.sleep(0.3)
                        if isinstance(answers[0], int) and self.rng.random() < 0.25:
                            self.cancelled.add(answers[0])  # before the call: the broker may die in it
                            c.cancel([answers[0]])
            except (ClientError, OSError):
                time.sleep(0.1)  # the broker died or stopped under us: what was acknowledged counts


class Counts:
    """Samples every acknowledged job's counts; none may ever go down, an inactive job stays inactive."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int, int, bool]] = {}
        self.samples = 0

    def sample(self, c: Client, ids: list[int]) -> None:
        for row in c.jobs(all=True, ids=ids, limit=len(ids) + 1):
            counts = row["counts"]
            now = (counts["succeeded"], counts["failed"], counts["cancelled"], row["state"] == "INACTIVE")
            before = self.seen.get(row["id"], (0, 0, 0, False))
            assert all(n >= b for n, b in zip(now, before, strict=True)), (row["id"], before, now)
            self.seen[row["id"]] = now
            self.samples += 1


def act(cluster: LocalCluster, rng: random.Random) -> str:
    """One random disruption; returns what it was."""
    rank = rng.randrange(cluster.config.size)
    if rng.random() < 0.5:
        cluster.kill(rank)
        if rank == 0:
            cluster.restart(0)
        else:
            cluster.start_rank(rank)
            cluster.wait_states({rank: "up"})
        return f"kill -9 rank {rank}"
    pause = rng.uniform(0.2, 2.5)  # past lost_after (2 s) the rank is lost and rejoins
    cluster.procs[rank].send_signal(signal.SIGSTOP)
    time.sleep(pause)
    cluster.procs[rank].send_signal(signal.SIGCONT)
    return f"SIGSTOP rank {rank} {pause:.1f}s"


def settle_and_check(cluster: LocalCluster, submitter: Submitter, counts: Counts) -> dict[str, int]:
    acked = sorted(set(submitter.acked))
    assert len(acked) == len(submitter.acked), "an id was acknowledged twice"
    with cluster.client() as c:
        ended = {r["job"]: r for r in c.wait(acked)}  # nothing stuck: every job ends (bounded by the timeout)
        assert set(ended) == set(acked)
        counts.sample(c, acked)
        results = events = kept = 0
        for job_id in acked:
            log = list(c.eventlog(job_id))
            assert [e[0] for e in log] == list(range(len(log))) and log[-1][2] == "clean", (job_id, log)
            events += len(log)
            summary = c.job(job_id)
            # No job shows another's output (a line in flight to a dying broker may be missing, never foreign).
            lines = b"".join(d for _, _, d in c.output(job_id)).split()
            mine = ({str(i).encode() for i in range(1, ARRAY + 1)} if job_id in submitter.arrays
                    else {b"small"} if job_id in submitter.small else {b"plain"})
            assert set(lines) <= mine, (job_id, lines)
            kept += len(lines)
            if job_id in submitter.arrays:
                rows = c.task_results(job_id)
                ended_counts = summary["counts"]
                assert sum(ended_counts[k] for k in ("succeeded", "failed", "cancelled")) == ARRAY, summary
                assert ended_counts["succeeded"] == sum(r[3] == 0 for r in rows), (summary, rows)
                if summary["exception"] == "cancel":
                    # Each index ends at most once; one that ran ended on its own, by the cancel's signal, or
                    # with its rank; the others never started.
                    assert job_id in submitter.cancelled, summary
                    assert len({r[1] for r in rows}) == len(rows), (job_id, rows)
                else:
                    # Each index ends exactly once: it succeeded, or its rank was lost under it.
                    assert sorted(r[1] for r in rows) == list(range(1, ARRAY + 1)), (job_id, rows)
                    assert all(r[3] == 0 or r[6] == "node-lost" for r in rows), (job_id, rows)
                    assert ended_counts["succeeded"] + ended_counts["failed"] == ARRAY, summary
                results += len(rows)
            else:
                assert summary["exception"] in (None, "node-lost", "broker-restart"), summary
                assert summary["status"] == 0 or summary["exception"] is not None, summary
                results += 1
        # Nothing stays allocated once every job ended (a rank lost at the end shows none free: not counted).
        deadline = time.monotonic() + 10
        while (held := [r for r in c.resources() if r["state"] == "up" and r["cores_free"] != r["cores_total"]]):
            assert time.monotonic() < deadline, held
            time.sleep(0.2)
    return {"jobs": len(acked), "arrays": len(submitter.arrays), "small": len(submitter.small),
            "cancelled": len(submitter.cancelled),
            "results": results, "events": events,
            "output lines": kept}


def chaos(tmp_path: Any, rounds: int, capfd: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("MC_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    # Said first, so a run that hangs can be replayed (MC_CHAOS_SEED).
    print(f"chaos seed={seed} rounds={rounds}", file=sys.stderr, flush=True)
    actions: list[str] = []
    counts = Counts()
    window = int(os.environ.get("MC_CHAOS_WINDOW", "32"))
    with LocalCluster(tmp_path, size=3, fanout=2, resources="cores=2", reattach_timeout=2.0,
                      dispatch_window=window) as cluster:
        with cluster.client() as c:
            c.drain([0], "chaos: tasks on the workers")
        submitter = Submitter(cluster, rng)
        submitter.start()
        try:
            for _ in range(rounds):
                time.sleep(rng.uniform(0.3, 1.0))
                actions.append(act(cluster, rng))
                cluster.wait_socket()
                with cluster.client() as c:
                    counts.sample(c, list(submitter.acked))
        finally:
            submitter.stop.set()
            submitter.join(30)
        figures = settle_and_check(cluster, submitter, counts)
    # The ranks log to this test's stderr: no handler of theirs failed along the way.
    logged = capfd.readouterr().err
    for bad in ("Traceback", " ERROR"):
        assert bad not in logged, logged[logged.find(bad) - 300:][:3000]
    print(f"chaos seed={seed} rounds={rounds} actions={actions} count samples={counts.samples} {figures}",
          file=sys.stderr)


@pytest.mark.timeout(90)
@pytest.mark.long
def test_chaos_short(tmp_path, capfd) -> None:
    chaos(tmp_path, rounds=3, capfd=capfd)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(600)
def test_chaos_long(tmp_path, capfd) -> None:
    chaos(tmp_path, rounds=25, capfd=capfd)
