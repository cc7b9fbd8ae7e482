"""The MiniCluster's NetworkPolicy: who may open connections to its pods (pure rendering, like manifests.py).

The overlay is CURVE-encrypted and authenticated already; the policy narrows who can reach it at all. The pods
admit each other on every port (the overlay on 8050, and whatever their MPI opens between ranks), and the
operator's pods on the broker's status port 8051 (GET /status and /metrics, which the operator polls); nothing
else. The operator's pods are named by label in namespaces labelled as deploy/'s minicluster-system is: a
namespace label, not its name, because Kubernetes before 1.21 sets no `kubernetes.io/metadata.name` label.
"""
from __future__ import annotations

from typing import Any

from minicluster.operator import manifests
from minicluster.operator.spec import NAME_LABEL, STATUS_PORT, MiniCluster

# deploy/operator/: the operator's pods, and the namespace it runs in, carry this label.
OPERATOR_LABELS = {"app.kubernetes.io/name": "minicluster-operator"}


def policy(mc: MiniCluster) -> dict[str, Any]:
    own_pods = {"podSelector": {"matchLabels": {NAME_LABEL: mc.name}}}
    operator = {"namespaceSelector": {"matchLabels": dict(OPERATOR_LABELS)},
                "podSelector": {"matchLabels": dict(OPERATOR_LABELS)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": mc.name,
            "namespace": mc.namespace,
            "labels": manifests.labels(mc),
            "ownerReferences": [manifests.owner_reference(mc)],
        },
        "spec": {
            "podSelector": {"matchLabels": {NAME_LABEL: mc.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [own_pods]},
                {"from": [operator], "ports": [{"protocol": "TCP", "port": STATUS_PORT}]},
            ],
        },
    }
