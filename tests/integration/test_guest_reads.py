"""Who may read what (issue 10, item 8; docs/security.md): a guest reads only its own jobs' output, event log,
task results, attempts, usage and details; the instance owner reads everything; the queue listing is public
but hides another user's `reason`. Guests are real second uids (forked children of the root test)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from minicluster.client import Client
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.test_access import GUEST, NOGROUP, OTHER_GUEST, as_user, shared  # noqa: F401 (fixture)

pytestmark = pytest.mark.needs(root=True)  # switching uids

# Every read of one job, as the client library calls it, reduced to something JSON can carry.
READS: dict[str, Callable[[Client, int], Any]] = {
    "output": lambda c, j: [data.decode() for _, _, data in c.output(j)],
    "eventlog": lambda c, j: [event[2] for event in c.eventlog(j)],
    "task-results": lambda c, j: c.task_results(j),
    "job": lambda c, j: c.job(j)["id"],
    "wait": lambda c, j: [r["status"] for r in c.wait([j])],
    "attempts": lambda c, j: c.attempts(j),
    "job-usage": lambda c, j: c.job_usage(j)["job"],
}


def read_as(uid: int, uri: str, op: str, job_id: int) -> dict[str, Any]:
    return as_user(uid, NOGROUP, lambda: READS[op](Client(uri), job_id))


@pytest.fixture(scope="module")
def jobs(shared) -> dict[str, int]:  # noqa: F811
    """One ended job of the owner's (it printed a secret) and one of the guest's."""
    with shared.client() as owner:
        owners = owner.submit(job(["echo", "the owner's secret"]))
        failed = owner.submit(job(["/opt/the-owners-secret-tool"]))
        guests = as_user(GUEST, NOGROUP, lambda: Client(shared.uri).submit(job(["echo", "guest line"])))["ok"]
        for job_id in (owners, failed, guests):
            wait_for(owner, job_id)
            # job-usage answers once the job's clean event is durable: follow its event log to the end.
            list(owner.eventlog(job_id, follow=True))
    return {"owners": owners, "failed": failed, "guests": guests}


@pytest.mark.parametrize("op", sorted(READS))
def test_a_guest_cannot_read_another_users_job(shared, jobs: dict[str, int], op: str) -> None:  # noqa: F811
    refused = read_as(GUEST, shared.uri, op, jobs["owners"])
    assert refused.get("error") == "permission", refused
    assert "belongs to another user" in refused["message"]
    refused = read_as(OTHER_GUEST, shared.uri, op, jobs["guests"])
    assert refused.get("error") == "permission", refused


@pytest.mark.parametrize("op", sorted(READS))
def test_a_guest_reads_its_own_job_and_the_owner_reads_all(shared, jobs: dict[str, int], op: str) -> None:  # noqa: F811
    own = read_as(GUEST, shared.uri, op, jobs["guests"])
    assert "ok" in own, own
    with shared.client() as owner:
        assert READS[op](owner, jobs["guests"]) == own["ok"]
        READS[op](owner, jobs["owners"])


def test_the_output_a_guest_reads_is_its_own(shared, jobs: dict[str, int]) -> None:  # noqa: F811
    assert read_as(GUEST, shared.uri, "output", jobs["guests"])["ok"] == ["guest line\n"]
    with shared.client() as owner:
        assert output_of(owner, jobs["owners"])[0] == b"the owner's secret\n"


def test_the_queue_is_public_but_not_another_users_reason(shared, jobs: dict[str, int]) -> None:  # noqa: F811
    def listing(c: Client) -> dict[int, Any]:
        return {s["id"]: s["reason"] for s in c.jobs(ids=[jobs["failed"], jobs["guests"]], all=True)}

    with shared.client() as owner:
        seen_by_owner = listing(owner)
    assert "the-owners-secret-tool" in seen_by_owner[jobs["failed"]]
    seen_by_guest = {int(k): v for k, v in as_user(GUEST, NOGROUP, lambda: listing(Client(shared.uri)))["ok"].items()}
    assert seen_by_guest[jobs["failed"]] is None
    assert seen_by_guest[jobs["guests"]] == seen_by_owner[jobs["guests"]]
