"""The share of a 1.33 Job controller that Kubernetes 1.20 lacks, for the Jobs a MiniCluster renders.

The 1.20 API server drops `completionMode`, `successPolicy` and `podFailurePolicy` from the Job, so the rules
come from the Job as the operator renders it (`manifests.jobs()` of its MiniCluster, "the intended Job"):
* the index rule: a new pod gets the lowest index that no sibling holds; a sibling that is not Failed holds its
  index, a terminating one too, so a replacement starts only once its predecessor is gone (podReplacementPolicy
  Failed, which a podFailurePolicy implies); a NonIndexed Job's pod likewise waits for room under parallelism;
* the verdict: `successPolicy` (index 0 succeeded: SuccessCriteriaMet + Complete) and the podFailurePolicy's
  FailJob rule (FailureTarget + Failed), written again until the Job shows it, since 1.20's Job controller puts
  its own whole status back over it; then the Job's other pods are deleted (gracefully).
Creating pods, counting failures against backoffLimit and plain completion stay 1.20's own.

Two stand-ins use this one implementation: the emulated node (node.py), which applies the index rule when it
admits a pod onto itself, and the real-node tier's admission webhook (tests/realnode/indexed.py), which applies
it when the pod is created, since a real kubelet starts a pod as it finds it.
"""
from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from minicluster.operator import manifests
from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.spec import INDEX_KEY, KIND, MiniCluster

TERMINAL = ("Succeeded", "Failed")
Obj = dict[str, Any]
Verdict = tuple[str, str, str]  # (condition type, reason, message)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((r for r in (obj["metadata"].get("ownerReferences") or []) if r.get("kind") == kind), None)


def index_of(pod: Mapping[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    return int(value) if value is not None else None


def phase(pod: Mapping[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def exit_code(pod: Mapping[str, Any], container: str) -> int | None:
    """How `container` (an init container too: onExitCodes names either) of `pod` ended, if it did."""
    status_of = pod.get("status") or {}
    for status in [*(status_of.get("initContainerStatuses") or []), *(status_of.get("containerStatuses") or [])]:
        if status.get("name") == container and (status.get("state") or {}).get("terminated"):
            return int(status["state"]["terminated"]["exitCode"])
    return None


def finished(job: Mapping[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def by_job(pods: Iterable[Obj]) -> dict[str, list[Obj]]:
    """Pods by the uid of the Job that owns them."""
    found: dict[str, list[Obj]] = {}
    for pod in pods:
        ref = owner(pod, "Job")
        if ref:
            found.setdefault(ref["uid"], []).append(pod)
    return found


def pod_path(pod: Mapping[str, Any]) -> str:
    return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"


async def delete_pod(kube: Kube, pod: Mapping[str, Any], grace: int | None) -> None:
    """Delete this very pod (a uid precondition: not a namesake created since); gone already is fine."""
    body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod["metadata"]["uid"]}}
    if grace is not None:
        body["gracePeriodSeconds"] = grace
    try:
        await kube.request("DELETE", pod_path(pod), body)
    except ApiError as exc:
        if exc.status not in (404, 409):
            raise


def lowest_free(intended: Mapping[str, Any], siblings: Iterable[Mapping[str, Any]],
                reserved: Iterable[int] = ()) -> int | None:
    """The index a new pod of the Indexed Job gets, or None while every index is held: by a sibling that is not
    Failed (terminating ones too; Succeeded ones for good), or `reserved` (given, not yet shown by the API)."""
    held = {index_of(p) for p in siblings if phase(p) != "Failed"} | set(reserved)
    return next((i for i in range(int(intended["spec"]["completions"])) if i not in held), None)


def has_room(intended: Mapping[str, Any], siblings: Iterable[Mapping[str, Any]], reserved: int = 0) -> bool:
    """May one more pod of the NonIndexed Job start?  Only while fewer than `parallelism` siblings (terminating
    ones too) or `reserved` pods are still to end."""
    busy = sum(1 for p in siblings if phase(p) not in TERMINAL) + reserved
    return busy < int(intended["spec"].get("parallelism", 1))


def verdict(intended: Mapping[str, Any], pods: list[Obj]) -> Verdict | None:
    """What a 1.33 Job controller decides from the pods that 1.20's does not: success or FailJob, or None."""
    spec = intended["spec"]
    for rule in (spec.get("successPolicy") or {}).get("rules") or []:
        wanted = {int(i) for i in str(rule.get("succeededIndexes", "")).split(",") if i.isdigit()}
        done = {index_of(p) for p in pods if phase(p) == "Succeeded"}
        if wanted and wanted <= done:
            return "Complete", "SuccessPolicy", "Matched rules at index 0"
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        on_codes = rule.get("onExitCodes")
        if rule.get("action") != "FailJob" or not on_codes:
            continue
        for pod in pods:
            code = exit_code(pod, on_codes.get("containerName", ""))
            if phase(pod) == "Failed" and code is not None and code in on_codes["values"]:
                meta = pod["metadata"]
                return ("Failed", "PodFailurePolicy",
                        f"Container {on_codes['containerName']} for pod {meta['namespace']}/{meta['name']} failed "
                        f"with exit code {code} matching FailJob rule at index {i}")
    return None


class JobRules:
    """The intended Jobs (cached per Job uid) and the verdicts given, against one API server."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._intended: dict[str, Obj | None] = {}
        self.verdicts: dict[str, Verdict] = {}  # Job uid -> the verdict given here
        self.ended: set[str] = set()  # pod uids deleted because their Job has its verdict

    async def intended(self, job: Obj) -> Obj | None:
        """The Job as the operator rendered it (1.20 drops its newer fields), or None for other Jobs."""
        uid = job["metadata"]["uid"]
        if uid not in self._intended:
            ref = owner(job, KIND)
            body = None
            if ref is not None:
                body = await self.kube.get(
                    f"/apis/minicluster.dev/v1alpha1/namespaces/{job['metadata']['namespace']}/miniclusters/"
                    f"{ref['name']}")
            wanted = manifests.jobs(MiniCluster.from_body(body)) if body else []
            self._intended[uid] = next((j for j in wanted if j["metadata"]["name"] == job["metadata"]["name"]), None)
        return self._intended[uid]

    def is_finished(self, job: Mapping[str, Any]) -> bool:
        """Judged here, or finished by 1.20's own rules (the Job may not show a verdict given here yet)."""
        return job["metadata"]["uid"] in self.verdicts or finished(job)

    async def judge(self, job: Obj, pods: list[Obj]) -> None:
        """Give `job` (whose pods are `pods`) its verdict once the pods call for one; write it until it shows."""
        uid = job["metadata"]["uid"]
        if finished(job):
            if uid in self.verdicts:
                await self._end_pods(pods)
            return
        given = self.verdicts.get(uid)
        if given is None:
            intended = await self.intended(job)
            given = verdict(intended, pods) if intended is not None else None
            if given is None:
                return
            self.verdicts[uid] = given
        kind, reason, message = given
        stamp = now()
        first = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        conditions = [{"type": t, "status": "True", "reason": reason, "message": message,
                       "lastProbeTime": stamp, "lastTransitionTime": stamp} for t in (first, kind)]
        status: Obj = {"conditions": conditions}
        if kind == "Complete":
            status["completionTime"] = stamp
        await self.kube.merge_patch(f"/apis/batch/v1/namespaces/{job['metadata']['namespace']}/jobs/"
                                    f"{job['metadata']['name']}/status", {"status": status})
        await self._end_pods(pods)

    async def _end_pods(self, pods: list[Obj]) -> None:
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if phase(pod) not in TERMINAL and uid not in self.ended and not pod["metadata"].get("deletionTimestamp"):
                self.ended.add(uid)
                await delete_pod(self.kube, pod, grace=None)
