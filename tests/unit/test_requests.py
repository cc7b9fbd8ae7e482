"""Typed client requests (minicluster/proto/requests.py): checked once, with the replies of protocol.md §3.2."""
from __future__ import annotations

import importlib
from typing import Any

import pytest

from broker.api.ops import OPS
from minicluster.proto import requests
from minicluster.proto.envelope import BadMessage

ENVELOPE = {"v": 1, "id": 3, "op": "x"}


def test_every_operation_of_the_protocol_has_its_request_class() -> None:
    for module in ("broker.api.flowops", "broker.api.shareops"):  # they register their operations with broker.api.ops
        importlib.import_module(module)
    # protocol.md §3.3, the operations table.
    assert set(OPS) == {
        "hello", "submit", "submit-many", "jobs", "job", "cancel", "eventlog", "output", "wait", "task-results",
        "stdin", "attempts", "hold", "release", "update", "requeue", "resources", "status", "drain", "undrain",
        "shutdown", "queues", "queue-control", "banks", "bank-add", "bank-remove", "usage", "job-usage"}
    assert all(issubclass(cls, requests.Request) for _, cls in OPS.values())


@pytest.mark.parametrize(("cls", "body", "expected"), [
    (requests.Jobs, {}, requests.Jobs(False, None, 1000, False, False)),
    (requests.Jobs, {"all": True, "ids": [1, "x"], "limit": 5}, requests.Jobs(True, [1, "x"], 5)),
    (requests.Jobs, {"all": True, "before": 7}, requests.Jobs(True, before=7)),
    (requests.Eventlog, {"job": 4, "from": 2, "follow": True}, requests.Eventlog(4, 2, True)),
    (requests.Attempts, {"job": 4, "index": 0}, requests.Attempts(4, 0, 0, 10_000, False)),
    (requests.Update, {"job": 4, "urgency": 20, "name": "n"}, requests.Update(4, {"urgency": 20, "name": "n"})),
    (requests.Usage, {"user": None, "since": 5}, requests.Usage(None, None, 5.0, None, False)),
    (requests.BankAdd, {"bank": "b", "user": "alice"}, requests.BankAdd("b", "alice")),
    (requests.Empty, {"anything": 1}, requests.Empty()),
])
def test_valid_requests_decode(cls: type[requests.Request], body: dict[str, Any],
                               expected: requests.Request) -> None:
    assert requests.decode(cls, {**ENVELOPE, **body}) == expected


@pytest.mark.parametrize(("cls", "body", "says"), [
    (requests.OneJob, {}, "missing field 'job'"),
    (requests.OneJob, {"job": "1"}, "field 'job' has the wrong type"),
    (requests.OneJob, {"job": True}, "field 'job' has the wrong type"),
    (requests.OneJob, {"job": 1 << 63}, "field 'job' is out of range (a signed 64-bit integer)"),
    (requests.ManyJobs, {"jobs": "1"}, "field 'jobs' has the wrong type"),
    (requests.Jobs, {"ids": None}, "field 'ids' has the wrong type"),  # a nil is not an absent field (§3.2)
    (requests.Output, {"job": 1, "index": -(1 << 63) - 1}, "field 'index' is out of range (a signed 64-bit integer)"),
    (requests.Stdin, {"job": 1, "data": "text"}, "field 'data' has the wrong type"),
    (requests.Submit, {"jobspec": []}, "field 'jobspec' has the wrong type"),
    (requests.QueueControl, {}, "missing field 'action'"),
    (requests.Usage, {"since": "now"}, "field 'since' has the wrong type"),
])
def test_bad_requests_are_refused_naming_the_field(cls: type[requests.Request], body: dict[str, Any],
                                                   says: str) -> None:
    with pytest.raises(BadMessage) as refused:
        requests.decode(cls, {**ENVELOPE, **body})
    assert (refused.value.code, str(refused.value)) == ("bad-request", says)
