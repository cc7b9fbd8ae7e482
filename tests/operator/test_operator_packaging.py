"""Tier (a), static artefacts: the CRD's schema, deploy/, images/, examples/."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from minicluster.operator.spec import TEMPLATE_FIELDS, problems

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = kubernetes_validate.latest_version()
EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if p.is_dir())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_crd_is_a_valid_crd(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def _walk(schema: dict[str, Any], path: str = "") -> list[str]:
    """Schema nodes without a type: structural schemas forbid them."""
    bad = []
    if not ({"type", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"} & set(schema)):
        bad.append(path or "/")
    for name, sub in (schema.get("properties") or {}).items():
        bad += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        bad += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        bad += _walk(schema["additionalProperties"], f"{path}{{}}")
    return bad


def test_crd_schema_is_structural(cr_schema: dict[str, Any]) -> None:
    assert _walk(cr_schema) == []


def _rules(schema: dict[str, Any]) -> list[str]:
    return [v["rule"] for v in schema.get("x-kubernetes-validations") or []]


def test_what_shapes_the_pods_cannot_change_at_the_api_server(cr_schema: dict[str, Any]) -> None:
    # CEL transition rules (Kubernetes 1.25+; not executed here: the API server tier runs 1.20, which ignores
    # them, and no CEL evaluator is installed). Where they are ignored the operator's spec hash reports the
    # same fields TemplateImmutable (test_operator_manifests).
    spec = cr_schema["properties"]["spec"]
    for field in TEMPLATE_FIELDS:
        assert "self == oldSelf" in _rules(spec["properties"][field]), field
        assert f"has(self.{field}) == has(oldSelf.{field})" in " ".join(_rules(spec)), field
    # A MiniCluster made without maxSize has a fixed size: `kubectl scale` is refused, not left to the operator.
    assert "self.size == oldSelf.size || (has(self.maxSize) && has(oldSelf.maxSize))" in _rules(spec)
    # Under Kueue: the size it admitted, one Job (no storage), a priority class only with a queue, never changed.
    assert "self.size == oldSelf.size || !has(oldSelf.queueName) || oldSelf.queueName == ''" in _rules(spec)
    assert "!has(self.queueName) || self.queueName == '' || !has(self.storage)" in _rules(spec)
    assert "self == oldSelf" in _rules(spec["properties"]["queuePriorityClass"])
    assert "self == oldSelf" in _rules(spec["properties"]["minSize"])
    assert any(rule.startswith("!has(self.minSize) || (has(self.queueName)") for rule in _rules(spec))


def test_scale_and_printer_paths_exist_in_the_schema(crd: dict[str, Any], cr_schema: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    scale = version["subresources"]["scale"]
    assert (scale["specReplicasPath"], scale["statusReplicasPath"], scale["labelSelectorPath"]) == (
        ".spec.size", ".status.size", ".status.selector")
    for column in version["additionalPrinterColumns"]:
        top, field = re.match(r"\.(\w+)\.(\w+)", column["jsonPath"]).groups()  # type: ignore[union-attr]
        assert top == "metadata" or field in cr_schema["properties"][top]["properties"], column
    assert set(crd["spec"]["names"]["shortNames"]) == {"mc", "minic"}


def test_good_minicluster_is_accepted(cr_schema: dict[str, Any], body: dict[str, Any]) -> None:
    jsonschema.validate(body, cr_schema)


@pytest.mark.parametrize("spec, where", [
    ({"size": 0}, "size"),
    ({"size": 10001}, "size"),
    ({"maxSize": 0}, "maxSize"),
    ({"policy": "random"}, "policy"),
    ({"image": ""}, "image"),
    ({"logging": {"level": "loud"}}, "level"),
    ({"fanout": 0}, "fanout"),
    ({"command": "echo hi"}, "command"),
    ({"env": [{"value": "no name"}]}, "env"),
    ({"queueName": "team a"}, "queueName"),
    ({"queueName": "team-a", "queuePriorityClass": "High"}, "queuePriorityClass"),
    ({"queueName": "team-a", "minSize": 0}, "minSize"),
    ({"storage": {"size": "0"}}, "size"),
    ({"storage": {"size": "0.0Gi"}}, "size"),
])
def test_bad_minicluster_is_refused(cr_schema: dict[str, Any], make_body: Any,
                                    spec: dict[str, Any], where: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(make_body(**spec), cr_schema)
    assert where in "/".join(str(p) for p in refused.value.absolute_path) or where in refused.value.message


def test_cel_rules_match_the_operators_own_checks(cr_schema: dict[str, Any], make_body: Any) -> None:
    # The same rule is enforced twice: by CEL on >= 1.25 and by the operator
    # everywhere, so they must agree.
    rules = [r["rule"] for r in cr_schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert rules[0] == "!has(self.maxSize) || self.size <= self.maxSize"
    assert problems(make_body(size=9, maxSize=8)) and not problems(make_body(size=8, maxSize=8))
    # The transition rule on size: a MiniCluster made without maxSize keeps its size (status.maxSize records it).
    scaled = {**make_body(size=5, maxSize=None), "status": {"maxSize": 4}}
    del scaled["spec"]["maxSize"]
    assert "self.size == oldSelf.size || (has(self.maxSize) && has(oldSelf.maxSize))" in rules and problems(scaled)
    name_rule = cr_schema["x-kubernetes-validations"][0]["rule"]
    assert "<= 50" in name_rule and problems(make_body(name="x" * 51))


def kustomized_files(directory: Path) -> list[Path]:
    """The files a kustomization and its bases list (a directory is a base for kustomize v2.0.3)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files = [directory / resource for resource in kustomization.get("resources") or []]
    files += [directory / patch for patch in kustomization.get("patchesStrategicMerge") or []]
    return files + [f for base in kustomization.get("bases") or [] for f in kustomized_files(directory / base)]


INSTALLS = [REPO / "deploy", REPO / "deploy" / "namespaced"]


@pytest.mark.parametrize("install", INSTALLS, ids=["clusterwide", "namespaced"])
def test_deploy_objects_validate_strictly(install: Path) -> None:
    for path in kustomized_files(install):
        for doc in load_all(path):
            if path.name != "operator-namespaces.yaml":  # a patch, not a whole object
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("install", INSTALLS, ids=["clusterwide", "namespaced"])
def test_deploy_applies_with_the_kustomize_of_old_kubectl(install: Path) -> None:
    # kubectl up to 1.20 embeds kustomize v2.0.3: a resource must be a file inside the kustomization's own
    # directory ("'../crds' must be a file"), so deploy/ carries a copy of the CRD, which must not drift; a
    # directory is a base, and no base may contain the kustomization that names it (a cycle).
    for directory in {install, *(p.parent for p in kustomized_files(install))}:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for resource in kustomization.get("resources") or []:
            path = (directory / resource).resolve()
            assert path.is_file() and path.parent == directory.resolve(), f"{directory}/kustomization.yaml: {resource}"
        for base in kustomization.get("bases") or []:
            assert (directory / base).resolve() not in [directory.resolve(), *directory.resolve().parents]
    deploy = REPO / "deploy"
    assert "minicluster-crd.yaml" in yaml.safe_load((deploy / "kustomization.yaml").read_text())["resources"]
    assert (deploy / "minicluster-crd.yaml").read_bytes() == (REPO / "crds" / "minicluster.yaml").read_bytes(), (
        "deploy/minicluster-crd.yaml differs from crds/minicluster.yaml: cp crds/minicluster.yaml deploy/")


# The kubectl on PATH, and MC_KUBECTL if set (e.g. a kubectl 1.20 built from Debian's kubernetes source).
KUBECTLS = [k for k in (shutil.which("kubectl"), os.environ.get("MC_KUBECTL")) if k]
SHARED = ["ClusterRole", "ClusterRole", "ClusterRole", "CustomResourceDefinition", "Deployment", "Namespace",
          "ServiceAccount"]


def kustomize(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl on PATH and no MC_KUBECTL")
@pytest.mark.parametrize("kubectl", KUBECTLS)
def test_kubectl_renders_deploy(kubectl: str) -> None:
    docs = kustomize(kubectl, REPO / "deploy")
    assert sorted(doc["kind"] for doc in docs) == sorted([*SHARED, "ClusterRoleBinding"])
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    env = {e["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    assert "MC_OPERATOR_NAMESPACES" not in env


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl on PATH and no MC_KUBECTL")
@pytest.mark.parametrize("kubectl", KUBECTLS)
def test_kubectl_renders_the_namespaced_install(kubectl: str) -> None:
    docs = kustomize(kubectl, REPO / "deploy" / "namespaced")
    kinds = [doc["kind"] for doc in docs]
    assert sorted(k for k in kinds if k != "RoleBinding") == sorted(SHARED) and "RoleBinding" in kinds
    [deployment] = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "minicluster-system"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MC_OPERATOR_METRICS_PORT"] == "8080" and container["image"] == "ghcr.io/minicluster/operator:0.1.0"
    # The operator watches exactly the namespaces its rules are bound in, by the role deploy/ binds cluster-wide.
    bindings = [doc for doc in docs if doc["kind"] == "RoleBinding"]
    assert sorted(env["MC_OPERATOR_NAMESPACES"].split(",")) == sorted(b["metadata"]["namespace"] for b in bindings)
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": "minicluster-operator"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "minicluster-operator",
                                        "namespace": "minicluster-system"}]


def test_rbac_lists_exactly_what_the_operator_does() -> None:
    [role] = load_all(REPO / "deploy" / "operator" / "rbac.yaml")
    [binding] = load_all(REPO / "deploy" / "clusterwide.yaml")
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("minicluster.dev", "miniclusters"): {"get", "list", "watch", "patch"},
        ("minicluster.dev", "miniclusters/status"): {"patch"},
        ("minicluster.dev", "miniclusters/finalizers"): {"update"},
        ("", "secrets"): {"get", "create"},
        ("", "services"): {"get", "create"},
        ("networking.k8s.io", "networkpolicies"): {"get", "create"},
        ("", "configmaps"): {"get", "create", "patch"},
        ("", "persistentvolumeclaims"): {"get", "create"},
        ("batch", "jobs"): {"get", "list", "watch", "create", "patch"},
        ("kueue.x-k8s.io", "workloads"): {"list", "patch"},
        ("", "pods"): {"get", "list", "watch"},
        ("", "events"): {"create", "list"},
    }
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "minicluster-operator"


def test_user_roles_aggregate_into_kubernetes_own() -> None:
    roles = {doc["metadata"]["name"]: doc for doc in load_all(REPO / "deploy" / "operator" / "user-roles.yaml")}
    aggregate = "rbac.authorization.k8s.io/aggregate-to-{}"
    assert roles["minicluster-view"]["metadata"]["labels"][aggregate.format("view")] == "true"
    assert roles["minicluster-edit"]["metadata"]["labels"][aggregate.format("edit")] == "true"
    assert aggregate.format("view") not in roles["minicluster-edit"]["metadata"]["labels"]
    for role in roles.values():
        kubernetes_validate.validate(role, K8S_VERSION, strict=True)


def test_outside_cluster_rbac_adds_only_the_pod_proxy() -> None:
    # Not in the kustomization: only an operator run outside the cluster needs it (docs/operator.md).
    assert "outside-cluster.yaml" not in (REPO / "deploy" / "kustomization.yaml").read_text()
    [role, binding] = load_all(REPO / "deploy" / "outside-cluster.yaml")
    for doc in (role, binding):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]
    assert binding["subjects"][0]["name"] == "minicluster-operator"


@pytest.mark.parametrize("image", ["runtime", "operator"])
def test_dockerfiles_are_pinned_non_root_and_runnable(image: str) -> None:
    text = (REPO / "images" / image / "Dockerfile").read_text()
    [base] = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    [user] = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert not user.startswith(("root", "0:", "0"))
    for pin in re.findall(r"pip install ([^\n&\\]*)", text):  # up to a line's end, an &&, a continuation
        for requirement in pin.split():
            assert requirement.startswith("-") or re.fullmatch(r"'?\.(\[\w+\])?'?", requirement) or "==" in requirement
    entrypoint = yaml.safe_load(re.search(r"^ENTRYPOINT\s+(.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    if entrypoint[0] == "python":
        assert entrypoint[1] == "-m" and (REPO / Path(*entrypoint[2].split(".")) / "__main__.py").exists()
    else:
        assert entrypoint[0] in scripts


@pytest.mark.parametrize("image", ["runtime", "operator"])
def test_dockerfiles_copy_every_file_the_install_reads(image: str) -> None:
    """`pip install .` in the image builds from what was copied: the packages, and the plain scripts (mc-submit)."""
    text = (REPO / "images" / image / "Dockerfile").read_text()
    copied = {source for line in re.findall(r"^COPY\s+(.+)$", text, re.M) for source in line.split()[:-1]}
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = {"pyproject.toml", "minicluster", "broker", "worker"}
    needed |= {path.split("/")[0] for path in setuptools.get("script-files", [])}
    assert needed <= copied


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ]", d)[0] for d in requirements}


def test_operator_dependencies_are_an_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = _names(project["dependencies"])
    assert not names & {"kopf", "kubernetes", "aiohttp"}, "ranks and clients must not pull in the operator's"
    extras = project["optional-dependencies"]
    assert _names(extras["operator"]) == {"kopf", "aiohttp"}
    assert _names(extras["kubectl"]) == {"kubernetes"}
    assert "minicluster[operator,kubectl]" in extras["test"]
    assert "'.[operator]'" in (REPO / "images" / "operator" / "Dockerfile").read_text()
    assert "'.[operator]'" not in (REPO / "images" / "runtime" / "Dockerfile").read_text()


def _third_party_imports(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"minicluster", "broker", "worker"}


@pytest.mark.parametrize(("extra", "paths"), [
    ("operator", sorted((REPO / "minicluster" / "operator").glob("*.py"))),
    ("kubectl", [REPO / "minicluster" / "cli" / "kubectl.py"]),
])
def test_every_package_the_operator_and_the_plugin_import_is_declared(extra: str, paths: list[Path]) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"]) | _names(project["optional-dependencies"][extra])
    module_of = {"pyzmq": "zmq"}  # distribution name -> import name where they differ
    assert _third_party_imports(paths) <= {module_of.get(name, name) for name in declared}


def test_runtime_image_carries_mpi() -> None:
    text = (REPO / "images" / "runtime" / "Dockerfile").read_text()
    assert "mpich==" in text and "mpi4py==" in text


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_examples_have_a_readme_and_valid_miniclusters(example: Path, cr_schema: dict[str, Any]) -> None:
    assert (example / "README.md").read_text().startswith("# ")
    found = [doc for file in example.glob("*.yaml") for doc in load_all(file) if doc["kind"] == "MiniCluster"]
    assert found
    for doc in found:
        jsonschema.validate(doc, cr_schema)
        doc["metadata"].setdefault("namespace", "default")
        assert problems(doc) == []


def test_example_names_follow_the_numbering() -> None:
    # Numbered from 01 without gaps, each NN-words: the README lists them in that order.
    assert [e.name[:3] for e in EXAMPLES] == [f"{i:02d}-" for i in range(1, len(EXAMPLES) + 1)]
    assert all(re.fullmatch(r"\d\d(-[a-z0-9]+)+", e.name) for e in EXAMPLES)
