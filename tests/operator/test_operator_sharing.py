"""spec.queues of a MiniCluster: the CRD schema takes it, the ConfigMap carries it in the broker's own form, bad
queues are reported, and the broker's per-queue counts reach the CR status.  Pure: no API server."""
from __future__ import annotations

import tomllib
from typing import Any

import jsonschema
import pytest

from minicluster.config import from_mapping
from minicluster.operator import manifests
from minicluster.operator.spec import MiniCluster, problems
from minicluster.operator.status import Observed, derive

QUEUES = {
    "batch": {"defaultTimeLimit": "1h", "maxTimeLimit": 86400, "userLimits": {"runningJobs": 10, "cores": 64}},
    "debug": {"priority": 100, "requires": ["zone=a"], "limits": {"queuedJobs": 500}},
    "scav": {"preemptible": True, "preemptMode": "cancel"},
}


def test_spec_queues_validate_and_become_the_brokers_queues(make_body: Any, cr_schema: dict[str, Any]) -> None:
    body = make_body(queues=QUEUES, defaultQueue="debug")
    jsonschema.validate(body, cr_schema)
    assert problems(body) == []
    cm = manifests.config_map(MiniCluster.from_body(body))
    sharing = from_mapping(tomllib.loads(cm["data"]["config.toml"])).sharing
    assert sharing.default_queue == "debug"
    batch, debug, scav = (sharing.queue(n) for n in ("batch", "debug", "scav"))
    assert (batch.default_time_limit, batch.max_time_limit) == (3600.0, 86400.0)
    assert (batch.user_limits.running_jobs, batch.user_limits.cores) == (10, 64)
    assert debug.priority == 100 and debug.requires == ("zone=a",) and debug.limits.queued_jobs == 500
    assert scav.preemptible and scav.preempt_mode == "cancel"


@pytest.mark.parametrize("queues, where", [
    ({"a": {"priority": -1}}, "priority"),
    ({"a": {"preemptMode": "kill"}}, "preemptMode"),
    ({"a": {"limits": {"cores": -4}}}, "cores"),
])
def test_schema_refuses_bad_queues(make_body: Any, cr_schema: dict[str, Any], queues: dict, where: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(make_body(queues=queues), cr_schema)
    assert where in "/".join(str(p) for p in refused.value.absolute_path)


def test_what_only_the_broker_knows_is_a_problem_named_by_key(make_body: Any) -> None:
    found = problems(make_body(queues={"a": {"maxTimeLimit": "forever"}}))
    assert found == ["spec: queues.a.max_time_limit: 'forever' is not a duration (seconds, or 90s/30m/2h/7d)"]
    assert "default_queue: 'nope' is not a queue" in problems(make_body(queues=QUEUES, defaultQueue="nope"))[0]


def test_status_has_per_queue_counts_and_state(body: dict[str, Any]) -> None:
    broker = {"ready": True, "ranks": {"up": 4, "expected": 4}, "jobs": {"queued": 3, "running": 2},
              "queues": {"batch": {"pending": 3, "running": 2, "cores": 2, "gpus": 0, "enabled": True,
                                   "started": True},
                         "debug": {"pending": 0, "running": 0, "cores": 0, "gpus": 0, "enabled": True,
                                   "started": False}}}
    fields = derive(MiniCluster.from_body(body), {}, Observed({"status": {}}, broker), "2026-01-01T00:00:00Z")
    assert fields["queues"] == {"batch": {"pending": 3, "running": 2, "state": "enabled,started"},
                                "debug": {"pending": 0, "running": 0, "state": "enabled,stopped"}}
