"""Workflow rights (protocol.md §3.9): dependencies only on one's own jobs (the instance owner on any), and only
a job's owner or the instance owner may hold, release, update or requeue it. Guests are forked children that
drop to another uid (tests/integration/test_access.py)."""
from __future__ import annotations

import os
from typing import Any

import pytest

from minicluster.client import Client
from tests.integration.conftest import job, wait_for
from tests.integration.test_access import GUEST, NOGROUP, OTHER_GUEST, as_user, shared  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="switching uids needs root (CI runs as root)")


def test_dependencies_and_changes_need_the_jobs_owner(shared) -> None:  # noqa: F811
    uri = shared.uri
    with shared.client() as owner:
        owners_job = owner.submit(job(["sleep", "30"]))
        refused = as_user(GUEST, NOGROUP, lambda: Client(uri).submit(
            job(["true"], dependencies=[{"type": "afterany", "jobs": [owners_job]}])))
        assert refused["error"] == "permission" and f"job {owners_job} belongs to uid 0" in refused["message"]
        guest_job = as_user(GUEST, NOGROUP, lambda: Client(uri).submit(job(["sleep", "30"], hold=True)))["ok"]
        own_dep = as_user(GUEST, NOGROUP, lambda: Client(uri).submit(
            job(["true"], dependencies=[{"type": "afterany", "jobs": [guest_job]}])))
        assert isinstance(own_dep["ok"], int)
        # The instance owner may depend on anyone's job.
        assert owner.submit(job(["true"], dependencies=[{"type": "afterany", "jobs": [guest_job]}])) > 0

        def others(op: str, target: int) -> Any:
            def call() -> Any:
                client = Client(uri)
                if op == "update":
                    return client.update(target, urgency=1)
                return getattr(client, op)([target])[1]
            return call

        for op in ("hold", "requeue", "update"):
            result = as_user(GUEST, NOGROUP, others(op, owners_job))
            text = result.get("message") or str(result.get("ok"))
            assert "permission denied" in text, (op, result)
        for op in ("release", "update"):
            result = as_user(OTHER_GUEST, NOGROUP, others(op, guest_job))
            text = result.get("message") or str(result.get("ok"))
            assert "permission denied" in text, (op, result)
        assert owner.update(guest_job, urgency=3) == {"urgency": 3}     # the instance owner may
        assert as_user(OTHER_GUEST, NOGROUP, lambda: Client(uri).attempts(guest_job))["error"] == "permission"
        assert as_user(GUEST, NOGROUP, lambda: Client(uri).attempts(guest_job))["ok"] == []
        assert as_user(GUEST, NOGROUP, lambda: Client(uri).release([guest_job]))["ok"] == [[guest_job], {}]
        owner.cancel([owners_job, guest_job])
        assert wait_for(owner, own_dep["ok"])["status"] == 0
