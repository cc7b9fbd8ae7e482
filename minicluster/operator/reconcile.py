"""Bring a MiniCluster's children in line with its spec, idempotently.

Creation happens in dependency order (key, config, DNS, claim, then the Jobs).  On
updates only the fields the operator owns are patched, and a size change goes
to the Job first: the broker learns the new size from the ConfigMap only once
the API server has accepted the new parallelism.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Mapping

import zmq

from minicluster.operator import kueue, manifests, network
from minicluster.operator.kube import ApiError, Kube, path_of
from minicluster.operator.spec import MiniCluster


class NotOwned(Exception):
    """An object with a child's name exists but belongs to someone else."""


class TemplateChanged(Exception):
    """The spec changed a pod field; a Job's pod template is immutable."""


class Unsupported(Exception):
    """The API server dropped Job fields a MiniCluster depends on: the cluster is too old (or lacks the feature)."""


async def ensure(kube: Kube, mc: MiniCluster, cluster_domain: str = "cluster.local", check_jobs: bool = True) -> None:
    existing = {(kind, name): await _get_owned(kube, mc, kind, name) for kind, name in _children(mc)}
    # Partially admitted by Kueue: the ranks run (and the broker expects) as many as Kueue started.
    mc = dataclasses.replace(mc, size=admitted_size(mc, existing[("Job", mc.name)]))
    wanted_jobs = manifests.jobs(mc)
    await _check_storage_unchanged(kube, mc, existing)
    if existing[("Secret", manifests.secret_name(mc))] is None:
        public, secret = zmq.curve_keypair()
        certificate = manifests.curve_certificate(public, secret)
        await _create(kube, manifests.secret(mc, certificate))
    config = manifests.config_map(mc, cluster_domain)
    old_config = existing[("ConfigMap", manifests.config_name(mc))]
    if old_config is None:
        await _create(kube, config)
    if existing[("Service", mc.name)] is None:
        await _create(kube, manifests.service(mc))
    if mc.network_policy and existing[("NetworkPolicy", mc.name)] is None:
        await _create(kube, network.policy(mc))
    if mc.storage and existing[("PersistentVolumeClaim", manifests.claim_name(mc))] is None:
        await _create(kube, manifests.claim(mc))
    forbidden: kueue.Forbidden | None = None
    for wanted in wanted_jobs:
        current = existing.get(("Job", wanted["metadata"]["name"]))
        kept = current if current is not None else await _create(kube, wanted)
        if check_jobs and kept is not None:
            await check_kept(kube, mc, wanted, kept)
        if kept is not None and mc.queue_name:
            # Before the Job's suspend: Kueue would un-suspend the Job of a Workload still active and admitted.
            try:
                await kueue.hold(kube, kept, active=not mc.suspend)
            except kueue.Forbidden as exc:
                forbidden = exc  # said once the rest is in line
        if kept is not None:  # a new Job too: its backoffLimit depends on what the API server kept
            await _update_job(kube, mc, wanted, kept)
    if old_config is not None and old_config.get("data") != config["data"]:
        path = path_of("ConfigMap", mc.namespace, config["metadata"]["name"])
        await kube.merge_patch(path, {"data": config["data"]})
    for wanted in wanted_jobs:
        current = existing.get(("Job", wanted["metadata"]["name"]))
        if current is not None:
            await _check_template(kube, mc, wanted, current)
    if forbidden is not None:
        raise forbidden


async def _check_storage_unchanged(kube: Kube, mc: MiniCluster, existing: Mapping[tuple[str, str], Any]) -> None:
    # With storage rank 0 has its own Job: adding or dropping it would run two brokers, or none.
    if mc.storage:
        if existing[("Job", mc.name)] is not None and existing[("Job", mc.broker_job_name)] is None:
            raise TemplateChanged("spec.storage cannot be added to a running MiniCluster (rank 0 would need a "
                                  "pod of its own); recreate the MiniCluster with it")
        return
    broker_job = await kube.get(path_of("Job", mc.namespace, f"{mc.name}-broker"))
    if broker_job is not None and is_owned(broker_job, mc):
        raise TemplateChanged("spec.storage cannot be removed from a running MiniCluster; recreate it")


async def _check_template(kube: Kube, mc: MiniCluster, wanted: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    per_rank = (job.get("spec") or {}).get("backoffLimitPerIndex")
    if per_rank is not None and per_rank != wanted["spec"].get("backoffLimitPerIndex"):
        # A CEL rule refuses the edit where there is CEL; elsewhere it would be ignored without a word.
        raise TemplateChanged(
            f"spec.failurePolicy.backoffLimitPerRank is fixed at creation (the ranks' Job keeps "
            f"backoffLimitPerIndex {per_rank}, which a Job never changes); the other changes were applied")
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    recorded, asked = annotations.get(manifests.SPEC_HASH), wanted["metadata"]["annotations"][manifests.SPEC_HASH]
    if recorded is None:
        # Made by an operator version that hashed the rendered template, which says nothing about what the user
        # asked: adopt the current spec as the one the Job was made from.
        path = path_of("Job", mc.namespace, wanted["metadata"]["name"])
        await kube.merge_patch(path, {"metadata": {"annotations": {
            manifests.SPEC_HASH: asked, manifests.OLD_TEMPLATE_HASH: None}}})
        return
    if recorded != asked:
        raise TemplateChanged(
            "changes to what the pods are made from (image, command, env, resources, volumes, placement, runtime, "
            "security, ...) do not reach running pods (a Job's pod template is immutable); size and suspend were "
            "applied. Recreate the MiniCluster to apply them")


def admitted_size(mc: MiniCluster, job: Mapping[str, Any] | None) -> int:
    """spec.size, or the parallelism Kueue started the Job with where it may admit fewer (spec.minSize): its
    partial admission lowers parallelism and completions, which the operator then keeps (Kueue would take a Job
    of another size for another job), and restores them when it stops the Job."""
    spec = (job or {}).get("spec") or {}
    if mc.queue_name and mc.min_size and spec.get("parallelism") and not spec.get("suspend"):
        return int(spec["parallelism"])
    return mc.size


def _children(mc: MiniCluster) -> list[tuple[str, str]]:
    children = [
        ("Secret", manifests.secret_name(mc)),
        ("ConfigMap", manifests.config_name(mc)),
        ("Service", mc.name),
        ("Job", mc.name),
    ]
    if mc.storage:
        children += [("Job", mc.broker_job_name), ("PersistentVolumeClaim", manifests.claim_name(mc))]
    if mc.network_policy:
        children.append(("NetworkPolicy", mc.name))
    return children


async def _get_owned(kube: Kube, mc: MiniCluster, kind: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(path_of(kind, mc.namespace, name))
    if obj is not None and not is_owned(obj, mc):
        raise NotOwned(f"{kind} {mc.namespace}/{name} exists and is not owned by this MiniCluster; "
                       f"refusing to touch it (rename the MiniCluster or remove that {kind})")
    return obj


def is_owned(obj: Mapping[str, Any], mc: MiniCluster) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == mc.uid and ref.get("controller") for ref in refs)


async def _create(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The object as the API server stored it, by us or by a concurrent reconcile (e.g. the status poll racing
    create) that got there first."""
    meta = manifest["metadata"]
    try:
        return await kube.create(path_of(manifest["kind"], meta["namespace"]), manifest)
    except ApiError as exc:
        if exc.status != 409:
            raise
        return await kube.get(path_of(manifest["kind"], meta["namespace"], meta["name"]))


def lacks_fields(mc: MiniCluster, found: Mapping[str, Mapping[str, Any] | None]) -> bool:
    """Whether the API server dropped fields of any of the MiniCluster's Jobs in `found` (by name)."""
    for wanted in manifests.jobs(mc):
        job = found.get(wanted["metadata"]["name"])
        if job is not None and manifests.dropped_fields(wanted, dict(job)):
            return True
    return False


async def check_kept(kube: Kube, mc: MiniCluster, wanted: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    """Raise Unsupported if the API server dropped Job fields the MiniCluster needs, after stopping the Job.

    Without `completionMode: Indexed` no pod gets a rank and each exits 2 at once, to be replaced until the
    backoff limit; the others change what a failure or a success does. The Job is stopped with `parallelism: 0`,
    which every Kubernetes version accepts (`suspend` is unknown exactly where `completionMode` is) and the
    operator's RBAC allows (it deletes nothing); the Job stays as evidence, so it is not created again either.
    """
    dropped = manifests.dropped_fields(dict(wanted), dict(job))
    if not dropped:
        return
    if (job.get("spec") or {}).get("parallelism") != 0:
        await kube.merge_patch(path_of("Job", mc.namespace, wanted["metadata"]["name"]), {"spec": {"parallelism": 0}})
    version = await _server_version(kube)
    needed = max((manifests.JOB_FIELDS[f] for f in dropped), key=lambda v: tuple(map(int, v.split("."))))
    raise Unsupported(
        f"the API server ({version}) dropped the Job field(s) {', '.join(dropped)}"
        + (": it has no Indexed Jobs, so no pod would learn its rank" if "completionMode" in dropped else "")
        + f". MiniClusters need Kubernetes {needed} or newer with these features on; the Job "
        f"{wanted['metadata']['name']} is stopped (parallelism 0). Recreate the MiniCluster after an upgrade")


async def _server_version(kube: Kube) -> str:
    try:
        info = await kube.get("/version") or {}
    except ApiError:
        info = {}
    return f"Kubernetes {info['gitVersion']}" if info.get("gitVersion") else "Kubernetes version unknown"


async def _update_job(kube: Kube, mc: MiniCluster, wanted: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    patch = job_patch(mc, job, wanted["spec"]["completions"], manifests.kept_backoff_limit(mc, wanted, job))
    if patch:
        await kube.merge_patch(path_of("Job", mc.namespace, wanted["metadata"]["name"]), {"spec": patch})


def job_patch(mc: MiniCluster, job: Mapping[str, Any], completions: int | None = None,
              backoff_limit: int | None = None) -> dict[str, Any]:
    """The Job spec fields that must change; empty when the Job is up to date."""
    spec = job.get("spec") or {}
    size = mc.size if completions is None else completions
    patch: dict[str, Any] = {}
    # Elastic Indexed Jobs accept a new size only with completions == parallelism.
    if spec.get("completions") != size or spec.get("parallelism") != size:
        patch["completions"] = size
        patch["parallelism"] = size
    wanted = wanted_suspend(mc, bool(spec.get("suspend")))
    if wanted != bool(spec.get("suspend")):
        patch["suspend"] = wanted
    # The failure limit a Job lets change (backoffLimitPerIndex is fixed at creation).
    if backoff_limit is not None and spec.get("backoffLimit") != backoff_limit:
        patch["backoffLimit"] = backoff_limit
    return patch


def wanted_suspend(mc: MiniCluster, current: bool) -> bool:
    # Under Kueue, un-suspending is Kueue's admission decision, never ours; suspending goes through the Workload
    # too (kueue.hold), which keeps Kueue from un-suspending the Job again.
    if mc.suspend:
        return True
    return current if mc.queue_name else False
