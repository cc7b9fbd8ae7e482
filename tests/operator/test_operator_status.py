"""Tier (a): status derivation, conditions and metrics are pure functions."""
from __future__ import annotations

from typing import Any

import pytest

from minicluster.operator.metrics import Metrics
from minicluster.operator.spec import MiniCluster
from minicluster.operator.status import Observed, changed, derive, progress, set_condition

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
BROKER = {"ready": False, "ranks": {"up": 1, "expected": 4, "unresponsive": 1, "lost": 0},
          "jobs": {"queued": 2, "running": 0, "finished": 0, "failed": 0}, "command": None}


def job(suspend: bool = False, **conditions: str) -> dict[str, Any]:
    return {"spec": {"suspend": suspend},
            "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": f"{t} because {r}"}
                                      for t, r in conditions.items()]}}


def conditions(fields: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in fields["conditions"]}


@pytest.fixture
def mc(body: dict[str, Any]) -> MiniCluster:
    return MiniCluster.from_body(body)


@pytest.mark.parametrize("the_job, broker, phase, reason", [
    (job(), None, "Pending", "BrokerUnreachable"),
    (job(), BROKER, "Pending", "RanksJoining"),
    (job(), {**BROKER, "ready": True}, "Running", "AllRanksJoined"),
    (job(suspend=True), None, "Suspended", "SuspendedBySpec"),
    (job(Complete="Completed"), None, "Succeeded", "BrokerSucceeded"),
    (job(SuccessCriteriaMet="SuccessPolicy"), None, "Succeeded", "BrokerSucceeded"),
    (job(Failed="PodFailurePolicy"), None, "Failed", "PodFailurePolicy"),
    (job(FailureTarget="DeadlineExceeded"), BROKER, "Failed", "DeadlineExceeded"),
    (job(), {**BROKER, "command": {"state": "exited", "status": 2}}, "Failed", "CommandFailed"),
])
def test_phase(mc: MiniCluster, the_job: dict[str, Any], broker: Any, phase: str, reason: str) -> None:
    fields = derive(mc, {}, Observed(the_job, broker), NOW)
    assert fields["phase"] == phase
    states = conditions(fields)
    if phase in ("Suspended", "Succeeded", "Failed"):
        assert states[phase] == ("True", reason)
    assert states["Ready"][0] == ("True" if phase == "Running" else "False")
    assert states["Ready"][1] == reason or phase != "Pending"


def test_ready_only_when_every_expected_rank_joined(mc: MiniCluster) -> None:
    fields = derive(mc, {}, Observed(job(), BROKER), NOW)
    assert fields["ranks"] == {"joined": 1, "expected": 4, "unresponsive": 1, "lost": 0}
    ready = next(c for c in fields["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["message"] == "1/4 ranks joined"


def test_unreachable_broker_keeps_the_last_known_counts(mc: MiniCluster) -> None:
    old = {"jobs": {"queued": 0, "running": 0, "finished": 9, "failed": 1}}
    assert "jobs" not in changed(old, derive(mc, old, Observed(job()), NOW))


def test_transition_time_moves_only_on_a_flip() -> None:
    first = set_condition([], "Ready", False, "RanksJoining", "1/4", NOW)
    same = set_condition(first, "Ready", False, "RanksJoining", "3/4", LATER)
    flipped = set_condition(same, "Ready", True, "AllRanksJoined", "", LATER)
    assert same[0]["lastTransitionTime"] == NOW and same[0]["message"] == "3/4"
    assert flipped[0]["lastTransitionTime"] == LATER and "message" not in flipped[0]


def test_unchanged_status_costs_no_write(mc: MiniCluster) -> None:
    fields = derive(mc, {}, Observed(job(), BROKER), NOW)
    assert changed(fields, derive(mc, fields, Observed(job(), BROKER), LATER)) == {}


def test_every_condition_carries_the_generation_it_was_computed_from(make_body: Any) -> None:
    body = make_body()
    body["metadata"]["generation"] = 7
    fields = derive(MiniCluster.from_body(body), {}, Observed(job(), BROKER), NOW)
    assert {c["type"]: c["observedGeneration"] for c in fields["conditions"]} == {
        "Ready": 7, "Suspended": 7, "Succeeded": 7, "Failed": 7, "StateDurable": 7}
    assert all(c["observedGeneration"] == 9 for c in progress({**fields, "observedGeneration": 9}, 9, NOW)[-2:])


def kstatus(fields: dict[str, Any], generation: int = 1) -> dict[str, tuple[str, str]]:
    got = conditions({"conditions": progress({"observedGeneration": 1, **fields}, generation, NOW)})
    return {t: got[t] for t in ("Reconciling", "Stalled")}


def test_reconciling_while_the_ranks_are_being_brought_to_the_spec(mc: MiniCluster) -> None:
    joining = derive(mc, {}, Observed(job(), BROKER), NOW)
    assert kstatus(joining) == {"Reconciling": ("True", "RanksJoining"), "Stalled": ("False", "NotStalled")}
    running = derive(mc, {}, Observed(job(), {**BROKER, "ready": True}), NOW)
    assert kstatus(running) == {"Reconciling": ("False", "Running"), "Stalled": ("False", "NotStalled")}
    # An edit the operator has not reconciled yet (status.observedGeneration 1, the spec's generation 2).
    assert kstatus(running, generation=2)["Reconciling"] == ("True", "NewGeneration")
    for the_job in (job(suspend=True), job(Complete="Completed")):
        assert kstatus(derive(mc, {}, Observed(the_job), NOW))["Reconciling"][0] == "False"


@pytest.mark.parametrize("reason", ["InvalidSpec", "TemplateImmutable", "NotOwned", "Rejected", "UnsupportedCluster"])
def test_stalled_when_only_a_change_of_the_spec_can_help(mc: MiniCluster, reason: str) -> None:
    running = derive(mc, {}, Observed(job(), {**BROKER, "ready": True}), NOW)
    refused = {**running, "conditions": set_condition(running["conditions"], "Reconciled", False, reason, "why", NOW)}
    assert kstatus(refused) == {"Reconciling": ("False", "Stalled"), "Stalled": ("True", reason)}
    fixed = {**running, "conditions": set_condition(running["conditions"], "Reconciled", True, "ChildrenUpToDate", "",
                                                    NOW)}
    assert kstatus(fixed)["Stalled"] == ("False", "NotStalled")


def test_a_failed_minicluster_is_stalled_with_the_failures_reason(mc: MiniCluster) -> None:
    # E.g. the Job's FailJob rule: a rank's program failed, and a new pod would fail the same way.
    failed = derive(mc, {}, Observed(job(Failed="PodFailurePolicy")), NOW)
    assert kstatus(failed) == {"Reconciling": ("False", "Stalled"), "Stalled": ("True", "PodFailurePolicy")}


def pod(name: str, index: int | None, phase: str = "Pending", created: str = NOW, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if index is not None:
        meta["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": meta, "status": {"phase": phase, **status}}


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "minicluster", "state": {"waiting": {"reason": reason,
                                                                                "message": message}}}]}


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    ended = {"exitCode": code, "reason": reason, **({"message": message} if message else {})}
    return {"containerStatuses": [{"name": "minicluster", "state": {"terminated": ended}}]}


NO_RANK = "mc boot: error: no rank: pass --rank or set JOB_COMPLETION_INDEX"
REFUSED = {"reason": "FailedCreate", "lastTimestamp": LATER,
           "message": 'Error creating: pods "demo-0-x" is forbidden: violates PodSecurity "restricted:latest": '
                      "allowPrivilegeEscalation != false"}


@pytest.mark.parametrize("pods, events, reason, text", [
    ([], [REFUSED], "FailedCreate", "violates PodSecurity"),
    ([pod("demo-1-a", 1, created=NOW)], [REFUSED], "FailedCreate", "restricted"),
    ([pod("demo-0-a", 0, created="2026-01-01T00:09:00Z")], [REFUSED], "BrokerUnreachable", ""),  # stale event
    ([pod("demo-2-a", 2, **waiting("ImagePullBackOff", 'Back-off pulling image "nope:1"'))], [],
     "ImagePullBackOff", 'rank 2 (pod demo-2-a): Back-off pulling image "nope:1"'),
    ([pod("demo-1-a", 1, "Failed", **terminated(1, message="curve.key_secret: Permission denied")),
      pod("demo-1-b", 1, "Failed", created=LATER, **terminated(1, message="curve.key_secret: Permission denied"))],
     [], "PodFailed", "rank 1's pod failed 2 times; last demo-1-b: exit code 1 (Error): curve.key_secret: Permission"),
    # A failure whose rank runs again is history, not the current problem.
    ([pod("demo-1-a", 1, "Failed", **terminated(137, "OOMKilled")), pod("demo-1-b", 1, "Running")], [],
     "BrokerUnreachable", ""),
    # A Job that is not Indexed (Kubernetes 1.20 drops completionMode): no pod has a rank, each says why it failed.
    ([pod(f"demo-{s}", None, "Failed", created=f"2026-01-01T00:0{i}:00Z", **terminated(2, message=NO_RANK))
      for i, s in enumerate(("abcde", "fghij", "klmno"))],
     [], "PodFailed", f"3 pods without a rank failed; last demo-klmno: exit code 2 (Error): {NO_RANK}"),
    ([pod("demo-0-a", 0, conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": "0/3 nodes are available: 3 Insufficient cpu."}])],
     [], "Unschedulable", "rank 0 (pod demo-0-a): 0/3 nodes are available"),
])
def test_pods_own_reasons_explain_missing_ranks(mc: MiniCluster, pods: list[Any], events: list[Any],
                                                 reason: str, text: str) -> None:
    fields = derive(mc, {}, Observed(job(), None, pods=pods, events=events), NOW)
    ready = next(c for c in fields["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert text in ready.get("message", "")


def test_a_failed_job_says_how_its_pods_ended(mc: MiniCluster) -> None:
    pods = [pod("demo-abcde", None, "Failed", **terminated(2, message=NO_RANK))]
    the_job = job(Failed="BackoffLimitExceeded")
    fields = derive(mc, {}, Observed(the_job, None, pods=pods), NOW)
    failed = next(c for c in fields["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "BackoffLimitExceeded")
    assert failed["message"] == (f"Failed because BackoffLimitExceeded; a pod without a rank failed; last demo-abcde: "
                                 f"exit code 2 (Error): {NO_RANK}")


# Container statuses as a kubelet (1.30, containerd 1.7) writes them for images the runtime cannot start in.
CTR = "containerd://4f1e0c3a9b7d"
NO_RUNTIME = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create '
              'failed: unable to start container process: exec: "/mnt/minicluster/bin/mc": stat '
              '/mnt/minicluster/bin/mc: no such file or directory: unknown')
ROOT_IMAGE = ('container has runAsNonRoot and image will run as root (pod: "demo-0-x7k2p_default('
              '9d0c4bb5-2f0e-4a61-9a57-2c1b1d7f3e10)", container: minicluster)')
NOT_WRITABLE = ("mc boot: cannot start in this image: uid 1234 cannot write the state dir /var/lib/minicluster "
                "(Read-only file system)")


def kubelet_status(name: str, state: dict[str, Any], init: bool = False) -> dict[str, Any]:
    return {"name": name, "state": state, "lastState": {}, "ready": False, "restartCount": 0,
            "image": "docker.io/library/debian:bookworm", "imageID": "", **({"containerID": CTR} if state.get(
                "terminated") else {}), **({} if init else {"started": False})}


def never_ran(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message, "startedAt": "1970-01-01T00:00:00Z",
                           "finishedAt": NOW, "containerID": CTR}}


def app(state: dict[str, Any]) -> dict[str, Any]:
    return {"containerStatuses": [kubelet_status("minicluster", state)]}


def init_then_app(init_state: dict[str, Any]) -> dict[str, Any]:
    return {"initContainerStatuses": [kubelet_status("minicluster-runtime", init_state, init=True)],
            "containerStatuses": [kubelet_status("minicluster", {"waiting": {"reason": "PodInitializing"}})]}


@pytest.mark.parametrize("pods, reason, text", [
    # The application image has no runtime at the path the pod runs (the emptyDir was not filled, a wrong mode).
    ([pod("demo-0-a", 0, "Failed", **app(never_ran(128, "StartError", NO_RUNTIME)))],
     "StartError", "rank 0 (pod demo-0-a), container minicluster: exit code 128: failed to create containerd task"),
    # The runtime for another architecture: runc's exec fails after the start, the log's one line says so.
    ([pod("demo-1-a", 1, "Failed", **app(never_ran(1, "Error", "exec /mnt/minicluster/bin/mc: exec format error\n")))],
     "ExecFormatError", "rank 1 (pod demo-1-a), container minicluster: exit code 1: exec /mnt/minicluster/bin/mc"),
    # The runtime image itself cannot start its copy (the init container).
    ([pod("demo-2-a", 2, "Failed", **init_then_app(never_ran(128, "StartError", NO_RUNTIME)))],
     "StartError", "rank 2 (pod demo-2-a), container minicluster-runtime: exit code 128"),
    # `mc boot`'s own start checks.
    ([pod("demo-3-a", 3, "Failed", **app(never_ran(125, "Error", NOT_WRITABLE + "\n")))],
     "RuntimeCannotStart", "rank 3 (pod demo-3-a), container minicluster: exit code 125: mc boot: cannot start"),
    # runAsNonRoot with an image whose USER is root: the kubelet never creates the container, the pod waits.
    ([pod("demo-0-a", 0, **app({"waiting": {"reason": "CreateContainerConfigError", "message": ROOT_IMAGE}}))],
     "CreateContainerConfigError", "rank 0 (pod demo-0-a): container has runAsNonRoot and image will run as root"),
    # The runtime image cannot be pulled: only the init container's status says so.
    ([pod("demo-1-a", 1, **init_then_app({"waiting": {"reason": "ImagePullBackOff",
                                                      "message": 'Back-off pulling image "ghcr.io/x/runtime:9"'}}))],
     "ImagePullBackOff", 'rank 1 (pod demo-1-a): Back-off pulling image "ghcr.io/x/runtime:9"'),
])
def test_an_image_the_runtime_cannot_start_in_is_the_ready_reason_at_the_first_poll(
        mc: MiniCluster, pods: list[Any], reason: str, text: str) -> None:
    fields = derive(mc, {}, Observed(job(), None, pods=pods), NOW)
    ready = next(c for c in fields["conditions"] if c["type"] == "Ready")
    assert (fields["phase"], ready["status"], ready["reason"]) == ("Pending", "False", reason)
    assert text in ready["message"]


def test_a_batch_command_that_exits_125_itself_is_no_start_failure(mc: MiniCluster) -> None:
    pods = [pod("demo-0-a", 0, "Failed", **app(never_ran(125, "Error", "git bisect: skip")))]
    ready = next(c for c in derive(mc, {}, Observed(job(), None, pods=pods), NOW)["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "PodFailed"


def test_a_job_failed_by_its_pod_failure_policy_names_the_start_failure(mc: MiniCluster) -> None:
    pods = [pod("demo-0-a", 0, "Failed", **app(never_ran(128, "StartError", NO_RUNTIME)))]
    the_job = job(Failed="PodFailurePolicy")
    fields = derive(mc, {}, Observed(the_job, None, pods=pods), NOW)
    states = conditions(fields)
    assert fields["phase"] == "Failed" and states["Failed"] == ("True", "StartError")
    assert states["Ready"] == ("False", "StartError")
    failed = next(c for c in fields["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("Failed because PodFailurePolicy; rank 0 (pod demo-0-a), container minicluster")


def durability(fields: dict[str, Any]) -> tuple[str, str]:
    cond = next(c for c in fields["conditions"] if c["type"] == "StateDurable")
    return cond["status"], cond["reason"]


def test_state_without_storage_is_said_to_die_with_the_pod_and_its_loss_is_reported(mc: MiniCluster) -> None:
    first = derive(mc, {}, Observed(job(), {**BROKER, "epoch": 1, "started": "t1"}), NOW)
    assert durability(first) == ("False", "EmptyDir")
    durable = next(c for c in first["conditions"] if c["type"] == "StateDurable")
    assert "dies with the broker's pod" in durable["message"]
    same = derive(mc, first, Observed(job(), {**BROKER, "epoch": 1, "started": "t1"}), LATER)
    assert durability(same) == ("False", "EmptyDir")
    # A new broker whose epoch did not grow started from an empty journal.
    lost = derive(mc, same, Observed(job(), {**BROKER, "epoch": 1, "started": "t2"}), LATER)
    assert durability(lost) == ("False", "StateLost")
    assert durability(derive(mc, lost, Observed(job(), {**BROKER, "epoch": 1, "started": "t2"}), LATER)) == \
        ("False", "StateLost")


def test_state_with_storage_is_durable_and_a_restart_resumes(make_body: Any) -> None:
    mc = MiniCluster.from_body(make_body(storage={"size": "1Gi"}))
    first = derive(mc, {}, Observed(job(), {**BROKER, "epoch": 1, "started": "t1"}), NOW)
    assert durability(first) == ("True", "PersistentVolumeClaim")
    resumed = derive(mc, first, Observed(job(), {**BROKER, "epoch": 2, "started": "t2"}), LATER)
    assert durability(resumed) == ("True", "Resumed") and resumed["broker"] == {"epoch": 2, "started": "t2"}


def test_with_storage_a_failed_workers_job_fails_the_minicluster(make_body: Any) -> None:
    mc = MiniCluster.from_body(make_body(storage={"size": "1Gi"}))
    fields = derive(mc, {}, Observed(job(), BROKER, workers=job(Failed="PodFailurePolicy")), NOW)
    assert fields["phase"] == "Failed"
    # Index 0 of the workers' Job completes at once (rank 0 has its own Job): that is no success.
    assert derive(mc, {}, Observed(job(), BROKER, workers=job(Complete="Completed")), NOW)["phase"] == "Pending"


def test_metrics_text() -> None:
    metrics = Metrics()
    metrics.reconciled("reconcile")
    metrics.failed("status")
    metrics.set_phase("a", "x", "Running")
    metrics.set_phase("b", "y", "Running")
    metrics.set_phase("b", "z", "Failed")
    metrics.forget("b", "z")
    text = metrics.render()
    assert 'minicluster_operator_reconciles_total{handler="reconcile"} 1' in text
    assert 'minicluster_operator_errors_total{handler="status"} 1' in text
    assert 'minicluster_operator_miniclusters{phase="Running"} 2' in text
    assert 'minicluster_operator_miniclusters{phase="Failed"} 0' in text


async def test_metrics_endpoint_serves_prometheus_text() -> None:
    import socket

    import aiohttp

    from minicluster.operator.metrics import serve
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics()
    metrics.reconciled("status")
    runner = await serve(metrics, "127.0.0.1", port)
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200 and resp.content_type == "text/plain"
            assert 'handler="status"} 1' in await resp.text()
    finally:
        await runner.cleanup()


def test_broker_access_inside_and_outside_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from minicluster.operator.kube import Kube
    from minicluster.operator.runner import own_status_fetcher
    from minicluster.operator.status import HttpStatusFetcher, ProxyStatusFetcher

    kube = Kube(lambda: None)  # type: ignore[arg-type, return-value]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert isinstance(own_status_fetcher(kube, "auto", "cluster.local"), ProxyStatusFetcher)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert isinstance(own_status_fetcher(kube, "auto", "cluster.local"), HttpStatusFetcher)
    assert isinstance(own_status_fetcher(kube, "proxy", "cluster.local"), ProxyStatusFetcher)
    with pytest.raises(ValueError, match="choose one of auto, dns, proxy"):
        own_status_fetcher(kube, "carrier-pigeon", "cluster.local")
