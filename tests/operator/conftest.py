"""Shared fixtures of the operator tests (all three tiers)."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_control_plane import Cluster, binaries_or_skip

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real kube-apiserver, etcd and kube-controller-manager for one module of tier c (skips without them)."""
    control_plane = Cluster(tmp_path_factory.mktemp("k8s"), binaries_or_skip())
    control_plane.start()
    yield control_plane
    control_plane.stop()
