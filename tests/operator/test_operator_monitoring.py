"""Tier (a), the monitoring artefacts (docs/operator.md#monitoring): the Grafana dashboard's ConfigMap and the
PodMonitors, rendered by kubectl's kustomize; the brokers' PodMonitor scrapes exactly rank 0's pod of the Jobs the
operator renders, on the port those pods name."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from minicluster.operator import manifests
from minicluster.operator.spec import MiniCluster

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
# Kubernetes' annotation of an Indexed Job's pods (every version with Indexed Jobs).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar() -> None:
    [configmap] = kustomize(REPO / "deploy" / "grafana")
    assert configmap["kind"] == "ConfigMap" and "namespace" not in configmap["metadata"]  # the sidecar's, by -n
    assert configmap["metadata"]["name"] == "minicluster-dashboard"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(key, text)] = configmap["data"].items()
    assert key.endswith(".json") and text == (REPO / "deploy" / "grafana" / "minicluster-dashboard.json").read_text()
    board = json.loads(text)
    targets = [t for p in board["panels"] for t in p.get("targets", ())]
    assert targets and all(t["datasource"]["uid"] == "${datasource}" for t in targets)


def _meta(name: str) -> str:
    """Prometheus' service-discovery name of a Kubernetes label or annotation: every other character an `_`."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _kept(relabelings: list[dict[str, Any]], labels: dict[str, str], annotations: dict[str, str]) -> bool:
    """Prometheus' `keep` relabelings over a pod's discovered labels (a missing one reads as empty)."""
    meta = {f"__meta_kubernetes_pod_label_{_meta(k)}": v for k, v in labels.items()}
    meta |= {f"__meta_kubernetes_pod_annotation_{_meta(k)}": v for k, v in annotations.items()}
    for rule in relabelings:
        if rule.get("action") == "keep":
            joined = rule.get("separator", ";").join(meta.get(s, "") for s in rule["sourceLabels"])
            if not re.fullmatch(rule["regex"], joined):
                return False
    return True


@pytest.mark.parametrize("storage", [False, True])
def test_the_brokers_podmonitor_scrapes_rank_0_on_its_status_port(make_body: Any, storage: bool) -> None:
    docs = kustomize(REPO / "deploy" / "monitoring")
    assert {d["apiVersion"] for d in docs} == {"monitoring.coreos.com/v1"}
    [brokers] = [d for d in docs if d["metadata"]["name"] == "minicluster-brokers"]
    [endpoint] = brokers["spec"]["podMetricsEndpoints"]
    body = make_body(size=3, **({"storage": {"size": "1Gi"}} if storage else {}))
    mc = MiniCluster.from_body(body)
    for job in manifests.jobs(mc):
        template = job["spec"]["template"]
        labels = template["metadata"]["labels"]
        [expression] = brokers["spec"]["selector"]["matchExpressions"]
        assert expression["operator"] == "Exists" and expression["key"] in labels
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", ())}
        assert endpoint["port"] in ports
        indexed = job["spec"].get("completionMode") == "Indexed"
        for index in range(job["spec"]["completions"]):
            # An Indexed Job's index is the rank; rank 0's own Job (with storage) is not Indexed.
            annotations = {COMPLETION_INDEX: str(index)} if indexed else {}
            rank = index if indexed else 0
            # With storage, index 0 of the workers' Job exits at once; the Prometheus Operator drops finished pods.
            if not (storage and indexed and index == 0):
                assert _kept(endpoint["relabelings"], labels, annotations) == (rank == 0), (job["metadata"], index)


def test_the_operators_podmonitor_names_its_metrics_port() -> None:
    monitors = kustomize(REPO / "deploy" / "monitoring")
    [monitor] = [d for d in monitors if d["metadata"]["name"] == "minicluster-operator"]
    [deployment] = [d for d in kustomize(REPO / "deploy") if d["kind"] == "Deployment"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    pod = deployment["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", ())}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env", ())}
    assert str(ports[endpoint["port"]]) == env["MC_OPERATOR_METRICS_PORT"]
