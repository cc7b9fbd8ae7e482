"""An emulated Kueue for the operator tests: the rules of Kueue's batch/Job integration, applied through kmock's API.

Why emulated: Kueue is a Go controller that needs Kubernetes 1.2x with Job `suspend` and its own images; this
machine has no image registry and no Go module proxy, and the real API server tier runs 1.20, which drops a Job's
`spec.suspend` (the field Kueue works through) altogether. So these rules, each as Kueue's job reconciler
(pkg/controller/jobframework/reconciler.go), its workload controller and its scheduler apply it, act on the
Jobs and Workloads that the operator and this emulator write to kmock:

* a Job labelled `kueue.x-k8s.io/queue-name` gets one Workload (kueue.x-k8s.io/v1beta1), controlled by the Job,
  labelled with the Job's uid, with one podSet `main` whose count is the Job's parallelism (or completions, if
  fewer) and whose minCount is the Job's `kueue.x-k8s.io/job-min-parallelism`, the queue name, and the
  WorkloadPriorityClass of the Job's `kueue.x-k8s.io/priority-class` label (name and value);
* the scheduler admits pending active Workloads, highest priority first and then oldest, while their pods fit
  the cluster queue's quota (in pods; BestEffortFIFO: one that does not fit does not block the next); one with
  a minCount that does not fit whole is admitted with as many pods as fit, if that is at least minCount
  (partial admission);
* a suspended Job whose Workload is admitted is started (un-suspended; a partially admitted one with
  parallelism, and with `kueue.x-k8s.io/job-completions-equal-parallelism` completions, set to the admitted
  count): also when someone else suspended it, so a Job's `spec.suspend: true` does not stick while its
  Workload is admitted and active;
* a running Job whose Workload is not admitted is stopped (suspended; a partially admittable one gets its
  Workload's parallelism back);
* an admitted Workload matches its Job when the Job's count is the admitted count (the podSet's count unless
  partially admitted);
* a Workload with `spec.active: false` is evicted (condition Evicted, reason InactiveWorkload): its Job is
  suspended and its admission cleared, and it stays out of admission until it is active again, when it is
  queued anew;
* a Job whose podSets no longer match its Workload (e.g. another parallelism) is a different job: a running one
  is suspended, the Workload is deleted, and a new one is made and queued.

Not emulated: resource flavors (and the node selectors Kueue injects for them), cohorts and borrowing,
preemption, admission checks, waitForPodsReady, finished Jobs (these tests' Jobs never finish).
"""
from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

import kmock as kmocklib

WORKLOADS = "kueue.x-k8s.io/v1beta1/workloads"
WORKLOADS_URL = "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads"
JOBS_URL = "/apis/batch/v1/namespaces/default/jobs"
# Kueue's own labels: the LocalQueue and WorkloadPriorityClass it reads from a Job, the Job's uid on its Workload.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
COMPLETIONS_EQUAL = "kueue.x-k8s.io/job-completions-equal-parallelism"
MERGE = {"Content-Type": "application/merge-patch+json"}
Obj = dict[str, Any]


def install(kmock: kmocklib.KubernetesEmulator) -> None:
    """The Workload kind, as Kueue's CRD makes it known to the API server."""
    kmock.resources[WORKLOADS] = kmocklib.ResourceInfo(
        kind="Workload", namespaced=True, verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        subresources={"status"})


class EmulatedKueue:
    def __init__(self, kmock: kmocklib.KubernetesEmulator, quota_pods: int,
                 priorities: Mapping[str, int] | None = None) -> None:
        self.kmock = kmock
        self.quota_pods = quota_pods
        self.priorities = dict(priorities or {})
        # What Kueue did, in order: (action, Job or Workload name); action is created, deleted, admitted,
        # evicted, started or stopped.
        self.actions: list[tuple[str, str]] = []
        self.rounds = 0
        self._serial = itertools.count(1)

    async def run(self) -> None:
        while True:
            await self.sync()
            self.rounds += 1
            await asyncio.sleep(0.05)

    async def sync(self) -> None:
        for workload in await self._list(WORKLOADS_URL):
            await self._deactivate_or_requeue(workload)
        jobs = [job for job in await self._list(JOBS_URL) if (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)]
        for job in jobs:
            await self._reconcile_job(job, await self._list(WORKLOADS_URL))
        await self._schedule(await self._list(WORKLOADS_URL))

    def did(self, action: str) -> list[str]:
        return [name for done, name in self.actions if done == action]

    # The workload controller: an inactive Workload is evicted; a reactivated one is queued again.
    async def _deactivate_or_requeue(self, workload: Obj) -> None:
        name = workload["metadata"]["name"]
        active = workload["spec"].get("active", True)
        if not active and admitted(workload) and not evicted(workload):
            await self._status(name, {"conditions": [condition("Evicted", "InactiveWorkload",
                                                                "The workload is deactivated")]})
            self.actions.append(("evicted", name))
        elif active and evicted(workload) and not admitted(workload):
            await self._status(name, {"conditions": []})

    # The job reconciler.
    async def _reconcile_job(self, job: Obj, workloads: list[Obj]) -> None:
        name = job["metadata"]["name"]
        owned = [w for w in workloads if controller_name(w) == name]
        suspended = bool(job["spec"].get("suspend"))
        match = next((w for w in owned if matches(job, w)), None)
        if match is None and not suspended:
            # A different job now (StopReasonNoMatchingWorkload): stopped, its pod counts as the Workload had them.
            await self._suspend(name, owned[0] if len(owned) == 1 else None)
            suspended = True
        stale = [w for w in owned if w is not match]
        for workload in stale:
            await self._delete(workload["metadata"]["name"])
        if stale:
            return  # Kueue returns ErrNoMatchingWorkloads and comes back to the Job
        if match is None:
            await self._create_workload(job)
        elif evicted(match):
            if not suspended:
                await self._suspend(name, match)
            if admitted(match):
                await self._status(match["metadata"]["name"], {"admission": None})
        elif suspended and admitted(match):
            await self._patch(f"{JOBS_URL}/{name}", {"spec": {"suspend": False, **counts(job, assigned(match))}})
            self.actions.append(("started", name))
        elif not suspended and not admitted(match):
            await self._suspend(name, match)

    async def _create_workload(self, job: Obj) -> None:
        meta = job["metadata"]
        priority_class = (meta.get("labels") or {}).get(PRIORITY_LABEL, "")
        name = f"job-{meta['name']}-{next(self._serial)}"
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {
                "name": name, "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]} if meta.get("uid") else {},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                     "uid": meta.get("uid"), "controller": True}],
            },
            "spec": {
                "podSets": pod_sets(job), "queueName": meta["labels"][QUEUE_LABEL], "active": True,
                **({"priorityClassName": priority_class, "priority": self.priorities[priority_class],
                    "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"} if priority_class else {}),
            },
        }
        async with self.kmock.post(WORKLOADS_URL, json=workload) as resp:
            assert resp.status < 300, await resp.text()
        self.actions.append(("created", name))

    # The scheduler.
    async def _schedule(self, workloads: list[Obj]) -> None:
        used = sum(sum(pod_counts(w["spec"]["podSets"])) for w in workloads if admitted(w))
        pending = [w for w in workloads if not admitted(w) and not evicted(w) and w["spec"].get("active", True)]
        pending.sort(key=lambda w: -int(w["spec"].get("priority") or 0))  # stable: oldest first within a priority
        for workload in pending:
            [wanted] = workload["spec"]["podSets"]
            pods = min(wanted["count"], self.quota_pods - used)
            if pods == wanted["count"] or (wanted.get("minCount") is not None and pods >= wanted["minCount"]):
                used += pods
                assignments = [{"name": wanted["name"], "count": pods}]
                await self._status(workload["metadata"]["name"], {
                    "admission": {"clusterQueue": "cluster-queue", "podSetAssignments": assignments},
                    "conditions": [condition("QuotaReserved", "QuotaReserved", "reserved"),
                                   condition("Admitted", "Admitted", "admitted")]})
                self.actions.append(("admitted", workload["metadata"]["name"]))

    async def _suspend(self, job: str, workload: Obj | None = None) -> None:
        """stopJob: suspend, and give a partially admittable Job its Workload's count back (RestorePodSetsInfo)."""
        current = await self._get(f"{JOBS_URL}/{job}")
        restored = counts(current, workload["spec"]["podSets"][0]["count"]) if workload else {}
        await self._patch(f"{JOBS_URL}/{job}", {"spec": {"suspend": True, **restored}})
        self.actions.append(("stopped", job))

    async def _delete(self, workload: str) -> None:
        async with self.kmock.delete(f"{WORKLOADS_URL}/{workload}") as resp:
            assert resp.status < 300, await resp.text()
        self.actions.append(("deleted", workload))

    async def _status(self, workload: str, status: Obj) -> None:
        await self._patch(f"{WORKLOADS_URL}/{workload}/status", {"status": status})

    async def _patch(self, url: str, data: Obj) -> None:
        async with self.kmock.patch(url, data=json.dumps(data), headers=MERGE) as resp:
            assert resp.status < 300, await resp.text()

    async def _get(self, url: str) -> Obj:
        async with self.kmock.get(url) as resp:
            assert resp.status < 300, await resp.text()
            return dict(await resp.json())

    async def _list(self, url: str) -> list[Obj]:
        async with self.kmock.get(url) as resp:
            assert resp.status < 300, await resp.text()
            return list((await resp.json()).get("items") or [])


def pod_sets(job: Obj) -> list[Obj]:
    """The podSets of a batch/Job as Kueue derives them: one, `main`, of `parallelism` pods (`completions` if
    fewer), at least job-min-parallelism of them where the Job may be admitted partially."""
    spec, annotations = job["spec"], job["metadata"].get("annotations") or {}
    count = min(int(spec.get("parallelism", 1)), int(spec.get("completions") or spec.get("parallelism", 1)))
    least = {"minCount": int(annotations[MIN_PARALLELISM])} if MIN_PARALLELISM in annotations else {}
    return [{"name": "main", "count": count, **least, "template": spec.get("template") or {}}]


def matches(job: Obj, workload: Obj) -> bool:
    """equivalentToWorkload: the Job's count is the admitted one (a suspended Job may still have the asked one)."""
    [count] = pod_counts(pod_sets(job))
    asked = workload["spec"]["podSets"][0]["count"]
    if admitted(workload):
        return count == assigned(workload) or (bool(job["spec"].get("suspend")) and count == asked)
    return count == asked


def assigned(workload: Obj) -> int:
    return int(workload["status"]["admission"]["podSetAssignments"][0]["count"])


def counts(job: Obj, pods: int) -> Obj:
    """RunWithPodSetsInfo / RestorePodSetsInfo of a Job that may be admitted partially: parallelism (and
    completions with job-completions-equal-parallelism) set to `pods`; nothing for any other Job."""
    annotations = job["metadata"].get("annotations") or {}
    if MIN_PARALLELISM not in annotations:
        return {}
    equal = annotations.get(COMPLETIONS_EQUAL, "").lower() == "true"
    return {"parallelism": pods, **({"completions": pods} if equal else {})}


def pod_counts(sets: list[Obj]) -> list[int]:
    return [int(s["count"]) for s in sets]


def controller_name(workload: Obj) -> str | None:
    refs = workload["metadata"].get("ownerReferences") or []
    return next((r["name"] for r in refs if r.get("controller") and r.get("kind") == "Job"), None)


def admitted(workload: Obj) -> bool:
    return bool((workload.get("status") or {}).get("admission"))


def evicted(workload: Obj) -> bool:
    return any(c["type"] == "Evicted" and c["status"] == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def condition(type_: str, reason: str, message: str) -> Obj:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
