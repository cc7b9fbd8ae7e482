"""A STAND-IN for a dynamic volume provisioner, shared by the emulated node and the real-node tier: Kubernetes
1.20 from Debian ships none, and a MiniCluster with `spec.storage` needs its claim bound.

It works as the common local-path provisioner does: one host directory per claim, mode 0777 (a hostPath volume
gets no fsGroup ownership from the kubelet, so the pod's non-root user could not write otherwise), a hostPath
PersistentVolume bound to the claim, and, once the claim is gone and the volume Released, the volume and the
directory deleted (the storage class's Delete policy).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from minicluster.operator.kube import Kube

RUN_LABEL = "e2e.minicluster.dev/run"


class LocalPathProvisioner:
    def __init__(self, kube: Kube, run_id: str, directory: Path) -> None:
        self.kube = kube
        self.run_id = run_id
        self.directory = directory
        self.provisioned: set[str] = set()

    async def sync(self) -> None:
        claims = (await self.kube.get("/api/v1/persistentvolumeclaims"))["items"]
        for pvc in claims:
            meta, spec = pvc["metadata"], pvc["spec"]
            if spec.get("volumeName") or meta["uid"] in self.provisioned:
                continue
            self.provisioned.add(meta["uid"])
            path = self.directory / meta["uid"]
            path.mkdir(parents=True)
            os.chmod(path, 0o777)  # not mkdir's mode: the umask would take the group and other bits
            pv = {"apiVersion": "v1", "kind": "PersistentVolume",
                  "metadata": {"name": f"e2e-{self.run_id}-{meta['uid'][:8]}", "labels": {RUN_LABEL: self.run_id}},
                  "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                           "accessModes": spec["accessModes"], "persistentVolumeReclaimPolicy": "Retain",
                           "storageClassName": spec.get("storageClassName") or "",
                           "hostPath": {"path": str(path), "type": "Directory"},
                           "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
            await self.kube.create("/api/v1/persistentvolumes", pv)
        volumes = await self.kube.get(f"/api/v1/persistentvolumes?labelSelector={RUN_LABEL}={self.run_id}")
        for pv in volumes["items"]:
            if (pv.get("status") or {}).get("phase") == "Released":
                await self.kube.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
                shutil.rmtree(pv["spec"]["hostPath"]["path"], ignore_errors=True)
