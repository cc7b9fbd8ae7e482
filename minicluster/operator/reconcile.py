"""Bring a MiniCluster's children in line with its spec, idempotently.

Creation happens in dependency order (key, config, DNS, then the Job).  On
updates only the fields the operator owns are patched, and a size change goes
to the Job first: the broker learns the new size from the ConfigMap only once
the API server has accepted the new parallelism.
"""
from __future__ import annotations

from typing import Any, Mapping

import zmq

from minicluster.operator import manifests
from minicluster.operator.kube import ApiError, Kube, path_of
from minicluster.operator.spec import MiniCluster


class NotOwned(Exception):
    """An object with a child's name exists but belongs to someone else."""


class TemplateChanged(Exception):
    """The spec changed a pod field; a Job's pod template is immutable."""


async def ensure(kube: Kube, mc: MiniCluster, cluster_domain: str = "cluster.local") -> None:
    existing = {kind: await _get_owned(kube, mc, kind, name) for kind, name in _children(mc)}
    if existing["Secret"] is None:
        public, secret = zmq.curve_keypair()
        certificate = manifests.curve_certificate(public, secret)
        await _create(kube, manifests.secret(mc, certificate))
    config = manifests.config_map(mc, cluster_domain)
    if existing["ConfigMap"] is None:
        await _create(kube, config)
    if existing["Service"] is None:
        await _create(kube, manifests.service(mc))
    if existing["Job"] is None:
        await _create(kube, manifests.job(mc))
    else:
        await _update_job(kube, mc, existing["Job"])
    if existing["ConfigMap"] is not None and existing["ConfigMap"].get("data") != config["data"]:
        path = path_of("ConfigMap", mc.namespace, config["metadata"]["name"])
        await kube.merge_patch(path, {"data": config["data"]})
    if existing["Job"] is not None:
        _check_template(mc, existing["Job"])


def _check_template(mc: MiniCluster, job: Mapping[str, Any]) -> None:
    recorded = ((job.get("metadata") or {}).get("annotations") or {}).get(manifests.TEMPLATE_HASH)
    if recorded and recorded != manifests.template_hash(mc):
        raise TemplateChanged(
            "changes to image, command, env, resources, volumes or placement do not reach "
            "running pods (a Job's pod template is immutable); size and suspend were applied. "
            "Recreate the MiniCluster to apply them")


def _children(mc: MiniCluster) -> list[tuple[str, str]]:
    return [
        ("Secret", manifests.secret_name(mc)),
        ("ConfigMap", manifests.config_name(mc)),
        ("Service", mc.name),
        ("Job", mc.name),
    ]


async def _get_owned(kube: Kube, mc: MiniCluster, kind: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(path_of(kind, mc.namespace, name))
    if obj is not None and not is_owned(obj, mc):
        raise NotOwned(f"{kind} {mc.namespace}/{name} exists and is not owned by this MiniCluster; "
                       f"refusing to touch it (rename the MiniCluster or remove that {kind})")
    return obj


def is_owned(obj: Mapping[str, Any], mc: MiniCluster) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == mc.uid and ref.get("controller") for ref in refs)


async def _create(kube: Kube, manifest: dict[str, Any]) -> None:
    meta = manifest["metadata"]
    try:
        await kube.create(path_of(manifest["kind"], meta["namespace"]), manifest)
    except ApiError as exc:
        # A concurrent reconcile (e.g. resume racing create) got there first.
        if exc.status != 409:
            raise


async def _update_job(kube: Kube, mc: MiniCluster, job: Mapping[str, Any]) -> None:
    patch = job_patch(mc, job)
    if patch:
        await kube.merge_patch(path_of("Job", mc.namespace, mc.name), {"spec": patch})


def job_patch(mc: MiniCluster, job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job spec fields that must change; empty when the Job is up to date."""
    spec = job.get("spec") or {}
    patch: dict[str, Any] = {}
    # Elastic Indexed Jobs accept a new size only with completions == parallelism.
    if spec.get("completions") != mc.size or spec.get("parallelism") != mc.size:
        patch["completions"] = mc.size
        patch["parallelism"] = mc.size
    wanted = wanted_suspend(mc, bool(spec.get("suspend")))
    if wanted != bool(spec.get("suspend")):
        patch["suspend"] = wanted
    return patch


def wanted_suspend(mc: MiniCluster, current: bool) -> bool:
    # Under Kueue, un-suspending is Kueue's admission decision, never ours.
    if mc.suspend:
        return True
    return current if mc.queue_name else False
