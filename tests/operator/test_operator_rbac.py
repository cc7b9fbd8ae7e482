"""Tier (c): least privilege on a real kube-apiserver 1.20 with RBAC (docs/operator.md#who-may-do-what).

The namespaced install of deploy/namespaced/ as it is written: its RoleBindings, the operator's ClusterRole
they bind, and the operator run for the namespaces its Deployment names, logged in with its ServiceAccount's
token and nothing else. The aggregated user roles through Kubernetes' own view and edit roles (the
controller-manager's aggregation controller fills them in), and each MiniCluster's NetworkPolicy as the API
server stores it and the garbage collector removes it.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from k8s_control_plane import (ADMIN_TOKEN, Cluster, collection_path, crd_established,
                               operator_token)
from minicluster.operator import operate
from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.status import HttpStatusFetcher
from test_operator_apiserver import login_as, until

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MC_PATH = "/apis/minicluster.dev/v1alpha1/namespaces/{ns}/miniclusters"
OTHER = "elsewhere"


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def operator_objects() -> list[dict[str, Any]]:
    """deploy/operator/ as kustomize renders it (its `namespace` on every namespaced object), but the Deployment:
    this tier has no node, the test runs the operator itself."""
    kustomization = yaml.safe_load((DEPLOY / "operator" / "kustomization.yaml").read_text())
    docs = [doc for name in kustomization["resources"] for doc in load(DEPLOY / "operator" / name)]
    for doc in docs:
        if doc["kind"] in ("ServiceAccount", "Deployment"):
            doc["metadata"]["namespace"] = kustomization["namespace"]
    return [doc for doc in docs if doc["kind"] != "Deployment"]


def watched() -> list[str]:
    """The namespaces deploy/namespaced/ has the operator watch (its Deployment patch)."""
    [patch] = load(DEPLOY / "namespaced" / "operator-namespaces.yaml")
    [env] = [e for c in patch["spec"]["template"]["spec"]["containers"] for e in c["env"]
             if e["name"] == "MC_OPERATOR_NAMESPACES"]
    return env["value"].split(",")


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service_account(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}


def role_binding(name: str, ns: str, role: str, account: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]}


async def account_token(kube: Kube, ns: str, name: str) -> str:
    async def minted() -> str | None:
        sa = await kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}") or {}
        for ref in sa.get("secrets") or []:
            secret = await kube.get(f"/api/v1/namespaces/{ns}/secrets/{ref['name']}") or {}
            if "token" in secret.get("data", {}):
                return base64.b64decode(secret["data"]["token"]).decode()
        return None
    return str(await until(minted))


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    """deploy/namespaced/ installed (no ClusterRoleBinding), the namespaces it names and one it does not, and
    users as ServiceAccounts: `editor` bound to Kubernetes' edit role, `viewer` to view, `mc-editor` to
    minicluster-edit alone. Returns each one's token."""
    async def install() -> dict[str, str]:
        kube = Kube(login_as(cluster, ADMIN_TOKEN))
        try:
            docs = [yaml.safe_load((REPO / "crds" / "minicluster.yaml").read_text()), *operator_objects()]
            docs += [namespace(ns) for ns in (*watched(), OTHER)]
            docs += load(DEPLOY / "namespaced" / "rolebindings.yaml")
            team = watched()[0]
            for account, role in (("editor", "edit"), ("viewer", "view"), ("mc-editor", "minicluster-edit")):
                docs += [service_account(account, team), role_binding(account, team, role, account)]
            for doc in docs:
                await kube.create(collection_path(doc), doc)
            await until(lambda: crd_established(kube))
            found = {"operator": str(await until(lambda: operator_token(kube)))}
            for account in ("editor", "viewer", "mc-editor"):
                found[account] = await account_token(kube, team, account)
            return found
        finally:
            await kube.close()
    return asyncio.run(install())


@contextlib.contextmanager
def namespaced_operator(cluster: Cluster, token: str) -> Iterator[None]:
    """The operator as deploy/namespaced/ runs it: the namespaces its Deployment names, its own token."""
    stop, ready = threading.Event(), threading.Event()

    async def main() -> None:
        fetcher = HttpStatusFetcher(lambda mc: "http://127.0.0.1:9/status")  # no broker: BrokerUnreachable
        try:
            await operate(watched(), login=login_as(cluster, token), fetch_status=fetcher, poll_interval=0.5,
                          registry=kopf.OperatorRegistry(), metrics_port=None, stop_flag=stop, ready_flag=ready,
                          check_jobs=False)
        finally:
            await fetcher.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="kopf-namespaced", daemon=True)
    thread.start()
    assert ready.wait(30)
    yield
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), "the namespaced operator did not stop in 30 s"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tokens: dict[str, str]) -> Iterator[None]:
    with namespaced_operator(cluster, tokens["operator"]):
        yield


@pytest.fixture
async def admin(cluster: Cluster, tokens: dict[str, str]) -> AsyncIterator[Kube]:
    kube = Kube(login_as(cluster, ADMIN_TOKEN))
    yield kube
    await kube.close()


@contextlib.asynccontextmanager
async def user(cluster: Cluster, token: str) -> AsyncIterator[Kube]:
    kube = Kube(login_as(cluster, token))
    try:
        yield kube
    finally:
        await kube.close()


async def status_of(kube: Kube, method: str, path: str, body: Any = None) -> int:
    try:
        await kube.request(method, path, body)
    except ApiError as exc:
        return exc.status
    return 200


def body(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster", "metadata": {"name": name},
            "spec": {"size": 2, "maxSize": 4, "image": "example.org/minicluster:0.1.0", **spec}}


async def test_the_namespaced_operator_holds_rights_only_in_its_namespaces(
        cluster: Cluster, tokens: dict[str, str]) -> None:
    team = watched()[0]
    async with user(cluster, tokens["operator"]) as kube:
        # What it does, in the namespace it watches: read and create children, read Secrets (the CURVE key).
        for path in (f"/api/v1/namespaces/{team}/secrets/x", f"/apis/batch/v1/namespaces/{team}/jobs/x",
                     f"/apis/networking.k8s.io/v1/namespaces/{team}/networkpolicies/x"):
            assert await status_of(kube, "GET", path) == 404, path
        assert await status_of(kube, "GET", f"{MC_PATH.format(ns=team)}?watch=false") == 200
        # Nothing cluster-wide, nothing in another namespace, no Secrets anywhere else.
        for path in ("/api/v1/secrets", f"/api/v1/namespaces/{OTHER}/secrets",
                     f"/api/v1/namespaces/{OTHER}/secrets/x",
                     "/api/v1/namespaces", "/api/v1/nodes", "/api/v1/pods",
                     "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     "/apis/minicluster.dev/v1alpha1/miniclusters", MC_PATH.format(ns=OTHER),
                     f"/apis/batch/v1/namespaces/{OTHER}/jobs"):
            assert await status_of(kube, "GET", path) == 403, path
        for method, path in (("DELETE", f"/api/v1/namespaces/{team}/pods/x"),
                             ("POST", f"/api/v1/namespaces/{team}/pods"),
                             ("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{team}/networkpolicies/x")):
            assert await status_of(kube, method, path, {}) == 403, (method, path)


async def test_the_namespaced_operator_runs_on_those_rights_alone(operator: None, admin: Kube) -> None:
    team = watched()[0]
    await admin.create(MC_PATH.format(ns=team), body("scoped"))
    await admin.create(MC_PATH.format(ns=OTHER), body("unwatched"))

    async def reported() -> Any:
        mc = await admin.get(f"{MC_PATH.format(ns=team)}/scoped") or {}
        return (mc.get("status") or {}).get("phase")
    assert await until(reported)
    for path in (f"/apis/batch/v1/namespaces/{team}/jobs/scoped", f"/api/v1/namespaces/{team}/secrets/scoped-curve",
                 f"/apis/networking.k8s.io/v1/namespaces/{team}/networkpolicies/scoped"):
        assert await admin.get(path) is not None, path
    assert await admin.get(f"/apis/batch/v1/namespaces/{OTHER}/jobs/unwatched") is None
    assert "status" not in (await admin.get(f"{MC_PATH.format(ns=OTHER)}/unwatched") or {})


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


async def test_the_network_policy_admits_the_pods_and_the_operator_and_goes_with_the_minicluster(
        operator: None, admin: Kube) -> None:
    team = watched()[0]
    await admin.create(MC_PATH.format(ns=team), body("fenced"))
    await admin.create(MC_PATH.format(ns=team), body("open", networkPolicy=False))
    policy_path = f"/apis/networking.k8s.io/v1/namespaces/{team}/networkpolicies/fenced"
    policy = await until(lambda: admin.get(policy_path))
    assert policy["metadata"]["ownerReferences"][0]["name"] == "fenced"
    job = await until(lambda: admin.get(f"/apis/batch/v1/namespaces/{team}/jobs/fenced"))
    pods = job["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert _matches(spec["podSelector"], pods) and spec["policyTypes"] == ["Ingress"]
    [peers, operator_rule] = spec["ingress"]
    # The ranks reach each other on every port (the overlay's 8050 and their MPI's own).
    assert "ports" not in peers and [_matches(p["podSelector"], pods) for p in peers["from"]] == [True]
    # The status port 8051 only from the operator's pods (deploy/operator/: its pod's and namespace's labels).
    assert operator_rule["ports"] == [{"protocol": "TCP", "port": 8051}]
    [deployment] = load(DEPLOY / "operator" / "deployment.yaml")
    [operator_namespace] = load(DEPLOY / "operator" / "namespace.yaml")
    [source] = operator_rule["from"]
    assert _matches(source["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert _matches(source["namespaceSelector"], operator_namespace["metadata"]["labels"])
    assert not _matches(source["podSelector"], pods)
    # Switched off: no policy; the Job is there, so the operator got that far.
    await until(lambda: admin.get(f"/apis/batch/v1/namespaces/{team}/jobs/open"))
    assert await admin.get(f"/apis/networking.k8s.io/v1/namespaces/{team}/networkpolicies/open") is None

    await admin.request("DELETE", f"{MC_PATH.format(ns=team)}/fenced")

    async def collected() -> bool:
        return await admin.get(policy_path) is None
    await until(collected, timeout=60)


async def access(kube: Kube, ns: str, resource: str, verb: str, group: str = "", subresource: str = "") -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"namespace": ns, "group": group, "resource": resource,
                                              "subresource": subresource, "verb": verb}}}
    answer = await kube.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


async def test_the_aggregated_roles_give_users_the_minicluster_verbs(
        cluster: Cluster, tokens: dict[str, str]) -> None:
    team = watched()[0]
    mc = "minicluster.dev"
    async with user(cluster, tokens["editor"]) as editor:
        # Kubernetes' edit role, filled in by the aggregation controller: create, scale, delete.
        async def aggregated() -> bool:
            return await access(editor, team, "miniclusters", "create", mc)
        await until(aggregated)
        await editor.create(MC_PATH.format(ns=team), body("made-by-editor"))
        await editor.request("PATCH", f"{MC_PATH.format(ns=team)}/made-by-editor/scale", {"spec": {"replicas": 3}},
                             "application/merge-patch+json")
        assert await access(editor, team, "miniclusters", "delete", mc)
        assert not await access(editor, OTHER, "miniclusters", "create", mc)
    async with user(cluster, tokens["viewer"]) as viewer:
        assert (await viewer.get(f"{MC_PATH.format(ns=team)}/made-by-editor"))["spec"]["size"] == 3
        assert await status_of(viewer, "POST", MC_PATH.format(ns=team), body("made-by-viewer")) == 403
        assert not await access(viewer, team, "miniclusters", "update", mc, "scale")
    async with user(cluster, tokens["mc-editor"]) as mc_editor:
        # minicluster-edit alone: MiniClusters, and what `kubectl mc` and `kubectl logs` need; no Secrets.
        assert await access(mc_editor, team, "miniclusters", "create", mc)
        assert await access(mc_editor, team, "miniclusters", "patch", mc, "scale")
        assert await access(mc_editor, team, "pods", "list")
        assert await access(mc_editor, team, "pods", "create", subresource="exec")
        assert await access(mc_editor, team, "pods", "get", subresource="log")
        assert not await access(mc_editor, team, "secrets", "get")
        assert not await access(mc_editor, team, "pods", "create")
