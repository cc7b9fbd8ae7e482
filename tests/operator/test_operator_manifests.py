"""Tier (a): pure manifest builders, checked against a current Kubernetes
release's own schemas (kubernetes-validate, strict) and the broker's config."""
from __future__ import annotations

import base64
import copy
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import zmq
import zmq.auth

from minicluster.config import from_mapping
from minicluster.operator import manifests, reconcile
from minicluster.operator.spec import OWN_MOUNT_PATHS, OWN_VOLUME_PREFIX, TEMPLATE_FIELDS, MiniCluster, problems
from tests.e2e.podsecurity import restricted_violations

# Indexed Job successPolicy and podFailurePolicy are GA only in recent releases.
K8S_VERSION = kubernetes_validate.latest_version()


def test_bundled_schemas_are_recent_enough() -> None:
    major, minor = (int(x) for x in K8S_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33)


def render(body: dict[str, Any]) -> list[dict[str, Any]]:
    mc = MiniCluster.from_body(body)
    public, secret = zmq.curve_keypair()
    return manifests.children(mc, manifests.curve_certificate(public, secret))


@pytest.mark.parametrize("spec", [
    {},
    {"command": ["mc-submit", "--cc", "1-100000", "--wait", "echo", "{cc}"], "deadlineSeconds": 3600},
    {"queueName": "team-a", "suspend": True, "policy": "spread", "logging": {"level": "debug"}},
    {
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": 1}},
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "hpc", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "serviceAccountName": "runner",
    },
    {"storage": {"size": "2Gi", "storageClassName": "fast"}, "command": ["mc", "run", "true"]},
    {"topology": "zone=topology.kubernetes.io/zone,rack=example.com/rack", "brokerRunsTasks": False},
    {"failurePolicy": {"backoffLimitPerRank": 0, "backoffLimit": 50}, "ttlSecondsAfterFinished": 600},
    {"failurePolicy": {"backoffLimitPerRank": 5}, "ttlSecondsAfterFinished": 0, "storage": {"size": "1Gi"}},
])
def test_every_child_validates_strictly(make_body: Any, spec: dict[str, Any]) -> None:
    for obj in render(make_body(**spec)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_children_are_owned_and_labelled(body: dict[str, Any]) -> None:
    for obj in render(body):
        meta = obj["metadata"]
        assert meta["namespace"] == "default"
        assert meta["labels"]["minicluster.dev/name"] == "demo"
        [ref] = meta["ownerReferences"]
        assert ref == {"apiVersion": "minicluster.dev/v1alpha1", "kind": "MiniCluster", "name": "demo",
                       "uid": "uid-demo", "controller": True, "blockOwnerDeletion": True}


def test_job_is_an_indexed_job_that_completes_with_rank_0(make_body: Any) -> None:
    job = manifests.job(MiniCluster.from_body(make_body(size=3, command=["hostname"])))
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert spec["suspend"] is False
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "demo" and pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["command"] == ["/mnt/minicluster/bin/mc", "boot", "--config", "/etc/minicluster/config.toml",
                                    "--", "hostname"]


@pytest.mark.parametrize("spec", [{}, {"storage": {"size": "1Gi"}}])
@pytest.mark.parametrize("runtime, security, uid", [
    ({"mode": "baked"}, {}, 10001),  # as the runtime image's user
    ({}, {"runAsNonRoot": True}, None),  # as the image's own USER, which the kubelet checks is not root
    ({}, {"runAsNonRoot": True, "runAsUser": 1000}, 1000),
])
def test_pods_pass_pod_security_restricted_where_asked(
    make_body: Any, spec: dict[str, Any], runtime: dict[str, Any], security: dict[str, Any], uid: int | None,
) -> None:
    mc = MiniCluster.from_body(make_body(**spec, runtime=runtime, securityContext=security))
    for job in manifests.jobs(mc):
        pod = job["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        sc = pod["securityContext"]
        # fsGroup: the kubelet hands the key (item mode 0400, owned by root) to this group, which every uid joins.
        assert sc.get("runAsUser") == uid and sc["fsGroup"] == 10001


def test_restricted_check_catches_what_the_old_template_lacked() -> None:
    old = {"containers": [{"name": "minicluster", "securityContext": {"allowPrivilegeEscalation": False}}],
           "volumes": [{"name": "x", "emptyDir": {}}]}
    found = "; ".join(restricted_violations(old))
    assert "unrestricted capabilities" in found and "runAsNonRoot" in found and "seccompProfile" in found
    assert "hostPath" in "; ".join(restricted_violations({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}))


def test_pods_find_the_broker_without_being_told(body: dict[str, Any]) -> None:
    mc = MiniCluster.from_body(body)
    [container] = manifests.job(mc)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = from_mapping(tomllib.loads(manifests.config_map(mc)["data"]["config.toml"]))
    assert env["MC_URI"] == f"unix://{config.socket_path}"  # `kubectl exec POD -- mc-submit` works as is
    assert config.listen == "*"


@pytest.mark.parametrize("given, runs", [({}, True), ({"brokerRunsTasks": False}, False)])
def test_broker_runs_tasks_reaches_the_brokers_config(make_body: Any, given: dict[str, Any], runs: bool) -> None:
    config_map = manifests.config_map(MiniCluster.from_body(make_body(**given)))
    assert from_mapping(tomllib.loads(config_map["data"]["config.toml"])).broker_runs_tasks is runs


def test_topology_levels_come_from_the_pods_own_labels(make_body: Any) -> None:
    mc = MiniCluster.from_body(make_body(topology="zone=topology.kubernetes.io/zone,rack=example.com/rack"))
    [container] = manifests.job(mc)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["MC_TOPOLOGY_0"] == {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}
    assert env["MC_TOPOLOGY_1"] == {"fieldRef": {"fieldPath": "metadata.labels['example.com/rack']"}}
    config = from_mapping(tomllib.loads(manifests.config_map(mc)["data"]["config.toml"]))
    assert config.levels == (("zone", "topology.kubernetes.io/zone"), ("rack", "example.com/rack"))
    plain = manifests.job(MiniCluster.from_body(make_body()))["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"].startswith("MC_TOPOLOGY_") for e in plain["env"])


def test_storage_gives_rank_0_a_job_and_a_claim_of_its_own(make_body: Any) -> None:
    mc = MiniCluster.from_body(make_body(size=3, storage={"size": "5Gi", "storageClassName": "ssd"},
                                         command=["mc", "run", "hostname"]))
    kinds = [(o["kind"], o["metadata"]["name"]) for o in render(make_body(size=3, storage={"size": "5Gi"}))]
    assert kinds[-3:] == [("PersistentVolumeClaim", "demo-state"), ("Job", "demo-broker"), ("Job", "demo")]
    claim = manifests.claim(mc)
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                             "storageClassName": "ssd"}
    broker, workers = manifests.jobs(mc)
    bpod = broker["spec"]["template"]["spec"]
    assert broker["spec"]["completions"] == 1 and bpod["hostname"] == "demo-0" and bpod["subdomain"] == "demo"
    assert {"name": "minicluster-state", "persistentVolumeClaim": {"claimName": "demo-state"}} in bpod["volumes"]
    assert bpod["containers"][0]["command"][-5:] == ["--rank", "0", "--", "mc", "run", "hostname"][-5:]
    wpod = workers["spec"]["template"]["spec"]
    # Only rank 0 mounts the (ReadWriteOnce) claim; index 0 of the workers' Job steps aside.
    assert not any("persistentVolumeClaim" in v for v in wpod["volumes"])
    assert "--broker-elsewhere" in wpod["containers"][0]["command"]
    assert "successPolicy" not in workers["spec"] and workers["spec"]["completionMode"] == "Indexed"


def test_pod_failure_policy_ignores_disruptions_and_fails_on_program_errors(body: dict[str, Any]) -> None:
    job_spec = manifests.job(MiniCluster.from_body(body))["spec"]
    ignore, fail, *init_rules = job_spec["podFailurePolicy"]["rules"]
    assert ignore["action"] == "Ignore"
    assert ignore["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["containerName"] == "minicluster"
    # 1..127: the program's own failure; 128: the container could not be started at all (StartError).
    assert fail["onExitCodes"]["values"] == list(range(1, 129))
    inits = [c["name"] for c in job_spec["template"]["spec"].get("initContainers", [])]
    assert [r["onExitCodes"]["containerName"] for r in init_rules] == inits


def test_an_init_container_that_fails_or_cannot_start_fails_the_job_at_once() -> None:
    template = {"spec": {"initContainers": [{"name": "minicluster-runtime"}, {"name": "setup"}]}}
    rules = manifests.pod_failure_rules(template)
    failing = {r["onExitCodes"]["containerName"]: r["onExitCodes"]["values"] for r in rules if r["action"] == "FailJob"}
    assert failing == {name: list(range(1, 129)) for name in ("minicluster", "minicluster-runtime", "setup")}


def test_queued_job_is_created_suspended_with_the_kueue_label(make_body: Any) -> None:
    job = manifests.job(MiniCluster.from_body(make_body(queueName="team-a")))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True
    assert "kueue.x-k8s.io/priority-class" not in job["metadata"]["labels"]
    ranked = manifests.job(MiniCluster.from_body(make_body(queueName="team-a", queuePriorityClass="high")))
    assert ranked["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"


def test_a_minimum_size_asks_kueue_for_partial_admission(make_body: Any) -> None:
    job = manifests.job(MiniCluster.from_body(make_body(queueName="q", size=4, minSize=2)))
    annotations = job["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/job-min-parallelism"] == "2"
    assert annotations["kueue.x-k8s.io/job-completions-equal-parallelism"] == "true"
    # Kueue accepts a minimum below parallelism only: minSize == size asks for nothing.
    whole = manifests.job(MiniCluster.from_body(make_body(queueName="q", size=4, minSize=4)))
    assert "kueue.x-k8s.io/job-min-parallelism" not in whole["metadata"]["annotations"]


def test_a_queued_minicluster_keeps_the_size_it_was_admitted_at(make_body: Any) -> None:
    # Kueue takes a Job of another parallelism for another job: it would stop every rank and queue it again.
    resized = {**make_body(queueName="team-a", size=5), "status": {"size": 4}}
    assert any("fixed at 4" in p for p in problems(resized))
    assert not problems({**make_body(queueName="team-a", size=4), "status": {"size": 4}})
    assert not problems({**make_body(size=5), "status": {"size": 4}})  # elastic without Kueue


def test_interactive_mode_has_no_command_separator(body: dict[str, Any]) -> None:
    [container] = manifests.job(MiniCluster.from_body(body))["spec"]["template"]["spec"]["containers"]
    assert "--" not in container["command"]


def test_service_is_headless_and_publishes_unready_pods(body: dict[str, Any]) -> None:
    svc = manifests.service(MiniCluster.from_body(body))["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert svc["selector"] == {"minicluster.dev/name": "demo"}


def test_config_map_is_a_config_the_broker_accepts(body: dict[str, Any]) -> None:
    cm = manifests.config_map(MiniCluster.from_body(body), cluster_domain="example.org")
    config = from_mapping(tomllib.loads(cm["data"]["config.toml"]))
    assert (config.name, config.size, config.max_size, config.status_port) == ("demo", 4, 8, 8051)
    assert config.endpoint_of(3) == "tcp://demo-3.demo.default.svc.example.org:8050"
    assert config.curve_cert == "/etc/minicluster/curve/curve.key_secret"


def test_secret_holds_a_certificate_zmq_can_load(body: dict[str, Any], tmp_path: Path) -> None:
    public, secret = zmq.curve_keypair()
    obj = manifests.secret(MiniCluster.from_body(body), manifests.curve_certificate(public, secret))
    path = tmp_path / "curve.key_secret"
    path.write_bytes(base64.b64decode(obj["data"]["curve.key_secret"]))
    assert zmq.auth.load_certificate(path) == (public, secret)


def test_config_and_key_share_one_projected_directory(body: dict[str, Any]) -> None:
    pod = manifests.pod_template(MiniCluster.from_body(body))["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "minicluster-config"]
    paths = [item["path"] for src in volume["projected"]["sources"] for item in next(iter(src.values()))["items"]]
    assert paths == ["config.toml", "curve/curve.key_secret"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert not any("subPath" in m for m in mounts)  # subPath mounts never see ConfigMap updates


@pytest.mark.parametrize("spec, message", [
    ({"size": 9}, "exceeds maxSize 8"),
    ({"maxSize": None, "size": 2}, ""),
    ({"image": ""}, "spec.image is required"),
    ({"policy": "random"}, "unknown policy"),
    ({"logging": {"level": "loud"}}, "spec.logging.level"),
    ({"storage": {"size": "lots"}}, "spec.storage.size"),
    ({"storage": {"size": "1Gi"}, "size": 1}, "at least 2"),
    ({"storage": {"size": "1Gi"}, "size": 1, "maxSize": 1}, ""),
    ({"brokerRunsTasks": False, "size": 1, "maxSize": 1}, "broker_runs_tasks = false leaves no rank"),
    ({"topology": "zone=a b"}, "bad property name"),
    ({"storage": {"size": "0Gi"}}, "spec.storage.size '0Gi' is not a positive quantity"),
    ({"volumes": [{"name": "minicluster-state", "emptyDir": {}}]}, "spec.volumes[0].name 'minicluster-state'"),
    ({"volumes": [{"name": "data", "emptyDir": {}}], "volumeMounts": [{"name": "data", "mountPath": "/dev/shm"}]},
     "spec.volumeMounts[0].mountPath '/dev/shm': /dev/shm is the operator's"),
    ({"volumes": [{"name": "data", "emptyDir": {}}],
      "volumeMounts": [{"name": "data", "mountPath": "/etc/minicluster/curve/"}]},
     "/etc/minicluster is the operator's"),
    ({"volumes": [{"name": "data", "emptyDir": {}}],
      "volumeMounts": [{"name": "data", "mountPath": "/etc/minicluster2"}]}, ""),
    ({"queueName": "team a"}, "spec.queueName 'team a' is not a label value"),
    ({"queueName": "q", "queuePriorityClass": "High"}, "spec.queuePriorityClass 'High' is not a Workload"),
    ({"queuePriorityClass": "high"}, "spec.queuePriorityClass needs spec.queueName"),
    ({"queueName": "q", "queuePriorityClass": "high"}, ""),
    ({"queueName": "q", "storage": {"size": "1Gi"}}, "spec.storage cannot be combined with spec.queueName"),
    ({"minSize": 2}, "spec.minSize needs spec.queueName"),
    ({"queueName": "q", "minSize": 5}, "spec.minSize 5 must be from 1 to spec.size"),
    ({"queueName": "q", "minSize": 1, "brokerRunsTasks": False}, "spec.minSize must be at least 2"),
    ({"queueName": "q", "minSize": 2}, ""),
])
def test_problems(make_body: Any, spec: dict[str, Any], message: str) -> None:
    found = problems(make_body(**spec))
    assert (message in "; ".join(found)) and bool(found) == bool(message)


def test_problems_reject_bad_names_and_max_size_changes(make_body: Any) -> None:
    assert "DNS label" in problems(make_body(name="Has.Dots"))[0]
    body = make_body(maxSize=16)
    body["status"] = {"maxSize": 8}
    assert "immutable" in problems(body)[0]


def test_fixed_size_cluster_explains_how_to_become_elastic(make_body: Any) -> None:
    body = make_body(size=5, maxSize=None)
    body["status"] = {"maxSize": 4}
    assert "set spec.maxSize at creation" in problems(body)[0]


@pytest.mark.parametrize("spec, current, wanted", [
    ({"size": 4}, {"completions": 4, "parallelism": 4, "suspend": False}, {}),
    ({"size": 6}, {"completions": 4, "parallelism": 4}, {"completions": 6, "parallelism": 6}),
    ({"suspend": True}, {"completions": 4, "parallelism": 4}, {"suspend": True}),
    ({}, {"completions": 4, "parallelism": 4, "suspend": True}, {"suspend": False}),
    ({"queueName": "q"}, {"completions": 4, "parallelism": 4, "suspend": True}, {}),
    ({"queueName": "q"}, {"completions": 4, "parallelism": 4, "suspend": False}, {}),
    ({"queueName": "q", "suspend": True}, {"completions": 4, "parallelism": 4}, {"suspend": True}),
])
def test_job_patch(make_body: Any, spec: dict[str, Any], current: dict[str, Any], wanted: dict[str, Any]) -> None:
    mc = MiniCluster.from_body(make_body(**spec))
    assert reconcile.job_patch(mc, {"spec": current}) == wanted


def test_each_rank_has_its_own_retry_budget(make_body: Any) -> None:
    # One backoffLimit of 10 for up to 10,000 ranks let a few flaky nodes fail a large MiniCluster.
    [ranks] = manifests.jobs(MiniCluster.from_body(make_body()))
    assert (ranks["spec"]["backoffLimitPerIndex"], ranks["spec"]["maxFailedIndexes"]) == (3, 0)
    assert ranks["spec"]["backoffLimit"] == 2**31 - 1
    given = make_body(failurePolicy={"backoffLimitPerRank": 1, "backoffLimit": 40}, ttlSecondsAfterFinished=300,
                      storage={"size": "1Gi"})
    broker, workers = manifests.jobs(MiniCluster.from_body(given))
    assert (workers["spec"]["backoffLimitPerIndex"], workers["spec"]["backoffLimit"]) == (1, 40)
    # Rank 0's own Job is one rank: its budget is the rank's.
    assert "backoffLimitPerIndex" not in broker["spec"] and broker["spec"]["backoffLimit"] == 1
    # The TTL comes once the MiniCluster's end is recorded (handlers._expire), never with a running Job.
    assert "ttlSecondsAfterFinished" not in broker["spec"] and "ttlSecondsAfterFinished" not in workers["spec"]


def test_without_per_rank_budgets_the_ranks_share_a_bounded_one(make_body: Any) -> None:
    """An API server before 1.29 (or with JobBackoffLimitPerIndex off) drops backoffLimitPerIndex and keeps the
    unlimited backoffLimit beside it: the operator bounds it (the user's backoffLimit, else 10)."""
    for spec, limit, patch in [({}, manifests.BACKOFF_LIMIT, {"backoffLimit": manifests.BACKOFF_LIMIT}),
                               ({"failurePolicy": {"backoffLimit": 7}}, 7, {})]:
        mc = MiniCluster.from_body(make_body(**spec))
        [wanted] = manifests.jobs(mc)
        dropped = copy.deepcopy(wanted)
        del dropped["spec"]["backoffLimitPerIndex"], dropped["spec"]["maxFailedIndexes"]
        assert manifests.kept_backoff_limit(mc, wanted, dropped) == limit
        assert reconcile.job_patch(mc, dropped, 4, manifests.kept_backoff_limit(mc, wanted, dropped)) == patch
        assert reconcile.job_patch(mc, wanted, 4, manifests.kept_backoff_limit(mc, wanted, wanted)) == {}
        assert manifests.dropped_fields(wanted, dropped) == []  # not a reason to call the cluster unsupported


def test_a_changed_failure_limit_reaches_the_job(make_body: Any) -> None:
    before = MiniCluster.from_body(make_body())
    [job] = manifests.jobs(before)
    after = MiniCluster.from_body(make_body(failurePolicy={"backoffLimit": 20}))
    [wanted] = manifests.jobs(after)
    assert reconcile.job_patch(after, job, 4, manifests.kept_backoff_limit(after, wanted, job)) == {
        "backoffLimit": 20}
    assert reconcile.job_patch(before, wanted, 4, manifests.kept_backoff_limit(before, job, wanted)) == {
        "backoffLimit": 2**31 - 1}


def test_dropped_job_fields_are_those_the_api_server_did_not_keep(make_body: Any) -> None:
    mc = MiniCluster.from_body(make_body())
    [wanted] = manifests.jobs(mc)
    assert manifests.dropped_fields(wanted, copy.deepcopy(wanted)) == []
    # What a 1.20 API server returns: the fields it does not know are gone.
    old = copy.deepcopy(wanted)
    for field in ("completionMode", "successPolicy", "podFailurePolicy", "suspend"):
        del old["spec"][field]
    assert manifests.dropped_fields(wanted, old) == ["completionMode", "suspend", "podFailurePolicy", "successPolicy"]
    # With storage rank 0's Job is not Indexed and has no success policy: neither is missed there.
    broker = manifests.broker_job(MiniCluster.from_body(make_body(storage={"size": "1Gi"})))
    kept = copy.deepcopy(broker)
    assert "completionMode" not in broker["spec"] and manifests.dropped_fields(broker, kept) == []


def test_failed_ranks_leave_their_log_tail_as_termination_message(body: dict[str, Any]) -> None:
    [container] = manifests.pod_template(MiniCluster.from_body(body))["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_spec_hash_tracks_pod_fields_only(make_body: Any) -> None:
    base = manifests.spec_hash(MiniCluster.from_body(make_body()))
    assert manifests.job(MiniCluster.from_body(make_body()))["metadata"]["annotations"][manifests.SPEC_HASH] == base
    assert manifests.spec_hash(MiniCluster.from_body(make_body(size=6))) == base
    assert manifests.spec_hash(MiniCluster.from_body(make_body(suspend=True))) == base
    assert manifests.spec_hash(MiniCluster.from_body(make_body(image="other:1"))) != base
    # Canonical: a default spelled out is what was asked for anyway.
    assert manifests.spec_hash(MiniCluster.from_body(make_body(logging={"level": "info"}, env=[]))) == base


def test_spec_hash_covers_exactly_the_template_fields(make_body: Any) -> None:
    later = {"runtime": {"mode": "baked"}, "securityContext": {"runAsUser": 1000},
             "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}}, "pod": {"packRanks": True},
             "imagePullPolicy": "Always", "workingDir": "/work", "commands": {"pre": ["true"]},
             "services": [{"name": "db", "image": "redis:7"}]}
    inputs = manifests.template_inputs(MiniCluster.from_body(make_body(**later)))
    assert set(inputs) - {"role", "storage"} == set(TEMPLATE_FIELDS)
    # Fields added later count only when set: a Job made before they existed keeps its hash across an upgrade.
    assert set(manifests.template_inputs(MiniCluster.from_body(make_body()))) == set(inputs) - set(later)


def test_spec_hash_is_what_was_asked_not_how_it_was_rendered(
    make_body: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator upgrade that renders pods differently must not flag every existing MiniCluster TemplateImmutable.
    before = manifests.job(MiniCluster.from_body(make_body()))
    monkeypatch.setattr(manifests, "pod_security_context", lambda mc: {"runAsNonRoot": True, "runAsUser": 4242})
    after = manifests.job(MiniCluster.from_body(make_body()))
    assert before["spec"]["template"] != after["spec"]["template"]
    assert before["metadata"]["annotations"] == after["metadata"]["annotations"]


@pytest.mark.parametrize("mode", ["copy", "imageVolume", "baked"])
def test_the_operators_own_volumes_and_paths_are_those_users_may_not_take(make_body: Any, mode: str) -> None:
    mc = MiniCluster.from_body(make_body(runtime={"mode": mode}, storage={"size": "1Gi"},
                                         commands={"init": ["true"]}))
    for role in ("ranks", "broker"):
        pod = manifests.pod_template(mc, role)["spec"]
        assert all(v["name"].startswith(OWN_VOLUME_PREFIX) for v in pod["volumes"])
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            for mount in container.get("volumeMounts", []):
                assert mount["mountPath"] in OWN_MOUNT_PATHS, (container["name"], mount)
