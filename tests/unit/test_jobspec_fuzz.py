"""Fuzzing the jobspec parser (issue 10): any map a client can send, however huge, nested or NUL-laden, is
either a jobspec or an InvalidJobspec with a short message; nothing else escapes `from_wire`."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings

from minicluster.model import jobspec as jobspec_model
from tests.unit.jobspecgen import FIELD_NAMES, SPEC, VALUE, nested

QUICK = settings(max_examples=100, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def checked(wire: Any) -> str | None:
    """None if accepted; the message if refused. Any other exception fails the test."""
    try:
        jobspec_model.from_wire(wire)
    except jobspec_model.InvalidJobspec as exc:
        message = str(exc)
        assert message and len(message) <= jobspec_model.MAX_MESSAGE + 20, message[:200]
        return message
    return None


@QUICK
@given(SPEC)
def test_any_spec_is_accepted_or_refused_clearly(wire: dict[str, Any]) -> None:
    checked(wire)


@QUICK
@given(FIELD_NAMES, VALUE)
@example("array", "0-" + str(10**30))  # was an OverflowError from len(range)
@example("stdin", "0-" + "9" * 5000)
def test_one_bad_field_in_a_good_spec(name: str, value: Any) -> None:
    checked({"argv": ["true"], "env": {"PATH": "/bin"}, name: value})


@pytest.mark.parametrize("name", ["resources", "dependencies", "on_exit", "requires", "env", "argv"])
def test_values_nested_as_deep_as_msgpack_carries_are_refused(name: str) -> None:
    # msgpack's packer stops at 512 levels; hypothesis cannot print examples this deep, hence no @example.
    assert checked({"argv": ["true"], name: nested(500)})
