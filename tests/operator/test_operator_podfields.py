"""Tier (a): the pod fields of podfields.py (spec.pod, imagePullPolicy, workingDir, commands, services) as rendered
into the Jobs' pods, checked against Kubernetes' own schemas, and their validation (operator and CRD)."""
from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import zmq

from minicluster.operator import manifests, podfields
from minicluster.operator.spec import NAME_LABEL, MiniCluster, problems
from tests.e2e.podsecurity import restricted_violations

K8S_VERSION = kubernetes_validate.latest_version()
EVERY_FIELD: dict[str, Any] = {
    "pod": {"labels": {"team": "physics", "example.com/tier": "gold"},
            "annotations": {"example.com/note": "free text, any characters: ok"},
            "imagePullSecrets": ["registry-a", "registry-b"], "priorityClassName": "high",
            "schedulerName": "volcano", "runtimeClassName": "gvisor", "shmSize": "8Gi"},
    "imagePullPolicy": "Always",
    "workingDir": "/work",
    "commands": {"init": ["sh", "-c", "cp -r /opt/data /shared"], "pre": ["sh", "-c", "echo pre"],
                 "post": ["/usr/bin/cleanup", "--all"]},
    "services": [{"name": "metrics", "image": "example.org/exporter:1", "ports": [{"containerPort": 9100}]}],
    "volumes": [{"name": "shared", "emptyDir": {}}],
    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    "env": [{"name": "DATA", "value": "/shared"}],
}


def pods(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each Job's pod template."""
    return [job["spec"]["template"] for job in manifests.jobs(MiniCluster.from_body(body))]


def app_container(pod: dict[str, Any]) -> dict[str, Any]:
    [app] = [c for c in pod["spec"]["containers"] if c["name"] == "minicluster"]
    return app


@pytest.mark.parametrize("storage", [None, {"size": "1Gi"}])
def test_every_field_renders_children_kubernetes_accepts(make_body: Any, cr_schema: dict[str, Any],
                                                         storage: dict[str, Any] | None) -> None:
    body = make_body(**EVERY_FIELD, **({"storage": storage} if storage else {}))
    jsonschema.validate(body, cr_schema)
    assert problems(body) == []
    public, secret = zmq.curve_keypair()
    for obj in manifests.children(MiniCluster.from_body(body), manifests.curve_certificate(public, secret)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_labels_annotations_and_scheduling_fields_reach_every_pod(make_body: Any) -> None:
    for pod in pods(make_body(**EVERY_FIELD, storage={"size": "1Gi"})):
        labels = pod["metadata"]["labels"]
        assert labels["team"] == "physics" and labels["example.com/tier"] == "gold" and labels[NAME_LABEL] == "demo"
        assert pod["metadata"]["annotations"] == {"example.com/note": "free text, any characters: ok"}
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
        assert (spec["priorityClassName"], spec["schedulerName"], spec["runtimeClassName"]) == (
            "high", "volcano", "gvisor")
        app = app_container(pod)
        assert (app["imagePullPolicy"], app["workingDir"]) == ("Always", "/work")
        [shm] = [v for v in spec["volumes"] if v["name"] == "minicluster-shm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_a_pull_secret_hands_out_no_api_token(make_body: Any) -> None:
    [pod] = pods(make_body(pod={"imagePullSecrets": ["registry"]}))
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]
    [pod] = pods(make_body(pod={"imagePullSecrets": ["registry"]}, serviceAccountName="runner"))
    assert pod["spec"]["automountServiceAccountToken"] is True


def test_defaults_leave_the_pods_as_they_were(make_body: Any) -> None:
    [pod] = pods(make_body())
    spec = pod["spec"]
    assert not {"imagePullSecrets", "priorityClassName", "schedulerName", "runtimeClassName"} & set(spec)
    assert "annotations" not in pod["metadata"]
    app = app_container(pod)
    assert not {"imagePullPolicy", "workingDir"} & set(app)
    assert "--pre" not in app["command"] and "--post" not in app["command"]
    [shm] = [v for v in spec["volumes"] if v["name"] == "minicluster-shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert [c["name"] for c in spec.get("initContainers", [])] == ["minicluster-runtime"]


ONE_PER_NODE = {"labelSelector": {"matchLabels": {NAME_LABEL: "demo"}}, "topologyKey": "kubernetes.io/hostname"}


@pytest.mark.parametrize("storage", [None, {"size": "1Gi"}])
def test_one_rank_per_node_by_default(make_body: Any, storage: dict[str, Any] | None) -> None:
    # The broker's own Job (storage) selects the same pods: it never shares a node with a worker either.
    for pod in pods(make_body(**({"storage": storage} if storage else {}))):
        assert pod["spec"]["affinity"] == {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [ONE_PER_NODE]}}
        assert pod["metadata"]["labels"][NAME_LABEL] == "demo"  # the pods match their own selector


def test_one_rank_per_node_keeps_the_users_affinity(make_body: Any) -> None:
    node = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}
    theirs = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
    preferred = [{"weight": 1, "podAffinityTerm": theirs}]
    affinity = {"nodeAffinity": node, "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [theirs],
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    body = make_body(affinity=affinity)
    [pod] = pods(body)
    assert pod["spec"]["affinity"] == {"nodeAffinity": node, "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [theirs, ONE_PER_NODE],
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    assert body["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        theirs]  # the spec itself is not changed


def test_pack_ranks_lets_ranks_share_a_node(make_body: Any) -> None:
    [pod] = pods(make_body(pod={"packRanks": True}))
    assert "affinity" not in pod["spec"]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    [pod] = pods(make_body(pod={"packRanks": True}, affinity=affinity))
    assert pod["spec"]["affinity"] == affinity


def test_pre_and_post_reach_mc_boot_as_argv_lists(make_body: Any) -> None:
    for pod in pods(make_body(commands=EVERY_FIELD["commands"], command=["mc", "run", "true"],
                              storage={"size": "1Gi"})):
        command = app_container(pod)["command"]
        assert command[1] == "boot"
        options = dict(zip(command[2:6:2], command[3:7:2], strict=True))
        assert json.loads(options["--pre"]) == ["sh", "-c", "echo pre"]
        assert json.loads(options["--post"]) == ["/usr/bin/cleanup", "--all"]
        assert "--config" in command and command[-4:] == ["--", "mc", "run", "true"]


def test_init_runs_as_root_in_the_application_image_outside_restricted(make_body: Any) -> None:
    body = make_body(**EVERY_FIELD, runtime={"mode": "baked"})
    [pod] = pods(body)
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["minicluster-init", "metrics"]  # before the sidecars: setup ends before anything runs
    init = pod["spec"]["initContainers"][0]
    assert init["image"] == body["spec"]["image"] and init["command"] == EVERY_FIELD["commands"]["init"]
    assert init["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                                       "allowPrivilegeEscalation": False}
    assert init["env"] == EVERY_FIELD["env"] and init["volumeMounts"] == EVERY_FIELD["volumeMounts"]
    assert (init["imagePullPolicy"], init["workingDir"]) == ("Always", "/work")
    # Honestly outside the restricted profile (a namespace that enforces it refuses these pods) ...
    found = "; ".join(restricted_violations(pod["spec"]))
    assert "minicluster-init" in found and "runAsNonRoot" in found
    # ... which the same pods without init pass.
    without = {k: v for k, v in EVERY_FIELD["commands"].items() if k != "init"}
    [pod] = pods(make_body(**{**EVERY_FIELD, "commands": without}, runtime={"mode": "baked"}))
    assert restricted_violations(pod["spec"]) == []


def test_a_failing_init_fails_the_job_a_failing_service_does_not(make_body: Any) -> None:
    [job] = manifests.jobs(MiniCluster.from_body(make_body(**EVERY_FIELD)))
    failing = {rule["onExitCodes"]["containerName"] for rule in job["spec"]["podFailurePolicy"]["rules"]
               if rule["action"] == "FailJob"}
    assert "minicluster-init" in failing and "minicluster" in failing and "metrics" not in failing


def test_services_are_sidecars_restricted_unless_they_say_otherwise(make_body: Any) -> None:
    own = {"runAsUser": 1000, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    services = [{"name": "a", "image": "example.org/a:1"},
                {"name": "b", "image": "example.org/b:1", "securityContext": own}]
    [pod] = pods(make_body(services=services))
    sidecars = pod["spec"]["initContainers"][1:]
    assert [(c["name"], c["restartPolicy"]) for c in sidecars] == [("a", "Always"), ("b", "Always")]
    assert sidecars[0]["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert sidecars[1]["securityContext"] == own
    assert [c["name"] for c in pod["spec"]["containers"]] == ["minicluster"]


@pytest.mark.parametrize("spec, message", [
    ({"pod": {"labels": {"minicluster.dev/name": "x"}}}, "'minicluster.dev/name' is set by the operator"),
    ({"pod": {"labels": {"extra.minicluster.dev/x": "y"}}}, "is set by the operator"),
    ({"pod": {"labels": {"batch.kubernetes.io/job-completion-index": "1"}}}, "the Job controller"),
    ({"pod": {"labels": {"job-name": "x"}}}, "'job-name' is set by"),
    ({"pod": {"annotations": {"kueue.x-k8s.io/queue-name": "q"}}}, "spec.pod.annotations: 'kueue.x-k8s.io/"),
    ({"pod": {"labels": {"app.kubernetes.io/managed-by": "me"}}}, "is set by the operator"),
    ({"pod": {"labels": {"-bad": "x"}}}, "'-bad' is not a valid key"),
    ({"pod": {"labels": {"a/b/c": "x"}}}, "'a/b/c' is not a valid key"),
    ({"pod": {"labels": {"x" * 64: "x"}}}, "is not a valid key"),
    ({"pod": {"labels": {"team": "has space"}}}, "'has space' is not a valid label value"),
    ({"pod": {"labels": {"team": "x" * 64}}}, "is not a valid label value"),
    ({"pod": {"labels": {"team": 3}}}, "must be a string"),
    ({"pod": {"labels": {"app.kubernetes.io/component": "solver", "team": ""}}}, ""),
    ({"pod": {"annotations": {"example.com/any": "has space, and more than sixty-three characters " * 3}}}, ""),
    ({"pod": {"imagePullSecrets": ["Bad_Name"]}}, "spec.pod.imagePullSecrets[0] 'Bad_Name' is not a Secret name"),
    ({"pod": {"priorityClassName": "High"}}, "spec.pod.priorityClassName 'High' is not a DNS subdomain"),
    ({"pod": {"schedulerName": ""}}, "spec.pod.schedulerName"),
    ({"pod": {"runtimeClassName": "a b"}}, "spec.pod.runtimeClassName"),
    ({"pod": {"shmSize": "lots"}}, "spec.pod.shmSize 'lots' is not a positive quantity"),
    ({"pod": {"shmSize": "0"}}, "spec.pod.shmSize '0'"),
    ({"pod": {"shmSize": "0.0Gi"}}, "spec.pod.shmSize"),
    ({"pod": {"shmSize": "512Mi"}}, ""),
    ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy 'Sometimes' is not one of Always, IfNotPresent, Never"),
    ({"workingDir": "work"}, "spec.workingDir 'work' is not an absolute path"),
    ({"commands": {"pre": "echo hi"}}, "spec.commands.pre must be a non-empty argv list"),
    ({"commands": {"post": []}}, "spec.commands.post must be a non-empty argv list"),
    ({"commands": {"init": [""]}}, "spec.commands.init must be a non-empty argv list"),
    ({"commands": {"after": ["true"]}}, "spec.commands.after is not a command"),
    ({"commands": {"init": ["true"]}, "securityContext": {"runAsNonRoot": True}}, "init runs as root, which spec."),
    ({"commands": {"init": ["true"]}, "securityContext": {"runAsNonRoot": False}}, ""),
    ({"commands": {"init": ["true"]}, "runtime": {"mode": "baked"}}, ""),
    ({"services": [{"name": "minicluster-x", "image": "a"}]}, "names beginning with 'minicluster' are the"),
    ({"services": [{"name": "a", "image": "a"}, {"name": "a", "image": "b"}]}, "spec.services[1].name 'a' is used"),
    ({"services": [{"name": "Bad", "image": "a"}]}, "spec.services[0].name 'Bad' is not a container name"),
    ({"services": [{"name": "a"}]}, "spec.services[0].image is required"),
    ({"services": [{"name": "a", "image": "a", "restartPolicy": "Never"}]}, "restartPolicy must be Always"),
])
def test_problems(make_body: Any, spec: dict[str, Any], message: str) -> None:
    found = problems(make_body(**spec))
    assert (message in "; ".join(found)) and bool(found) == bool(message), found


@pytest.mark.parametrize("spec, where", [
    ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
    ({"workingDir": "relative"}, "workingDir"),
    ({"pod": {"shmSize": "lots"}}, "shmSize"),
    ({"pod": {"packRanks": "yes"}}, "packRanks"),
    ({"pod": {"labels": {"team": "x" * 64}}}, "team"),
    ({"pod": {"imagePullSecrets": [{"name": "a"}]}}, "imagePullSecrets"),
    ({"commands": {"pre": "echo hi"}}, "pre"),
    ({"services": [{"name": "a"}]}, "image"),
])
def test_the_crd_refuses_bad_fields(cr_schema: dict[str, Any], make_body: Any, spec: dict[str, Any],
                                    where: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(make_body(**spec), cr_schema)
    assert where in "/".join(str(p) for p in refused.value.absolute_path) or where in refused.value.message


def test_spec_hash_sees_every_field_and_no_unset_one(make_body: Any) -> None:
    base = manifests.spec_hash(MiniCluster.from_body(make_body()))
    # Spelled-out defaults are what an older spec asked for: the hash (and its Jobs) stay.
    defaults = make_body(pod={"shmSize": "1Gi", "packRanks": False, "labels": {}}, services=[], commands={})
    assert manifests.spec_hash(MiniCluster.from_body(defaults)) == base
    for key, value in EVERY_FIELD.items():
        assert manifests.spec_hash(MiniCluster.from_body(make_body(**{key: value}))) != base, key


def test_an_api_server_without_sidecars_is_caught(make_body: Any) -> None:
    # Before 1.29 (or with SidecarContainers off) the API server drops restartPolicy from init containers: the
    # services would then be init containers that never end, and no rank would ever start.
    [wanted] = manifests.jobs(MiniCluster.from_body(make_body(services=EVERY_FIELD["services"])))
    assert manifests.dropped_fields(wanted, copy.deepcopy(wanted)) == []
    kept = copy.deepcopy(wanted)
    for container in kept["spec"]["template"]["spec"]["initContainers"]:
        container.pop("restartPolicy", None)
    assert manifests.dropped_fields(wanted, kept) == [podfields.SIDECARS]
    assert manifests.JOB_FIELDS[podfields.SIDECARS] == "1.29"
    [plain] = manifests.jobs(MiniCluster.from_body(make_body()))
    assert manifests.dropped_fields(plain, copy.deepcopy(plain)) == []
