"""One pod's container on the emulated node, as a kubelet and a container runtime would run it.

Emulated: the image (image.py: the host's / as the lower layer for the project's images; appimages.py: an
application image's own root directory, with nothing of the host or the checkout in it), a network namespace on
the node's bridge (network.py), a mount namespace with the pod's volumes (volumes.py, mounted by podinit.py),
the hostname, a PID namespace with the container command as PID 1, the user and groups from the securityContext
(runAsUser/Group, fsGroup, supplementalGroups),
`allowPrivilegeEscalation: false` as no_new_privs, `capabilities.drop: [ALL]` as an empty bounding set, the CPU
and memory limits as cgroup v1 quotas, `readOnlyRootFilesystem`, cluster DNS as hosts entries, the command
(`command`/`args` over the image's ENTRYPOINT/CMD), the container's environment (the image's, HOME, the pod
spec's, JOB_COMPLETION_INDEX, HOSTNAME, KUBERNETES_SERVICE_HOST/PORT), its log, and graceful termination
(SIGTERM, the grace period, SIGKILL).  The service-account token volume needs nothing here: on 1.20 the
ServiceAccount admission plugin adds it to the pod as a Secret volume.
Init containers run one after the other before the container, each to its end, with the pod's volumes (an
emptyDir is one host directory for all of them) and their own image, user, environment and limits; a failed one
fails the pod (initContainerStatuses, exit code and, with FallbackToLogsOnError, the log's tail).  A container
that cannot start ends with 128 and StartError, podinit's error as the message.  `kubectl exec` enters with this
host's Python (podinit.py --exec), so it needs nothing in the image.
Not emulated: seccomp profiles, probes, restarts in place (restartPolicy is Never here), sidecars, image
volumes, a `medium: Memory` emptyDir shared between a pod's containers (each mounts its own tmpfs), the pod's
startTime before its first container starts (here it is that start), image pulls (images other than the node's
fail as a registry without them would), other architectures.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import image as image_mod
from tests.e2e import volumes
from tests.e2e.network import Bridge, PodNet
import contextlib

PODINIT = Path(__file__).with_name("podinit.py")
CGROUP_V1 = Path("/sys/fs/cgroup")
START_ERROR = 128  # a container that could not start, as runtimes report it
START_FAILED = "container start failed"  # podinit.py's line in the log when it could not start the container
HOSTS_LINE = 120  # fixed-width lines: rewriting in place never leaves half a line for a concurrent reader


class CannotStart(Exception):
    """The container cannot start: (waiting reason, message) for the pod's status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Container:
    namespace: str
    name: str
    uid: str
    hostname: str
    fqdn: str
    net: PodNet
    env: dict[str, str]
    user: dict[str, Any]
    directory: Path  # the pod's: its volumes, hosts, hostname, resolv.conf
    cgroups: list[Path]
    container: str = "minicluster"
    init: bool = False  # an init container: its own files under the pod's directory
    proc: asyncio.subprocess.Process | None = None
    pid1: int | None = None
    started_at: str = ""
    exit_code: int | None = None
    stopping: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def files(self) -> Path:
        """This container's root, scratch, spec and log."""
        return self.directory / "init" / self.container if self.init else self.directory

    @property
    def log(self) -> Path:
        return self.files / "container.log"

    @property
    def hosts(self) -> Path:
        return self.directory / "hosts"


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as a number: "500m" -> 0.5, "2Gi" -> 2147483648."""
    text = str(text)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
                "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * suffixes[suffix]
    return float(text)


def user_of(pod_spec: Mapping[str, Any], container: Mapping[str, Any], image: image_mod.AnyImage) -> dict[str, Any]:
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser", image.user[0]))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", image.user[1]))
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and uid == 0:
        raise CannotStart("CreateContainerConfigError", "container has runAsNonRoot and image will run as root")
    groups = [gid, *([pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []), *(pod_sc.get("supplementalGroups") or [])]
    return {"uid": uid, "gid": gid, "groups": list(dict.fromkeys(groups)), "fs_group": pod_sc.get("fsGroup")}


def argv_of(container: Mapping[str, Any], image: image_mod.AnyImage) -> list[str]:
    """The container's command line, as Kubernetes combines `command`/`args` with ENTRYPOINT/CMD."""
    if container.get("command"):
        return [*container["command"], *(container.get("args") or [])]
    return [*image.entrypoint, *(container.get("args") or image.cmd)]


def environment(pod: Mapping[str, Any], container: Mapping[str, Any], image: image_mod.AnyImage, hostname: str,
                lookup: volumes.Lookup, api: tuple[str, int]) -> dict[str, str]:
    """The image's ENV, HOSTNAME, HOME (the image user's, from its passwd), the `kubernetes` Service's
    KUBERNETES_SERVICE_HOST/PORT (here the API server's own address on the bridge: no kube-proxy runs, so
    there is no ClusterIP to point at), JOB_COMPLETION_INDEX, then the container's `env`."""
    env = {**image.env, "HOSTNAME": hostname, "HOME": image.home,
           "KUBERNETES_SERVICE_HOST": api[0], "KUBERNETES_SERVICE_PORT": str(api[1])}
    index = ((pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index"))
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = index  # what a 1.33 Job controller adds to an Indexed Job's pods
    for var in container.get("env") or []:
        env[var["name"]] = _env_value(pod, var, lookup)
    return env


def _env_value(pod: Mapping[str, Any], var: Mapping[str, Any], lookup: volumes.Lookup) -> str:
    if "value" in var or "valueFrom" not in var:
        return str(var.get("value", ""))
    source = var["valueFrom"]
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        meta = pod["metadata"]
        simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
                  "spec.nodeName": pod["spec"].get("nodeName")}
        if path in simple:
            return str(simple[path])
        for key in ("annotations", "labels"):
            if path.startswith(f"metadata.{key}['"):
                return str((meta.get(key) or {}).get(path.split("'")[1], ""))
    for ref, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        if ref in source:
            obj = lookup(kind, source[ref]["name"]) or {}
            data = volumes._config_map_data(obj) if kind == "ConfigMap" else volumes._secret_data(obj)
            if source[ref]["key"] in data:
                return data[source[ref]["key"]].decode()
    raise CannotStart("CreateContainerConfigError", f"env {var['name']}: valueFrom {sorted(source)} not emulated")


def cgroups_for(run_id: str, uid: str, container: Mapping[str, Any]) -> list[Path]:
    """cgroup v1 directories with the container's limits (the node's cgroups are v1 here)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    made = []
    cpu = CGROUP_V1 / "cpu" / f"mce-{run_id}" / uid
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "cpu.cfs_period_us").write_text("100000")
    if "cpu" in limits:
        (cpu / "cpu.cfs_quota_us").write_text(str(int(quantity(limits["cpu"]) * 100000)))
    made.append(cpu)
    if "memory" in limits:
        memory = CGROUP_V1 / "memory" / f"mce-{run_id}" / uid
        memory.mkdir(parents=True, exist_ok=True)
        (memory / "memory.limit_in_bytes").write_text(str(int(quantity(limits["memory"]))))
        made.append(memory)
    return made


def remove_cgroups(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.rmdir()


LaidOut = dict[str, tuple[Path, str]]  # volume name -> (host path, kind)


def lay_out_volumes(pod: Mapping[str, Any], directory: Path, lookup: volumes.Lookup, claim_dir: Any,
                    fs_group: int | None) -> LaidOut:
    """The pod's volumes, once for all its containers (an emptyDir's directory is shared by them)."""
    laid_out = {}
    for volume in pod["spec"].get("volumes") or []:
        try:
            laid_out[volume["name"]] = volumes.lay_out(volume, directory / "volumes", lookup, claim_dir)
        except volumes.VolumeError as exc:
            raise CannotStart("CreateContainerConfigError", str(exc)) from None
        source, kind = laid_out[volume["name"]]
        # Claims here are hostPath volumes (provisioner.py), which a real kubelet gives no fsGroup ownership.
        if fs_group is not None and kind not in ("tmpfs", "persistentVolumeClaim"):
            volumes.set_ownership(source, fs_group, kind in volumes.READ_ONLY_KINDS)
    return laid_out


def mounts_for(pod: Mapping[str, Any], container: Mapping[str, Any], directory: Path, laid_out: LaidOut,
               fs_group: int | None) -> list[dict[str, Any]]:
    """One container's mounts.  A `medium: Memory` emptyDir is a tmpfs each container mounts itself (so not
    shared between a pod's containers here, unlike a kubelet's)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source, kind = laid_out[mount["name"]]
        if kind == "tmpfs":
            size = next((str(int(quantity(v["emptyDir"]["sizeLimit"]))) for v in pod["spec"]["volumes"]
                         if v["name"] == mount["name"] and (v["emptyDir"] or {}).get("sizeLimit")), None)
            mounts.append({"kind": "tmpfs", "target": mount["mountPath"], "size": size, "fs_group": fs_group})
            continue
        if mount.get("subPath"):
            source = source / mount["subPath"]
        read_only = bool(mount.get("readOnly")) or kind in volumes.READ_ONLY_KINDS
        mounts.append({"kind": "bind", "source": str(source), "target": mount["mountPath"], "read_only": read_only})
    for name, target in (("hosts", "/etc/hosts"), ("resolv.conf", "/etc/resolv.conf"), ("hostname", "/etc/hostname")):
        mounts.append({"kind": "bind", "file": True, "source": str(directory / name), "target": target,
                       "read_only": name != "hosts"})
    return mounts


def write_hosts(path: Path, entries: list[tuple[str, str, str]]) -> None:
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
             *(f"{address} {fqdn} {host}".rstrip() for address, fqdn, host in entries)]
    text = "".join(line.ljust(HOSTS_LINE - 1)[:HOSTS_LINE - 1] + "\n" for line in lines)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, text.encode(), 0)
        os.ftruncate(fd, len(text))
    finally:
        os.close(fd)


async def start(c: Container, argv: list[str], cwd: str, mounts: list[dict[str, Any]], checkout: Path,
                image: image_mod.AnyImage, container: Mapping[str, Any]) -> None:
    sc = container.get("securityContext") or {}
    spec = {
        "rootfs": str(c.files / "rootfs"), "scratch": str(c.files / "scratch"), "lower": image.lower,
        "image": image.setup, "checkout": str(checkout) if image.checkout else None,
        "checkout_at": image_mod.SRC_MOUNT,
        "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
        "mounts": mounts, "hostname": c.hostname, "cgroups": [str(p) for p in c.cgroups],
        "user": {k: c.user[k] for k in ("uid", "gid", "groups")},
        "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
        "drop_caps": "ALL" in ((sc.get("capabilities") or {}).get("drop") or []),
        "cwd": cwd, "env": c.env, "argv": argv,
    }
    for name in ("rootfs", "scratch"):
        (c.files / name).mkdir(parents=True, exist_ok=True)
    (c.files / "spec.json").write_text(json.dumps(spec))
    with open(c.log, "ab") as log:  # the child keeps its own copy of the descriptor
        c.proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net={c.net.netns_path}", sys.executable, str(PODINIT), str(c.files / "spec.json"),
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    c.pid1 = await _first_child(c.proc.pid)


async def _first_child(pid: int) -> int | None:
    for _ in range(200):
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        await asyncio.sleep(0.01)
    return None


async def wait(c: Container) -> int:
    assert c.proc is not None
    code = await c.proc.wait()  # the shim reports 128 + n for a signal itself
    c.exit_code = code if code >= 0 else 128 - code
    c.done.set()
    return c.exit_code


def signal_container(c: Container, signum: int) -> None:
    if c.pid1 is not None and c.exit_code is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid1, signum)


async def terminate(c: Container, grace: float) -> None:
    """Graceful termination: SIGTERM to PID 1, the grace period, then SIGKILL."""
    c.stopping = True
    signal_container(c, signal.SIGTERM)
    try:
        await asyncio.wait_for(c.done.wait(), grace)
    except TimeoutError:
        signal_container(c, signal.SIGKILL)
        if c.proc is not None and c.proc.returncode is None:
            c.proc.kill()
        await c.done.wait()


def exec_argv(c: Container, argv: list[str]) -> list[str]:
    """`kubectl exec`: the command in the container's namespaces and root, as its user, with its environment."""
    assert c.pid1 is not None
    return ["nsenter", "-t", str(c.pid1), "-m", "-u", "-i", "-n", "-p", "--",
            sys.executable, str(PODINIT), "--exec", str(c.files / "spec.json"), *argv]


def cleanup(c: Container, bridge: Bridge) -> None:
    bridge.detach(c.net)
    remove_cgroups(c.cgroups)
    for name in ("rootfs", "scratch", "volumes", "init"):
        shutil.rmtree(c.directory / name, ignore_errors=True)
