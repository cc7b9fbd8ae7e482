"""Fixtures that start real local MiniClusters (minicluster.testing.LocalCluster)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A shared 4-rank cluster, fanout 2 (so rank 3 is two hops from rank 0), 2 cores per rank."""
    with LocalCluster(tmp_path_factory.mktemp("c4"), size=4, fanout=2, resources="cores=2") as c:
        yield c


@pytest.fixture
def client4(cluster4: LocalCluster) -> Iterator[Client]:
    with cluster4.client() as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    """A client of the module's own `cluster` fixture."""
    with cluster.client() as c:
        yield c


def job(argv: list[str], **fields: Any) -> dict[str, Any]:
    """A jobspec map as the tools build it."""
    return {"argv": argv, "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp", **fields}


def wait_for(client: Client, job_id: int, timeout: float = 90.0) -> dict[str, Any]:
    """The job's `wait` result once it is inactive; AssertionError, with the job as the broker shows it, when it is
    not within `timeout` seconds (the default stays below pytest-timeout's 120 s, so a stuck job fails here)."""
    return wait_all(client, [job_id], timeout)[0]


def wait_all(client: Client, job_ids: list[int], timeout: float = 90.0) -> list[dict[str, Any]]:
    """The jobs' `wait` results, in the order they become inactive; AssertionError naming those that are not
    within `timeout` seconds, with the first as the broker shows it."""
    rid = client.request("wait", jobs=job_ids)
    deadline = time.monotonic() + timeout
    out: list[dict[str, Any]] = []
    try:
        while len(out) < len(job_ids) and (got := client.next_response(
                (rid,), timeout=max(0.0, deadline - time.monotonic()))) is not None:
            msg = got[1]
            if "job" in msg:
                out.append({k: v for k, v in msg.items() if k not in ("v", "id", "ok", "more")})
            elif not msg.get("more"):
                raise AssertionError(f"the wait for jobs {job_ids[:10]} ended without their results: {msg}")
    finally:
        client.discard(rid)
    left = sorted(set(job_ids) - {r["job"] for r in out})
    if left:
        who = f"job {left[0]}" if len(left) == 1 else f"{len(left)} jobs ({left[:10]})"
        raise AssertionError(f"{who} not inactive within {timeout:g}s: {client.job(left[0])}")
    return out


def until(check: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll `check` every 50 ms until it returns something true, and return that: a wait on a condition, not a
    fixed sleep. AssertionError saying `what` was awaited (and the last value) when it is not within `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what} (last: {value!r})")
        time.sleep(0.05)
    return value


def output_of(client: Client, job_id: int) -> dict[int, bytes]:
    """stdout per task."""
    out: dict[int, bytes] = {}
    for task, stream, data in client.output(job_id):
        if stream == 1:
            out[task] = out.get(task, b"") + data
    return out


def event_names(client: Client, job_id: int) -> list[str]:
    return [e[2] for e in client.eventlog(job_id)]


def started(client: Client, job_id: int) -> None:
    """Return once the job's `start` event is visible."""
    for event in client.eventlog(job_id, follow=True):
        if event[2] == "start":
            return
