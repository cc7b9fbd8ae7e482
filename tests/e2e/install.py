"""docs/operator.md#install, as written: `kubectl apply -k deploy/`, and the operator then runs as the
Deployment's pod on the emulated node (Deployment -> ReplicaSet -> Pod by the real controller-manager).

kubectl is not part of the test tier, so `kustomize` is played here for what deploy/kustomization.yaml uses:
`resources` (files, and directories with a kustomization.yaml of their own), `bases` (such directories, after the
resources: the ClusterRoleBinding is there before the operator's pod), `namespace` (set on every
namespaced object) and `images` (name -> newName:newTag); anything else in it fails the tier.  The objects are
created in the rendered order; the Deployment waits for the token controller to mint the ServiceAccount's token
Secret first (kubectl applies at once and the ReplicaSet controller retries the pod until the ServiceAccount
admission plugin finds the token: same end, slower).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from minicluster.operator.kube import Kube
from tests.e2e.polling import until
from tests.operator.k8s_control_plane import collection_path, operator_token

KNOWN = {"apiVersion", "kind", "resources", "bases", "namespace", "images"}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
NAMESPACE = "minicluster-system"
SELECTOR = "app.kubernetes.io/name=minicluster-operator"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIRECTORY` for the fields deploy/ uses."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN
    assert not unknown, f"{directory}/kustomization.yaml: {sorted(unknown)} not played by tests/e2e/install.py"
    docs: list[dict[str, Any]] = []
    for resource in [*(spec.get("resources") or []), *(spec.get("bases") or [])]:
        path = (directory / resource).resolve()
        docs += kustomize(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if spec.get("namespace") and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = spec["namespace"]
        for container in _containers(doc):
            for image in spec.get("images") or []:
                if container["image"] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    return list(pod.get("containers") or [])


async def apply(kube: Kube, docs: list[dict[str, Any]]) -> str:
    """Create `docs`; the Deployment once the operator's token exists.  Returns that token."""
    token = None
    for doc in docs:
        if doc["kind"] == "Deployment" and token is None:
            token = await until(lambda: operator_token(kube, NAMESPACE), 60)
        await kube.create(collection_path(doc), doc)
    return token or await until(lambda: operator_token(kube, NAMESPACE), 60)


async def operator_pod(kube: Kube) -> dict[str, Any] | None:
    """The Deployment's running, ready pod, if there is one."""
    pods = (await kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}"))["items"]
    for pod in pods:
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        if ready and not pod["metadata"].get("deletionTimestamp"):
            return pod
    return None

