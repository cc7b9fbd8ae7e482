"""Shared fixtures of the operator tests (all three tiers)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "minicluster.yaml"


def minicluster_body(name: str = "demo", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A MiniCluster as the API server would hand it to the operator."""
    return {
        "apiVersion": "minicluster.dev/v1alpha1",
        "kind": "MiniCluster",
        "metadata": {
            "name": name, "namespace": namespace, "uid": f"uid-{name}",
            "resourceVersion": "1", "generation": 1,
        },
        "spec": {"size": 4, "maxSize": 8, "image": "ghcr.io/example/minicluster:0.1.0", **spec},
    }


@pytest.fixture
def make_body() -> Any:
    return minicluster_body


@pytest.fixture
def body() -> dict[str, Any]:
    return minicluster_body()


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture
def cr_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
