"""The emulated node: a kubelet, a scheduler and the 1.33 Job semantics the 1.20 control plane lacks.

Each sync (every 0.2 s) reads pods, Jobs and claims from the real API server and:
* binds pending pods to this Node (the only node; no scheduler runs) and starts their containers (kubelet.py),
  writing their status back: Pending, Running with the pod IP, then Succeeded or Failed with the exit code;
* handles graceful deletion: SIGTERM, the grace period, SIGKILL, final status, then the final delete;
* plays the parts of a 1.33 Job controller that 1.20 drops from the Job (taken from the Job the operator
  renders for its MiniCluster, `manifests.jobs()`): Indexed completion (the lowest free index as the pod's
  `batch.kubernetes.io/job-completion-index` annotation and label, JOB_COMPLETION_INDEX, hostname
  JOB-INDEX), a replacement starting only once its predecessor is gone (podReplacementPolicy Failed),
  `successPolicy` (index 0 succeeded: Job SuccessCriteriaMet + Complete, the rest terminated) and the
  podFailurePolicy's FailJob rule (FailureTarget + Failed, the rest terminated): the rules of jobs.py, which
  the real-node tier's stand-in shares; the node applies the index rule when it admits a pod onto itself.
  Creating replacement pods, counting failures against backoffLimit and plain completion stay 1.20's own.
  Not emulated: the Ignore rule for DisruptionTarget (1.20 counts those failures too), `suspend`, elastic
  resizing;
* provisions claims as a local-path provisioner would (a hostPath PersistentVolume per claim, deleted when
  released);
* keeps cluster DNS as hosts entries in every pod (HOSTNAME.SUBDOMAIN.NS.svc.cluster.local).
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicluster.operator.kube import ApiError, Kube
from minicluster.operator.spec import INDEX_KEY
from tests.e2e import kubelet
from tests.e2e.image import AnyImage
from tests.e2e.jobs import (
    TERMINAL, JobRules, Obj, by_job, delete_pod, has_room, index_of, lowest_free, now, owner, phase, pod_path,
)
from tests.e2e.network import Bridge
from tests.e2e.provisioner import LocalPathProvisioner
import contextlib

log = logging.getLogger("e2e.node")
FAMILY_LABEL = "e2e.minicluster.dev/ip-family"


@dataclass
class Launch:
    """One container of a pod, ready to start."""
    spec: Obj
    c: kubelet.Container
    argv: list[str]
    cwd: str
    mounts: list[Obj]
    image: AnyImage


class Node:
    def __init__(self, kube: Kube, run_id: str, workdir: Path, images: Mapping[str, AnyImage], checkout: Path,
                 bridge: Bridge, api: tuple[str, int]) -> None:
        self.kube = kube
        self.run_id = run_id
        self.name = f"e2e-node-{run_id}"
        self.workdir = workdir
        self.images = dict(images)  # image name -> the image; tests add application images (appimages.py)
        self.api = api  # the API server's address and port as pods reach it (KUBERNETES_SERVICE_HOST/PORT)
        self._kubernetes_service = (api[0], "kubernetes.default.svc.cluster.local",
                                    "kubernetes.default.svc kubernetes.default")
        self.checkout = checkout
        self.bridge = bridge
        self.port = 0
        self.containers: dict[str, kubelet.Container] = {}  # pod uid -> its container
        self.tasks: dict[str, asyncio.Task[None]] = {}
        # Pods whose containers were started: never started again (restartPolicy Never), even from a pod list
        # read before their final status was written.
        self.ran: set[str] = set()
        self.indexes: dict[str, int] = {}  # pod uid -> index given (before the API server shows it)
        self.jobs = JobRules(kube)
        self.provisioner = LocalPathProvisioner(kube, run_id, workdir / "volumes")
        self.ns_family: dict[str, str] = {}
        self._hosts: dict[str, list[tuple[str, str, str]]] = {}
        self._heartbeat = 0.0
        self._terminating: set[asyncio.Task[None]] = set()  # referenced until done: bare tasks may be collected

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def register(self, port: int) -> None:
        self.port = port
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name,
                                                           "kubernetes.io/os": "linux"}},
                "status": self._node_status()}
        await self.kube.create("/api/v1/nodes", node)

    def _node_status(self) -> Obj:
        stamp = now()
        return {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                "capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "24Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "minicluster e2e node", "lastHeartbeatTime": stamp,
                                "lastTransitionTime": stamp}]}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:  # one bad sync must not end the node; the next one retries
                log.exception("node sync failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        await self.shutdown()

    async def shutdown(self) -> None:
        for c in list(self.containers.values()):
            kubelet.signal_container(c, signal.SIGKILL)
            if c.proc is not None and c.proc.returncode is None:
                c.proc.kill()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=15)

    # --- one sync --------------------------------------------------------------------------------------------

    async def sync(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._heartbeat > 10:
            self._heartbeat = loop.time()
            await self.kube.merge_patch(f"/api/v1/nodes/{self.name}/status", {"status": self._node_status()})
        await self.provisioner.sync()
        pods = (await self.kube.get("/api/v1/pods"))["items"]
        jobs = (await self.kube.get("/apis/batch/v1/jobs"))["items"]
        pods_of = by_job(pods)
        job_of = {job["metadata"]["uid"]: job for job in jobs}
        for job in jobs:
            await self.jobs.judge(job, pods_of.get(job["metadata"]["uid"], []))
        for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            ref = owner(pod, "Job")
            job = job_of.get(ref["uid"]) if ref else None
            await self._handle(pod, job, pods_of.get(ref["uid"], []) if ref else [])
        self._update_hosts()

    async def _handle(self, pod: Obj, job: Obj | None, siblings: list[Obj]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if spec.get("nodeName") not in (None, self.name):
            return
        c = self.containers.get(uid)
        if meta.get("deletionTimestamp"):
            if c is not None and not c.stopping and c.exit_code is None:
                grace = float(meta.get("deletionGracePeriodSeconds", 30))
                stopping = asyncio.ensure_future(kubelet.terminate(c, grace))
                self._terminating.add(stopping)
                stopping.add_done_callback(self._terminating.discard)
            elif uid not in self.tasks and spec.get("nodeName") == self.name:
                await self._finalize(pod)
            return
        if uid in self.tasks or uid in self.ran or phase(pod) in TERMINAL:
            return
        if job is not None and self.jobs.is_finished(job):
            return
        if not spec.get("nodeName"):
            if job is not None and not await self._admit(pod, job, siblings):
                return
            await self._bind(pod)
        self.tasks[uid] = asyncio.ensure_future(self._run_pod(uid, meta["namespace"], meta["name"]))
        self.tasks[uid].add_done_callback(lambda _t, uid=uid: self.tasks.pop(uid, None))

    # --- the 1.33 Job controller's share (jobs.py) -----------------------------------------------------------

    async def _admit(self, pod: Obj, job: Obj, siblings: list[Obj]) -> bool:
        """May this new pod of `job` start now?  Indexed: give it the lowest free index.  Either way a pod
        starts only once its predecessor is fully gone."""
        intended = await self.jobs.intended(job) or job
        others = [p for p in siblings if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        if intended["spec"].get("completionMode") != "Indexed":
            return has_room(intended, [p for p in others if p["spec"].get("nodeName")])
        given = [self.indexes[p["metadata"]["uid"]] for p in others
                 if phase(p) != "Failed" and p["metadata"]["uid"] in self.indexes]
        index = lowest_free(intended, others, given)
        if index is None:
            return False
        self.indexes[pod["metadata"]["uid"]] = index
        patch = {"metadata": {"annotations": {INDEX_KEY: str(index)}, "labels": {INDEX_KEY: str(index)}}}
        await self.kube.merge_patch(pod_path(pod), patch)
        return True

    # --- pods ------------------------------------------------------------------------------------------------

    async def _bind(self, pod: Obj) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}}
        await self.kube.create(f"{pod_path(pod)}/binding", binding)

    async def _finalize(self, pod: Mapping[str, Any]) -> None:
        await delete_pod(self.kube, pod, grace=0)

    async def _patch_status(self, namespace: str, name: str, status: Obj) -> None:
        # Strategic merge: conditions merge by type, so others' (e.g. DisruptionTarget) are kept, as a kubelet does.
        try:
            await self.kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                                    {"status": status}, "application/strategic-merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def _run_pod(self, uid: str, namespace: str, name: str) -> None:
        pod = await self.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        try:
            launches = await self._prepare(pod)
        except kubelet.CannotStart as exc:
            await self._waiting(pod, exc)
            return
        except Exception as exc:  # a harness failure shows on the pod, as a runtime's would
            log.exception("preparing pod %s/%s", namespace, name)
            await self._waiting(pod, kubelet.CannotStart("RunContainerError", str(exc)))
            return
        self.ran.add(uid)
        *inits, main = launches
        c = main.c
        try:
            if await self._run_inits(pod, inits):
                await kubelet.start(c, main.argv, main.cwd, main.mounts, self.checkout, main.image, main.spec)
                c.started_at = now()
                self.containers[uid] = c
                await self._patch_status(namespace, name, self._running_status(pod, c, inits))
                code = await kubelet.wait(c)
                await self._patch_status(namespace, name, self._ended_status(pod, c, code, inits))
        except Exception:
            log.exception("running pod %s/%s", namespace, name)
        finally:
            if c.exit_code is None:
                c.exit_code = kubelet.START_ERROR
                c.done.set()
            kubelet.cleanup(c, self.bridge)
            self._update_hosts()
        if self.containers[uid].stopping:
            await self._finalize(pod)

    async def _run_inits(self, pod: Obj, inits: list[Launch]) -> bool:
        """The init containers, one after the other, each to its end, before the main container: True when all
        succeeded.  A failed one fails the pod (restartPolicy Never), the main container never starting."""
        meta = pod["metadata"]
        for i, launch in enumerate(inits):
            if self.containers[meta["uid"]].stopping:
                return False
            c = launch.c
            self.containers[meta["uid"]] = c  # what termination and exec reach while it runs
            await kubelet.start(c, launch.argv, launch.cwd, launch.mounts, self.checkout, launch.image, launch.spec)
            c.started_at = now()
            await self._patch_status(meta["namespace"], meta["name"], self._initializing_status(pod, inits, i))
            code = await kubelet.wait(c)
            kubelet.remove_cgroups(c.cgroups)
            if code != 0:
                status = self._initializing_status(pod, inits, i + 1)
                status["phase"] = "Failed"
                await self._patch_status(meta["namespace"], meta["name"], status)
                return False
        return True

    async def _waiting(self, pod: Obj, exc: kubelet.CannotStart) -> None:
        meta = pod["metadata"]
        status = {"phase": "Pending", "hostIP": "127.0.0.1", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False",
                                                         "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"waiting": {"reason": exc.reason,
                                                                            "message": exc.message}}}
                                  for c in pod["spec"]["containers"]]}
        await self._patch_status(meta["namespace"], meta["name"], status)
        if exc.reason == "ContainerCreating":  # e.g. a claim not bound yet: the next sync tries again
            return
        if exc.reason == "ErrImagePull":
            await asyncio.sleep(1.0)
            await self._waiting(pod, kubelet.CannotStart("ImagePullBackOff", f"Back-off pulling image: {exc.message}"))
        # Like a kubelet, keep the pod: deleting it is its owner's decision.  Hold the task until then.
        while meta["uid"] not in self.jobs.ended:
            await asyncio.sleep(1.0)
            current = await self.kube.get(pod_path(pod))
            if current is None or current["metadata"]["uid"] != meta["uid"]:
                return
            if current["metadata"].get("deletionTimestamp"):
                await self._finalize(current)
                return

    async def _prepare(self, pod: Obj) -> list[Launch]:
        """What the pod's containers need, init containers first: images, volumes (laid out once, shared),
        the pod's network and names."""
        meta, spec = pod["metadata"], pod["spec"]
        [main] = spec["containers"]
        images = {}
        for container in [*(spec.get("initContainers") or []), main]:
            images[container["name"]] = self.images.get(container["image"])
            if images[container["name"]] is None:
                raise kubelet.CannotStart("ErrImagePull", f'rpc error: pull access denied for {container["image"]}, '
                                                          "repository does not exist or may require authorization")
        objects = await self._referenced_objects(pod)
        users = {name: kubelet.user_of(spec, container, images[name])
                 for name, container in ((c["name"], c) for c in [*(spec.get("initContainers") or []), main])}
        job_ref = owner(pod, "Job")
        index = index_of(pod)
        hostname = spec.get("hostname") or (f"{job_ref['name']}-{index}" if job_ref and index is not None
                                            else meta["name"])
        subdomain = spec.get("subdomain")
        fqdn = f"{hostname}.{subdomain}.{meta['namespace']}.svc.cluster.local" if subdomain else hostname
        directory = self.workdir / "pods" / meta["uid"]
        directory.mkdir(parents=True, exist_ok=True)
        lookup = lambda kind, name: objects.get((kind, name))  # noqa: E731
        fs_group = users[main["name"]]["fs_group"]
        laid_out = kubelet.lay_out_volumes(pod, directory, lookup, lambda claim: objects[("Claim", claim)], fs_group)
        family = await self._family(meta["namespace"])
        net = await asyncio.to_thread(self.bridge.attach, family)
        (directory / "hostname").write_text(hostname + "\n")
        (directory / "resolv.conf").write_text(f"search {meta['namespace']}.svc.cluster.local svc.cluster.local "
                                               "cluster.local\noptions ndots:5\n")
        launches = []
        for container in [*(spec.get("initContainers") or []), main]:
            name, image = container["name"], images[container["name"]]
            init = container is not main
            env = kubelet.environment(pod, container, image, hostname, lookup, self.api)
            cgroups = kubelet.cgroups_for(self.run_id, f"{meta['uid']}-{name}" if init else meta["uid"], container)
            c = kubelet.Container(meta["namespace"], meta["name"], meta["uid"], hostname, fqdn, net, env,
                                  users[name], directory, cgroups, container=name, init=init)
            launches.append(Launch(container, c, kubelet.argv_of(container, image),
                                   container.get("workingDir") or image.workdir,
                                   kubelet.mounts_for(pod, container, directory, laid_out, fs_group), image))
        self.containers[meta["uid"]] = launches[0].c
        self._update_hosts()
        return launches

    async def _referenced_objects(self, pod: Obj) -> dict[tuple[str, str], Any]:
        ns = pod["metadata"]["namespace"]
        found: dict[tuple[str, str], Any] = {}
        for volume in pod["spec"].get("volumes") or []:
            sources = [volume, *((volume.get("projected") or {}).get("sources") or [])]
            for source in sources:
                if "configMap" in source:
                    name = source["configMap"]["name"]
                    found[("ConfigMap", name)] = await self.kube.get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
                if "secret" in source:
                    name = source["secret"].get("secretName") or source["secret"].get("name")
                    found[("Secret", name)] = await self.kube.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                found[("Claim", claim)] = await self._claim_dir(ns, claim)
        return found

    async def _claim_dir(self, namespace: str, claim: str) -> Path:
        pvc = await self.kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        volume = (pvc or {}).get("spec", {}).get("volumeName")
        if not volume or (pvc or {}).get("status", {}).get("phase") != "Bound":
            raise kubelet.CannotStart("ContainerCreating", f'persistentvolumeclaim "{claim}" is not bound yet')
        pv = await self.kube.get(f"/api/v1/persistentvolumes/{volume}")
        return Path(pv["spec"]["hostPath"]["path"])

    async def _family(self, namespace: str) -> str:
        if namespace not in self.ns_family:
            ns = await self.kube.get(f"/api/v1/namespaces/{namespace}") or {}
            self.ns_family[namespace] = ((ns.get("metadata") or {}).get("labels") or {}).get(FAMILY_LABEL, "ipv4")
        return self.ns_family[namespace]

    def _initializing_status(self, pod: Obj, inits: list[Launch], running: int) -> Obj:
        """Init containers before `running` ended (with their codes), the one at `running` runs, the rest wait;
        the main container waits for them all."""
        first = inits[0].c
        statuses = []
        for i, launch in enumerate(inits):
            if i < running:
                state = {"terminated": _terminated(launch.spec, launch.c)}
            elif i == running and i < len(inits) and launch.c.started_at:
                state = {"running": {"startedAt": launch.c.started_at}}
            else:
                state = {"waiting": {"reason": "PodInitializing"}}
            statuses.append(_status(launch, state, ready=i < running and launch.c.exit_code == 0))
        [container] = pod["spec"]["containers"]
        return {"phase": "Pending", "hostIP": "127.0.0.1", "podIP": first.net.address,
                "podIPs": [{"ip": a} for a in first.net.addresses], "startTime": first.started_at,
                "conditions": [{"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
                               {"type": "PodScheduled", "status": "True"}],
                "initContainerStatuses": statuses,
                "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                       "ready": False, "restartCount": 0,
                                       "state": {"waiting": {"reason": "PodInitializing"}}}]}

    def _running_status(self, pod: Obj, c: kubelet.Container, inits: list[Launch]) -> Obj:
        [container] = pod["spec"]["containers"]
        status = {"phase": "Running", "hostIP": "127.0.0.1", "podIP": c.net.address,
                  "podIPs": [{"ip": a} for a in c.net.addresses],
                  "startTime": inits[0].c.started_at if inits else c.started_at,
                  "conditions": [{"type": t, "status": "True", "lastTransitionTime": c.started_at}
                                 for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
                  "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                         "containerID": f"e2e://{c.uid}", "ready": True, "started": True,
                                         "restartCount": 0, "state": {"running": {"startedAt": c.started_at}}}]}
        if inits:
            status["initContainerStatuses"] = [_status(i, {"terminated": _terminated(i.spec, i.c)}, ready=True)
                                               for i in inits]
        return status

    def _ended_status(self, pod: Obj, c: kubelet.Container, code: int, inits: list[Launch]) -> Obj:
        [container] = pod["spec"]["containers"]
        stamp = now()
        ended = _terminated(container, c)
        return {"phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
                               for t in ("Ready", "ContainersReady")],
                "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                       "containerID": f"e2e://{c.uid}", "ready": False, "started": False,
                                       "restartCount": 0, "state": {"terminated": ended}}]}

    # --- cluster DNS and storage -----------------------------------------------------------------------------

    def _update_hosts(self) -> None:
        """Cluster DNS: a pod's own namespace by FQDN and short name (its search path), the others' pods with a
        subdomain (a headless Service's records) by FQDN only, and the `kubernetes` Service (the API server)."""
        live = [c for c in self.containers.values() if c.exit_code is None]
        for c in live:
            entries = sorted((o.net.address, o.fqdn, o.hostname if o.namespace == c.namespace else "")
                             for o in live if o.namespace == c.namespace or ".svc." in o.fqdn)
            entries.append(self._kubernetes_service)
            if self._hosts.get(c.uid) != entries:
                self._hosts[c.uid] = entries
                kubelet.write_hosts(c.hosts, entries)
        for uid in [u for u in self._hosts if u not in {c.uid for c in live}]:
            del self._hosts[uid]

    # --- for the tests ---------------------------------------------------------------------------------------

    def find(self, namespace: str, name: str) -> kubelet.Container | None:
        return next((c for c in self.containers.values()
                     if c.namespace == namespace and c.name == name and c.exit_code is None), None)

    def kill(self, namespace: str, name: str) -> None:
        """The container dies (SIGKILL, as the OOM killer or a crash would end it)."""
        c = self.find(namespace, name)
        assert c is not None, f"no running container for {namespace}/{name}"
        kubelet.signal_container(c, signal.SIGKILL)

    def logs(self, namespace: str, name: str) -> str:
        found = [c for c in self.containers.values() if c.namespace == namespace and c.name == name]
        return "".join(c.log.read_text(errors="replace") for c in found if c.log.exists())


def _status(launch: Launch, state: Obj, ready: bool) -> Obj:
    spec = launch.spec
    return {"name": spec["name"], "image": spec["image"], "imageID": "", "containerID": f"e2e://{launch.c.uid}",
            "ready": ready, "restartCount": 0, "state": state}


def _terminated(spec: Obj, c: kubelet.Container) -> Obj:
    """A container's end as a kubelet reports it: Completed or Error, or StartError when the runtime could not
    start it; with `terminationMessagePolicy: FallbackToLogsOnError` a failure's message is its log's tail (the
    last 80 lines, at most 2048 bytes), and a start failure's is the runtime's error."""
    code = c.exit_code
    log = c.log.read_text(errors="replace") if c.log.exists() else ""
    start_failure = next((line for line in log.splitlines() if line.startswith(kubelet.START_FAILED)), None)
    ended: Obj = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": c.started_at,
                  "finishedAt": now(), "containerID": f"e2e://{c.uid}"}
    if code == kubelet.START_ERROR and start_failure:
        ended.update(reason="StartError", message=start_failure)
    elif code and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        ended["message"] = "\n".join(log.splitlines()[-80:])[-2048:]
    return ended

