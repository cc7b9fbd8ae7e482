"""The MiniCluster custom resource as the operator understands it.

`MiniCluster.from_body()` turns a CR body into a typed, defaulted value;
`problems()` lists what the OpenAPI schema could not reject (old API servers
ignore CEL rules, and some checks need the recorded status). Nothing here does
I/O, so the manifest builders and the tests share one source of truth.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

from minicluster.config import POLICIES, ConfigError, InstanceConfig
from minicluster.operator import podfields
from minicluster.operator.podfields import PodFields
from minicluster.runtime import RUNTIME_ROOT

GROUP = "minicluster.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MiniCluster"
PLURAL = "miniclusters"

NAME_LABEL = f"{GROUP}/name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue reads a Job's WorkloadPriorityClass from this label (spec.queuePriorityClass).
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's partial admission of a batch/Job (spec.minSize): it may start the Job with as few pods as this, lowering
# parallelism (and, with the second annotation, completions with it).
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
COMPLETIONS_EQUAL_PARALLELISM = "kueue.x-k8s.io/job-completions-equal-parallelism"
MANAGER = "minicluster-operator"

OVERLAY_PORT = 8050
STATUS_PORT = 8051
CONTAINER = "minicluster"
LOG_LEVELS = ("debug", "info", "warning", "error")
# The runtime image's user (images/runtime/Dockerfile); pods run as it, and volumes are group-owned by it.
RUNTIME_UID = 10001
ROLE_LABEL = f"{GROUP}/role"
# Set by the Indexed Job controller (annotation always, label since Kubernetes 1.28).
INDEX_KEY = "batch.kubernetes.io/job-completion-index"

# Pod hostnames are "<name>-<index>" and must fit a 63-character DNS label;
# 50 leaves room for any index below the schema's maxSize limit.
MAX_NAME_LENGTH = 50
MAX_RANKS = 10000
# spec.failurePolicy.backoffLimitPerRank's default: a rank's pod may fail this often (not by a disruption, not by
# a program failure, which fails the MiniCluster at once) before the MiniCluster fails.
BACKOFF_LIMIT_PER_RANK = 3
# The spec fields a Job's pod template is rendered from: a Job never lets them change, so neither does the CRD
# (transition rules) nor, on servers without CEL, the operator (TemplateImmutable).
TEMPLATE_FIELDS = ("image", "command", "env", "resources", "volumes", "volumeMounts", "nodeSelector", "tolerations",
                   "affinity", "serviceAccountName", "topology", "logging", "runtime", "securityContext",
                   "containerSecurityContext", "pod", "imagePullPolicy", "workingDir", "commands", "services")
# The runtime image this project publishes (images/runtime): the default spec.runtime.image, the examples' image.
RUNTIME_IMAGE = "ghcr.io/minicluster/runtime:0.1.0"
# copy: an init container copies the runtime into an emptyDir; imageVolume: the runtime image mounted as a volume;
# baked: spec.image has minicluster installed and runs as the runtime image's user.
RUNTIME_MODES = ("copy", "imageVolume", "baked")
PULL_POLICIES = podfields.PULL_POLICIES
# spec.securityContext's fields (the pod's); every other pod security field is the operator's.
POD_SECURITY_FIELDS = ("runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups")
MAX_ID = 2**31 - 1
# What spec.containerSecurityContext.capabilities.add may name: the container runtimes' default set (which the
# container's drop ALL removes) and what HPC codes ask for: IPC_LOCK (pinning RDMA buffers), SYS_NICE (NUMA
# placement, priorities), SYS_RESOURCE (raising limits), SYS_PTRACE (MPI's cross-memory attach between ranks).
# Not SYS_ADMIN, NET_ADMIN, SYS_MODULE and the like: they reach past the container.
CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "IPC_LOCK", "SYS_NICE",
                "SYS_RESOURCE", "SYS_PTRACE")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# The operator's own pod volumes and mount paths (manifests.py: config and key, state, /dev/shm, the injected
# runtime and its copy): a user's of the same name or at the same path would make the pod template invalid.
OWN_VOLUME_PREFIX = "minicluster-"
OWN_MOUNT_PATHS = ("/etc/minicluster", "/var/lib/minicluster", "/dev/shm", RUNTIME_ROOT, f"{RUNTIME_ROOT}-copy")


@dataclass(frozen=True)
class Storage:
    """`spec.storage`: a PersistentVolumeClaim for rank 0's state directory."""
    size: str
    storage_class_name: str | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Storage | None:
        storage = spec.get("storage")
        if not storage:
            return None
        return cls(size=str(storage.get("size", "")), storage_class_name=storage.get("storageClassName"))


@dataclass(frozen=True)
class Runtime:
    """`spec.runtime`: where the application container's minicluster comes from (RUNTIME_MODES)."""
    image: str = RUNTIME_IMAGE
    image_pull_policy: str = ""
    mode: str = "copy"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Runtime:
        given = spec.get("runtime") or {}
        return cls(image=given.get("image") or RUNTIME_IMAGE, image_pull_policy=given.get("imagePullPolicy") or "",
                   mode=given.get("mode") or "copy")

    @property
    def injected(self) -> bool:
        """Whether the runtime reaches the pods apart from spec.image (then run as the image's own USER)."""
        return self.mode != "baked"


@dataclass(frozen=True)
class FailurePolicy:
    """`spec.failurePolicy`: how many pod failures the ranks may have before the MiniCluster fails."""
    # Failures of one rank (the ranks' Job's backoffLimitPerIndex; rank 0's own Job's backoffLimit with storage).
    backoff_limit_per_rank: int = BACKOFF_LIMIT_PER_RANK
    # Failures of all ranks together (the Jobs' backoffLimit); None: no such limit where per-rank budgets exist.
    backoff_limit: int | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> FailurePolicy:
        given = spec.get("failurePolicy") or {}
        per_rank = given.get("backoffLimitPerRank")
        return cls(backoff_limit_per_rank=BACKOFF_LIMIT_PER_RANK if per_rank is None else int(per_rank),
                   backoff_limit=given.get("backoffLimit"))


@dataclass(frozen=True)
class MiniCluster:
    name: str
    namespace: str
    uid: str
    generation: int
    size: int
    max_size: int
    image: str
    fanout: int = 32
    command: tuple[str, ...] = ()
    policy: str = "first-fit"
    broker_runs_tasks: bool = True
    # Levels above the node from node labels, in the config's form: "zone=topology.kubernetes.io/zone,rack=...".
    topology: str = ""
    log_level: str = "info"
    suspend: bool = False
    queue_name: str = ""
    queue_priority_class: str = ""
    # spec.minSize: the fewest ranks Kueue may admit the MiniCluster with (partial admission).
    min_size: int | None = None
    deadline_seconds: int | None = None
    service_account_name: str = ""
    # spec.networkPolicy: the NetworkPolicy child (network.py), made when the MiniCluster is.
    network_policy: bool = True
    # Pass-through pod fields, already in Kubernetes' own shape.
    resources: Mapping[str, Any] = field(default_factory=dict)
    env: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    storage: Storage | None = None
    # spec.queues in the config's own form (queues_config), and spec.defaultQueue.
    queues: Mapping[str, Any] = field(default_factory=dict)
    default_queue: str = ""
    runtime: Runtime = Runtime()
    # spec.securityContext (POD_SECURITY_FIELDS only), laid over the operator's pod securityContext.
    security_context: Mapping[str, Any] = field(default_factory=dict)
    # spec.containerSecurityContext.capabilities.add
    add_capabilities: tuple[str, ...] = ()
    # spec.pod, imagePullPolicy, workingDir, commands, services (podfields.py).
    pod: PodFields = field(default_factory=PodFields)
    failure: FailurePolicy = FailurePolicy()
    # spec.ttlSecondsAfterFinished: set on the Jobs once the MiniCluster's end is recorded (handlers._expire).
    ttl_seconds_after_finished: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> MiniCluster:
        meta = body.get("metadata", {})
        spec = body.get("spec", {})
        size = int(spec.get("size", 1))
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
            size=size,
            max_size=effective_max_size(body),
            image=spec.get("image", ""),
            fanout=int(spec.get("fanout", 32)),
            command=tuple(spec.get("command") or ()),
            policy=spec.get("policy", "first-fit"),
            broker_runs_tasks=bool(spec.get("brokerRunsTasks", True)),
            topology=spec.get("topology", "") or "",
            log_level=(spec.get("logging") or {}).get("level", "info"),
            suspend=bool(spec.get("suspend", False)),
            queue_name=spec.get("queueName", "") or "",
            queue_priority_class=spec.get("queuePriorityClass", "") or "",
            min_size=spec.get("minSize"),
            deadline_seconds=spec.get("deadlineSeconds"),
            service_account_name=spec.get("serviceAccountName", "") or "",
            network_policy=spec.get("networkPolicy", True) is not False,
            resources=spec.get("resources") or {},
            env=tuple(spec.get("env") or ()),
            volumes=tuple(spec.get("volumes") or ()),
            volume_mounts=tuple(spec.get("volumeMounts") or ()),
            node_selector=spec.get("nodeSelector") or {},
            tolerations=tuple(spec.get("tolerations") or ()),
            affinity=spec.get("affinity") or {},
            storage=Storage.from_spec(spec),
            queues=queues_config(spec.get("queues") or {}),
            default_queue=spec.get("defaultQueue", "") or "",
            runtime=Runtime.from_spec(spec),
            security_context={k: v for k, v in (spec.get("securityContext") or {}).items()
                              if k in POD_SECURITY_FIELDS},
            add_capabilities=tuple(_added_capabilities(spec)),
            pod=PodFields.from_spec(spec),
            failure=FailurePolicy.from_spec(spec),
            ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
        )

    @property
    def batch(self) -> bool:
        return bool(self.command)

    @property
    def broker_job_name(self) -> str:
        """The Job whose end is the MiniCluster's: rank 0's own Job with storage, else the one Indexed Job."""
        return f"{self.name}-broker" if self.storage else self.name


_CAMEL = {"defaultTimeLimit": "default_time_limit", "maxTimeLimit": "max_time_limit", "preemptMode": "preempt_mode",
          "userLimits": "user_limits", "runningJobs": "running_jobs", "queuedJobs": "queued_jobs"}


def queues_config(queues: Mapping[str, Any]) -> dict[str, Any]:
    """spec.queues (Kubernetes' camelCase) as the broker config's `queues` table (snake_case)."""
    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {_CAMEL.get(k, k): convert(v) for k, v in value.items()}
        return value
    return {name: convert(body) for name, body in queues.items()} if isinstance(queues, Mapping) else {}


def _added_capabilities(spec: Mapping[str, Any]) -> list[Any]:
    return list(((spec.get("containerSecurityContext") or {}).get("capabilities") or {}).get("add") or [])


def effective_max_size(body: Mapping[str, Any]) -> int:
    """The overlay tree's size: fixed once recorded in status, since changing
    it would re-parent running ranks."""
    recorded = (body.get("status") or {}).get("maxSize")
    if recorded:
        return int(recorded)
    spec = body.get("spec", {})
    return int(spec.get("maxSize") or spec.get("size", 1))


def problems(body: Mapping[str, Any]) -> list[str]:
    """Human-readable reasons why this MiniCluster cannot be reconciled."""
    found: list[str] = []
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    name = meta.get("name", "")
    if not _DNS_1035.match(name) or len(name) > MAX_NAME_LENGTH:
        found.append(
            f"name {name!r} must be a DNS label (lowercase letters, digits, '-', starting "
            f"with a letter) of at most {MAX_NAME_LENGTH} characters: pods are named NAME-RANK"
        )
    if not spec.get("image"):
        found.append("spec.image is required")
    size = spec.get("size", 1)
    recorded = (body.get("status") or {}).get("maxSize")
    wanted_max = spec.get("maxSize")
    if recorded and wanted_max and int(wanted_max) != int(recorded):
        found.append(f"spec.maxSize is immutable: the overlay tree was laid out for {recorded} ranks")
    max_size = effective_max_size(body)
    if isinstance(size, int) and size > max_size:
        hint = "" if wanted_max else "; set spec.maxSize at creation to make a MiniCluster elastic"
        found.append(f"spec.size {size} exceeds maxSize {max_size}{hint}")
    level = (spec.get("logging") or {}).get("level", "info")
    if level not in LOG_LEVELS:
        found.append(f"spec.logging.level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    found.extend(_storage_problems(spec, max_size))
    found.extend(_kueue_problems(spec, (body.get("status") or {}).get("size")))
    found.extend(_collision_problems(spec))
    found.extend(_runtime_problems(spec))
    found.extend(_security_problems(spec))
    found.extend(podfields.problems(spec))
    if not found:
        found.extend(_config_problems(spec, max_size))
    return found


def _storage_problems(spec: Mapping[str, Any], max_size: int) -> list[str]:
    storage = spec.get("storage")
    if not storage:
        return []
    found = []
    if not podfields.positive_quantity(storage.get("size", "")):
        found.append(f"spec.storage.size {storage.get('size')!r} is not a positive quantity such as 1Gi")
    # Index 0 of the workers' Job completes at once with storage (rank 0 has its own Job), and a complete Job
    # never grows again: an elastic MiniCluster with storage keeps at least one worker.
    if max_size > 1 and int(spec.get("size", 1)) < 2:
        found.append("with spec.storage, spec.size must be at least 2 unless maxSize is 1")
    return found


def _collision_problems(spec: Mapping[str, Any]) -> list[str]:
    """A user's volume or mount that takes the operator's own name or path, or a queue name no label can hold:
    the Jobs would be refused (422) after the MiniCluster was accepted."""
    found = []
    for i, volume in enumerate(spec.get("volumes") or ()):
        name = str(volume.get("name", "")) if isinstance(volume, Mapping) else ""
        if name.startswith(OWN_VOLUME_PREFIX):
            found.append(f"spec.volumes[{i}].name {name!r}: names beginning with {OWN_VOLUME_PREFIX!r} are the "
                         f"operator's")
    for i, mount in enumerate(spec.get("volumeMounts") or ()):
        path = str(mount.get("mountPath", "")).rstrip("/") if isinstance(mount, Mapping) else ""
        taken = next((own for own in OWN_MOUNT_PATHS if path == own or path.startswith(f"{own}/")), None)
        if taken:
            found.append(f"spec.volumeMounts[{i}].mountPath {path!r}: {taken} is the operator's")
    queue = spec.get("queueName", "") or ""
    if queue and not (_LABEL_VALUE.match(str(queue)) and len(str(queue)) <= 63):
        found.append(f"spec.queueName {queue!r} is not a label value (at most 63 letters, digits, '-', '_', '.', "
                     f"beginning and ending with a letter or digit): Kueue reads it from a label")
    return found


def _kueue_problems(spec: Mapping[str, Any], applied_size: Any) -> list[str]:
    """What Kueue's batch/Job integration cannot honour (docs/operator.md#kueue)."""
    queue = spec.get("queueName", "") or ""
    priority = spec.get("queuePriorityClass", "") or ""
    found = []
    if priority and not (_DNS_1123.match(str(priority)) and len(str(priority)) <= 63):
        found.append(f"spec.queuePriorityClass {priority!r} is not a WorkloadPriorityClass name (a lowercase DNS "
                     f"subdomain of at most 63 characters: Kueue reads it from a label)")
    if priority and not queue:
        found.append("spec.queuePriorityClass needs spec.queueName: it is Kueue's priority among queued workloads")
    least = spec.get("minSize")
    if least is not None and not queue:
        found.append("spec.minSize needs spec.queueName: it is the fewest ranks Kueue may admit")
    if isinstance(least, int) and not 1 <= least <= int(spec.get("size", 1)):
        found.append(f"spec.minSize {least} must be from 1 to spec.size")
    elif isinstance(least, int) and least < 2 and spec.get("brokerRunsTasks") is False:
        found.append("spec.minSize must be at least 2 with brokerRunsTasks: false (rank 0 runs no tasks)")
    if queue and spec.get("storage"):
        # Rank 0 runs in a Job of its own with storage, and Kueue admits each Job as a Workload of its own.
        found.append("spec.storage cannot be combined with spec.queueName: rank 0 would run in a second Job, which "
                     "Kueue admits as a second workload, so the ranks would not be admitted as one gang")
    if queue and applied_size and int(spec.get("size", 1)) != int(applied_size):
        # Kueue's batch/Job integration treats a Job whose parallelism no longer matches its Workload as another
        # job: it suspends it (every rank stops), deletes the Workload and queues the Job again.
        found.append(f"spec.size of a MiniCluster queued in Kueue (spec.queueName) is fixed at {applied_size}: "
                     f"Kueue admitted that many pods as one workload, and a resized Job would be stopped and "
                     f"queued again; the MiniCluster keeps running at {applied_size} (recreate it to change size)")
    return found


def _runtime_problems(spec: Mapping[str, Any]) -> list[str]:
    runtime = spec.get("runtime") or {}
    found = []
    if runtime.get("mode", "copy") not in RUNTIME_MODES:
        found.append(f"spec.runtime.mode {runtime['mode']!r} is not one of {', '.join(RUNTIME_MODES)}")
    if runtime.get("imagePullPolicy", "Always") not in PULL_POLICIES:
        found.append(f"spec.runtime.imagePullPolicy {runtime['imagePullPolicy']!r} is not one of "
                     f"{', '.join(PULL_POLICIES)}")
    return found


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID


def _security_problems(spec: Mapping[str, Any]) -> list[str]:
    pod = spec.get("securityContext") or {}
    found = [f"spec.securityContext.{key} {pod[key]!r} is not an id from 0 to {MAX_ID}"
             for key in ("runAsUser", "runAsGroup", "fsGroup") if key in pod and not _is_id(pod[key])]
    groups = pod.get("supplementalGroups", [])
    if not isinstance(groups, list) or not all(_is_id(g) for g in groups):
        found.append(f"spec.securityContext.supplementalGroups {groups!r} is not a list of ids from 0 to {MAX_ID}")
    baked = (spec.get("runtime") or {}).get("mode") == "baked"
    # Baked pods run with runAsNonRoot by default (manifests.pod_security_context); the kubelet would refuse root.
    if pod.get("runAsUser") == 0 and pod.get("runAsNonRoot", baked) is True:
        found.append("spec.securityContext.runAsUser 0 (root) contradicts runAsNonRoot"
                     + ("" if "runAsNonRoot" in pod else ", which baked mode sets unless runAsNonRoot: false"))
    added = _added_capabilities(spec)
    bad = [name for name in added if name not in CAPABILITIES]
    if bad:
        hint = " (name them without CAP_)" if any(str(name).startswith("CAP_") for name in bad) else ""
        found.append(f"spec.containerSecurityContext.capabilities.add: {', '.join(map(repr, bad))} not allowed"
                     f"{hint}; allowed: {', '.join(CAPABILITIES)}")
    return found


def _config_problems(spec: Mapping[str, Any], max_size: int) -> list[str]:
    # The broker's own config validation is the final word on what it accepts.
    try:
        InstanceConfig(
            size=int(spec.get("size", 1)),
            max_size=max_size,
            fanout=int(spec.get("fanout", 32)),
            policy=spec.get("policy", "first-fit"),
            broker_runs_tasks=bool(spec.get("brokerRunsTasks", True)),
            topology=spec.get("topology", "") or "",
            queues=queues_config(spec.get("queues") or {}),
            default_queue=spec.get("defaultQueue", "") or "",
        )
    except (ConfigError, TypeError, ValueError) as exc:
        return [f"spec: {exc}" if "queue" in str(exc) else str(exc)]
    return []


__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "NAME_LABEL", "QUEUE_LABEL", "PRIORITY_LABEL",
    "MIN_PARALLELISM", "COMPLETIONS_EQUAL_PARALLELISM",
    "POLICIES", "LOG_LEVELS", "TEMPLATE_FIELDS", "MiniCluster", "Storage", "effective_max_size", "problems",
    "RUNTIME_IMAGE", "RUNTIME_MODES", "PULL_POLICIES", "POD_SECURITY_FIELDS", "CAPABILITIES", "Runtime",
]
