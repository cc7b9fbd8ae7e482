"""Fixtures that start real local MiniClusters (minicluster.testing.LocalCluster)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster


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
    rid = client.request("wait", jobs=[job_id])
    deadline = time.monotonic() + timeout
    try:
        while (got := client.next_response((rid,), timeout=max(0.0, deadline - time.monotonic()))) is not None:
            msg = got[1]
            if "job" in msg:
                return {k: v for k, v in msg.items() if k not in ("v", "id", "ok", "more")}
            if not msg.get("more"):
                raise AssertionError(f"the wait for job {job_id} ended without its result: {msg}")
    finally:
        client.discard(rid)
    raise AssertionError(f"job {job_id} not inactive within {timeout:g}s: {client.job(job_id)}")


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
