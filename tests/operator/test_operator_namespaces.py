"""Tier (a): which namespaces the operator watches, and what kopf is told (the RBAC side: test_operator_rbac.py)."""
from __future__ import annotations

import subprocess
import sys

import kopf
import pytest

from minicluster.operator.runner import configure, watched_namespaces


def test_namespaces_come_as_a_name_a_list_or_a_comma_separated_list() -> None:
    assert watched_namespaces("team-a, team-b,team-a") == ["team-a", "team-b"]
    assert watched_namespaces(["team-a"]) == ["team-a"]
    assert watched_namespaces(None) == watched_namespaces("") == []  # every namespace


@pytest.mark.parametrize("name", ["Team-A", "team_a", "team-*", "-a", "a" * 64])
def test_a_name_that_is_no_namespace_is_refused(name: str) -> None:
    # A glob would have kopf list every namespace, which the namespaced install does not grant.
    with pytest.raises(ValueError, match="is not a namespace name"):
        watched_namespaces(name)


def test_restricted_to_namespaces_kopf_scans_nothing_cluster_wide() -> None:
    settings = kopf.OperatorSettings()
    configure(settings, namespaced=True)
    assert settings.scanning.disabled
    configure(settings, namespaced=False)
    assert not settings.scanning.disabled  # cluster-wide it follows CRDs as they come and go


@pytest.mark.slow  # a Python process that imports kopf
def test_the_entry_point_refuses_a_bad_namespace_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "minicluster.operator", "-n", "team-a", "-n", "Team_B"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("namespace 'Team_B' is not a namespace name "
                                                          "(lowercase letters, digits and '-')")
