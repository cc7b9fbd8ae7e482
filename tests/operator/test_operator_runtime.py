"""Tier (a): the runtime reaching any application image (spec.runtime) and the pods' identity
(spec.securityContext, spec.containerSecurityContext), rendered and checked against Kubernetes' own schemas."""
from __future__ import annotations

import os
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import zmq

from minicluster.cli.kubectl import remote_argv, tools_dir
from minicluster.operator import manifests
from minicluster.operator.spec import CAPABILITIES, RUNTIME_MODES, MiniCluster, problems
from minicluster.runtime import RUNTIME_ROOT

K8S_VERSION = kubernetes_validate.latest_version()
MC = f"{RUNTIME_ROOT}/bin/mc"


def pod(body: dict[str, Any], role: str = "ranks") -> dict[str, Any]:
    spec: dict[str, Any] = manifests.pod_template(MiniCluster.from_body(body), role)["spec"]
    return spec


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container["volumeMounts"]}


@pytest.mark.parametrize("spec", [
    {"runtime": {"mode": mode, "image": "registry.example/runtime:1", "imagePullPolicy": "Always"}}
    for mode in RUNTIME_MODES
] + [
    {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "fsGroup": 2000,
                         "supplementalGroups": [27, 44]},
     "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_NICE"]}}},
    {"runtime": {"mode": "copy"}, "storage": {"size": "1Gi"}, "command": ["hostname"]},
])
def test_every_mode_renders_children_kubernetes_accepts(make_body: Any, spec: dict[str, Any]) -> None:
    certificate = manifests.curve_certificate(*zmq.curve_keypair())
    for obj in manifests.children(MiniCluster.from_body(make_body(**spec)), certificate):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("role, extra", [("ranks", []), ("broker", ["--rank", "0"])])
def test_copy_mode_by_default_an_init_container_copies_the_runtime_into_an_empty_dir(
    make_body: Any, role: str, extra: list[str],
) -> None:
    spec = pod(make_body(command=["hostname"], **({"storage": {"size": "1Gi"}} if role == "broker" else {})), role)
    [init] = spec["initContainers"]
    assert init["name"] == "minicluster-runtime" and init["image"] == "ghcr.io/minicluster/runtime:0.1.0"
    # The runtime image's own mc copies (no shell or cp needed there), into the volume mounted where it says.
    assert init["command"] == [MC, "runtime", "install", "/mnt/minicluster-copy"]
    assert init["volumeMounts"] == [{"name": "minicluster-runtime", "mountPath": "/mnt/minicluster-copy"}]
    assert init["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert set(init["resources"]["requests"]) == {"cpu", "memory"} and "imagePullPolicy" not in init
    assert {"name": "minicluster-runtime", "emptyDir": {}} in spec["volumes"]
    [app] = spec["containers"]
    assert app["image"] == "ghcr.io/example/minicluster:0.1.0"
    assert app["command"] == [MC, "boot", "--config", "/etc/minicluster/config.toml", *extra, "--", "hostname"]
    assert mounts(app)["minicluster-runtime"] == {"name": "minicluster-runtime", "mountPath": RUNTIME_ROOT,
                                                  "readOnly": True}


def test_image_volume_mode_mounts_the_runtime_image_with_no_copy(make_body: Any) -> None:
    spec = pod(make_body(runtime={"mode": "imageVolume", "image": "registry.example/runtime:1",
                                  "imagePullPolicy": "IfNotPresent"}))
    assert "initContainers" not in spec
    assert {"name": "minicluster-runtime", "image": {"reference": "registry.example/runtime:1",
                                                     "pullPolicy": "IfNotPresent"}} in spec["volumes"]
    [app] = spec["containers"]
    assert app["command"][:2] == [MC, "boot"]
    # The view lives at RUNTIME_ROOT inside the runtime image: that directory of it, at the same place here.
    assert mounts(app)["minicluster-runtime"] == {"name": "minicluster-runtime", "mountPath": RUNTIME_ROOT,
                                                  "readOnly": True, "subPath": "mnt/minicluster"}


def test_baked_mode_is_the_pod_of_an_image_with_minicluster_inside(make_body: Any) -> None:
    spec = pod(make_body(runtime={"mode": "baked"}))
    assert "initContainers" not in spec
    assert not any(v["name"] == "minicluster-runtime" for v in spec["volumes"])
    [app] = spec["containers"]
    assert app["command"] == ["mc", "boot", "--config", "/etc/minicluster/config.toml"]
    assert "minicluster-runtime" not in mounts(app)
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                       "fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch",
                                       "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("mode", RUNTIME_MODES)
def test_no_interpreter_or_loader_variables_reach_the_application_container(make_body: Any, mode: str) -> None:
    # The runtime finds its own python and libraries by absolute paths; the image's PATH, LD_* and PYTHON* stay
    # the image's, so its programs run with their own environment.
    spec = pod(make_body(runtime={"mode": mode}))
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        names = [e["name"] for e in container.get("env", [])]
        assert not [n for n in names if n == "PATH" or n.startswith(("LD_", "PYTHON"))], container["name"]


@pytest.mark.parametrize("mode, tools", [("copy", f"{RUNTIME_ROOT}/bin"), ("imageVolume", f"{RUNTIME_ROOT}/bin"),
                                         ("baked", "")])
def test_kubectl_mc_runs_the_tools_the_broker_pod_runs(make_body: Any, mode: str, tools: str) -> None:
    # `kubectl exec` has the image's environment: the injected runtime's bin/ is not on its PATH.
    broker = {"spec": pod(make_body(runtime={"mode": mode}))}
    assert tools_dir(broker) == tools
    assert remote_argv("submit", ["--", "hostname"], tools_dir(broker)) == [
        os.path.join(tools, "mc-submit"), "--", "hostname"]
    assert remote_argv("jobs", ["-a"], tools_dir(broker))[0] == os.path.join(tools, "mc")
    assert remote_argv("exec", ["--", "id"], tools_dir(broker)) == ["id"]


@pytest.mark.parametrize("mode", ["copy", "imageVolume"])
def test_an_injected_runtime_runs_as_the_images_own_user(make_body: Any, mode: str) -> None:
    spec = pod(make_body(runtime={"mode": mode}))
    # No uid of ours: the image's USER; fsGroup keeps the key (0400, root's) and the volumes readable by any uid.
    assert spec["securityContext"] == {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch",
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("mode", RUNTIME_MODES)
def test_the_users_identity_and_capabilities_are_laid_over_the_defaults(make_body: Any, mode: str) -> None:
    spec = pod(make_body(
        runtime={"mode": mode},
        securityContext={"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 2000, "supplementalGroups": [27]},
        containerSecurityContext={"capabilities": {"add": ["IPC_LOCK"]}}))
    sc = spec["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"], sc["supplementalGroups"]) == (1000, 100, 2000, [27])
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}  # what the user did not name stays the operator's
    assert sc.get("runAsNonRoot") is (True if mode == "baked" else None)
    [app] = spec["containers"]
    assert app["securityContext"] == {"allowPrivilegeEscalation": False,
                                      "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    # The runtime's copy needs none of them.
    for init in spec.get("initContainers", []):
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_runtime_fields_are_part_of_the_spec_hash(make_body: Any) -> None:
    def spec_hash(**spec: Any) -> str:
        return manifests.spec_hash(MiniCluster.from_body(make_body(**spec)))
    base = spec_hash()
    assert spec_hash(runtime={"mode": "baked"}) != base
    assert spec_hash(runtime={"image": "registry.example/runtime:2"}) != base
    assert spec_hash(securityContext={"runAsNonRoot": True}) != base
    assert spec_hash(containerSecurityContext={"capabilities": {"add": ["IPC_LOCK"]}}) != base
    # Canonical: the defaults spelled out are what was asked anyway.
    assert spec_hash(runtime={"mode": "copy", "image": "ghcr.io/minicluster/runtime:0.1.0"}, securityContext={},
                     containerSecurityContext={"capabilities": {"add": []}}) == base


@pytest.mark.parametrize("spec, message", [
    ({"runtime": {"mode": "inject"}}, "spec.runtime.mode 'inject' is not one of copy, imageVolume, baked"),
    ({"runtime": {"imagePullPolicy": "Sometimes"}}, "spec.runtime.imagePullPolicy 'Sometimes' is not one of"),
    ({"securityContext": {"runAsUser": -1}}, "spec.securityContext.runAsUser -1 is not an id"),
    ({"securityContext": {"fsGroup": "staff"}}, "spec.securityContext.fsGroup 'staff' is not an id"),
    ({"securityContext": {"supplementalGroups": [27, "video"]}}, "spec.securityContext.supplementalGroups"),
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": True}}, "runAsUser 0 (root) contradicts runAsNonRoot"),
    ({"securityContext": {"runAsUser": 0}, "runtime": {"mode": "baked"}}, "which baked mode sets unless"),
    ({"securityContext": {"runAsUser": 0}}, ""),  # the image's own choice of root, asked for
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": False}, "runtime": {"mode": "baked"}}, ""),
    ({"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "'SYS_ADMIN' not allowed; allowed: "),
    ({"containerSecurityContext": {"capabilities": {"add": ["CAP_IPC_LOCK"]}}}, "(name them without CAP_)"),
    ({"containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_PTRACE"]}}}, ""),
])
def test_problems_of_the_runtime_and_identity(make_body: Any, spec: dict[str, Any], message: str) -> None:
    found = problems(make_body(**spec))
    assert (message in "; ".join(found)) and bool(found) == bool(message), found


@pytest.mark.parametrize("spec", [
    {"runtime": {"mode": "inject"}},
    {"runtime": {"imagePullPolicy": "Sometimes"}},
    {"runtime": {"image": ""}},
    {"securityContext": {"runAsUser": -1}},
    {"securityContext": {"runAsNonRoot": "yes"}},
    {"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
])
def test_the_crd_refuses_what_the_operator_refuses(cr_schema: dict[str, Any], make_body: Any,
                                                   spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(make_body(**spec), cr_schema)


def test_the_crd_offers_exactly_the_operators_modes_and_capabilities(cr_schema: dict[str, Any]) -> None:
    spec = cr_schema["properties"]["spec"]["properties"]
    assert tuple(spec["runtime"]["properties"]["mode"]["enum"]) == RUNTIME_MODES
    added = spec["containerSecurityContext"]["properties"]["capabilities"]["properties"]["add"]
    assert tuple(added["items"]["enum"]) == CAPABILITIES
