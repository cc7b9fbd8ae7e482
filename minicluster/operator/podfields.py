"""The pod fields a real application needs beyond its image and command (docs/operator.md#pod-fields).

`PodFields.from_spec()` reads them from a MiniCluster's spec (`spec.pod`, `spec.imagePullPolicy`,
`spec.workingDir`, `spec.commands`, `spec.services`), `problems()` says what is wrong with them in one line each,
and `apply()` lays them over a rendered pod template. Pure: no I/O, and nothing of the operator is imported (apply
sees the MiniCluster as `Owner`), so spec.py can hold a PodFields without a cycle.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# The size of /dev/shm (manifests._own_volumes) unless spec.pod.shmSize says otherwise.
DEFAULT_SHM = "1Gi"
INIT_CONTAINER = "minicluster-init"
APPLICATION_CONTAINER = "minicluster"
HOSTNAME_KEY = "kubernetes.io/hostname"
# How manifests.dropped_fields names spec.services' sidecars when an API server did not keep them.
SIDECARS = "template.spec.initContainers[].restartPolicy (spec.services)"
# Label and annotation keys others own on these pods: the operator (minicluster.dev/name, role; app.kubernetes.io
# name, instance, managed-by), the Job controller (batch.kubernetes.io/*, and job-name, controller-uid without a
# prefix) and Kueue (kueue.x-k8s.io/*). A user's value there would break how they find and count the pods.
RESERVED_DOMAINS = ("minicluster.dev", "batch.kubernetes.io", "kueue.x-k8s.io")
RESERVED_KEYS = ("job-name", "controller-uid", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                 "app.kubernetes.io/managed-by")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_DNS_1123_LABEL}(\.{_DNS_1123_LABEL})*$")
_DNS_LABEL = re.compile(rf"^{_DNS_1123_LABEL}$")
# Containers the operator names itself: the application's, the runtime's install, commands.init's.
_OWN_CONTAINER_PREFIX = "minicluster"
# The restricted profile's container settings, given to a service that states no securityContext of its own.
_RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True)
class PodFields:
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str = ""
    scheduler_name: str = ""
    runtime_class_name: str = ""
    shm_size: str = DEFAULT_SHM
    # False: one rank per node (a required pod anti-affinity among the MiniCluster's pods); True: any number.
    pack_ranks: bool = False
    image_pull_policy: str = ""
    working_dir: str = ""
    # spec.commands: argv lists. init runs as root in an init container; pre and post around each rank (mc boot).
    init: tuple[str, ...] = ()
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    # spec.services: extra containers (core/v1 Container), run as sidecars for the life of each rank.
    services: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PodFields:
        pod = spec.get("pod") or {}
        commands = spec.get("commands") or {}
        return cls(
            labels=dict(pod.get("labels") or {}),
            annotations=dict(pod.get("annotations") or {}),
            image_pull_secrets=tuple(pod.get("imagePullSecrets") or ()),
            priority_class_name=pod.get("priorityClassName") or "",
            scheduler_name=pod.get("schedulerName") or "",
            runtime_class_name=pod.get("runtimeClassName") or "",
            shm_size=str(pod.get("shmSize") or DEFAULT_SHM),
            pack_ranks=bool(pod.get("packRanks", False)),
            image_pull_policy=spec.get("imagePullPolicy") or "",
            working_dir=spec.get("workingDir") or "",
            init=tuple(commands.get("init") or ()),
            pre=tuple(commands.get("pre") or ()),
            post=tuple(commands.get("post") or ()),
            services=tuple(spec.get("services") or ()),
        )

    def inputs(self) -> dict[str, Any]:
        """The spec fields a pod template is rendered from (spec.TEMPLATE_FIELDS), each only when it differs from
        its default: a spec that leaves them out hashes as it did before they existed (manifests.spec_hash)."""
        pod = {"labels": dict(self.labels), "annotations": dict(self.annotations),
               "imagePullSecrets": list(self.image_pull_secrets), "priorityClassName": self.priority_class_name,
               "schedulerName": self.scheduler_name, "runtimeClassName": self.runtime_class_name,
               "shmSize": "" if self.shm_size == DEFAULT_SHM else self.shm_size, "packRanks": self.pack_ranks}
        commands = {"init": list(self.init), "pre": list(self.pre), "post": list(self.post)}
        given = {"pod": {k: v for k, v in pod.items() if v}, "imagePullPolicy": self.image_pull_policy,
                 "workingDir": self.working_dir, "commands": {k: v for k, v in commands.items() if v},
                 "services": list(self.services)}
        return {k: v for k, v in given.items() if v}


def problems(spec: Mapping[str, Any]) -> list[str]:
    """What is wrong with the fields of this module, one line each (the schema checks types where CEL is off)."""
    pod = spec.get("pod") or {}
    found = [*_metadata_problems("spec.pod.labels", pod.get("labels") or {}, label_values=True),
             *_metadata_problems("spec.pod.annotations", pod.get("annotations") or {}, label_values=False)]
    for i, name in enumerate(pod.get("imagePullSecrets") or ()):
        if not _is_subdomain(name):
            found.append(f"spec.pod.imagePullSecrets[{i}] {name!r} is not a Secret name (a DNS subdomain)")
    for key in ("priorityClassName", "schedulerName", "runtimeClassName"):
        if key in pod and not _is_subdomain(pod[key]):
            found.append(f"spec.pod.{key} {pod[key]!r} is not a DNS subdomain (lowercase letters, digits, '-', '.')")
    if not positive_quantity(pod.get("shmSize", DEFAULT_SHM)):
        found.append(f"spec.pod.shmSize {pod.get('shmSize')!r} is not a positive quantity such as 1Gi")
    if spec.get("imagePullPolicy", "Always") not in PULL_POLICIES:
        found.append(f"spec.imagePullPolicy {spec['imagePullPolicy']!r} is not one of {', '.join(PULL_POLICIES)}")
    working_dir = spec.get("workingDir", "/")
    if not isinstance(working_dir, str) or not working_dir.startswith("/"):
        found.append(f"spec.workingDir {working_dir!r} is not an absolute path")
    found.extend(_command_problems(spec))
    found.extend(_service_problems(spec.get("services") or []))
    return found


def _command_problems(spec: Mapping[str, Any]) -> list[str]:
    found = []
    for key, argv in (spec.get("commands") or {}).items():
        if key not in ("init", "pre", "post"):
            found.append(f"spec.commands.{key} is not a command: init, pre and post are")
        elif not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            found.append(f"spec.commands.{key} must be a non-empty argv list of strings, "
                         f"such as [sh, -c, 'echo hi'] (no shell is implied)")
    if "init" in (spec.get("commands") or {}) and (spec.get("securityContext") or {}).get("runAsNonRoot") is True:
        found.append("spec.commands.init runs as root, which spec.securityContext.runAsNonRoot: true forbids "
                     "(Pod Security restricted): drop one of them")
    return found


def _metadata_problems(where: str, given: Mapping[str, Any], label_values: bool) -> list[str]:
    found = []
    for key, value in given.items():
        prefix, _, name = str(key).rpartition("/")
        if not (_NAME.match(name) and len(name) <= 63 and (not prefix or _is_subdomain(prefix))):
            found.append(f"{where}: {key!r} is not a valid key ([prefix/]name, the name at most 63 characters of "
                         f"letters, digits, '-', '_', '.', beginning and ending with a letter or digit)")
        elif key in RESERVED_KEYS or any(prefix == d or prefix.endswith(f".{d}") for d in RESERVED_DOMAINS):
            found.append(f"{where}: {key!r} is set by the operator, the Job controller or Kueue on these pods")
        if not isinstance(value, str):
            found.append(f"{where}[{key!r}] must be a string")
        elif label_values and value and not (_NAME.match(value) and len(value) <= 63):
            found.append(f"{where}[{key!r}]: {value!r} is not a valid label value (at most 63 characters of "
                         f"letters, digits, '-', '_', '.', beginning and ending with a letter or digit)")
    return found


def _service_problems(services: Any) -> list[str]:
    if not isinstance(services, list):
        return ["spec.services must be a list of containers"]
    found, seen = [], set()
    for i, service in enumerate(services):
        name = service.get("name") if isinstance(service, Mapping) else None
        where = f"spec.services[{i}]"
        if not isinstance(name, str) or not _DNS_LABEL.match(name) or len(name) > 63:
            found.append(f"{where}.name {name!r} is not a container name (a DNS label)")
        elif name.startswith(_OWN_CONTAINER_PREFIX):
            found.append(f"{where}.name {name!r}: names beginning with {_OWN_CONTAINER_PREFIX!r} are the operator's")
        elif name in seen:
            found.append(f"{where}.name {name!r} is used twice")
        seen.add(name)
        if isinstance(service, Mapping) and not service.get("image"):
            found.append(f"{where}.image is required")
        if isinstance(service, Mapping) and service.get("restartPolicy", "Always") != "Always":
            found.append(f"{where}.restartPolicy must be Always if given: services run as sidecars")
    return found


def positive_quantity(value: Any) -> bool:
    """A quantity such as 1Gi or 0.5Gi, above zero by its number (\"0Gi\" and \"0.0\" are not)."""
    found = QUANTITY.match(str(value))
    return found is not None and float(found.group(1)) > 0


def _is_subdomain(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 253 and bool(_SUBDOMAIN.match(value))


def boot_options(fields: PodFields) -> list[str]:
    """`mc boot`'s options for commands.pre and commands.post, each argv as one JSON argument."""
    options = []
    for flag, argv in (("--pre", fields.pre), ("--post", fields.post)):
        if argv:
            options += [flag, json.dumps(list(argv), separators=(",", ":"))]
    return options


class Owner(Protocol):
    """What apply() reads of the MiniCluster (spec.py's, which holds a PodFields: so this module imports no spec)."""

    @property
    def pod(self) -> PodFields: ...
    @property
    def image(self) -> str: ...
    @property
    def env(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def volume_mounts(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def resources(self) -> Mapping[str, Any]: ...


def apply(mc: Owner, template: dict[str, Any], own_labels: Mapping[str, str]) -> None:
    """Lay mc.pod over a rendered pod template (changed in place); `own_labels` select the MiniCluster's own pods
    (for one rank per node)."""
    fields = mc.pod
    meta, spec = template["metadata"], template["spec"]
    meta["labels"] = {**fields.labels, **meta.get("labels", {})}
    if fields.annotations:
        meta["annotations"] = {**fields.annotations, **meta.get("annotations", {})}
    for key, value in (("priorityClassName", fields.priority_class_name), ("schedulerName", fields.scheduler_name),
                       ("runtimeClassName", fields.runtime_class_name)):
        if value:
            spec[key] = value
    if fields.image_pull_secrets:
        # Pulling needs no API token: automountServiceAccountToken stays as pod_template set it.
        spec["imagePullSecrets"] = [{"name": name} for name in fields.image_pull_secrets]
    if not fields.pack_ranks:
        spec["affinity"] = _one_rank_per_node(spec.get("affinity") or {}, own_labels)
    app = next(c for c in spec["containers"] if c["name"] == APPLICATION_CONTAINER)
    _apply_container(fields, app)
    command = app["command"]
    boot = command.index("boot") + 1
    app["command"] = [*command[:boot], *boot_options(fields), *command[boot:]]
    extra = [*([_init_container(mc)] if fields.init else []), *map(_service, fields.services)]
    if extra:
        spec["initContainers"] = [*spec.get("initContainers", []), *extra]


def _apply_container(fields: PodFields, container: dict[str, Any]) -> None:
    if fields.image_pull_policy:
        container["imagePullPolicy"] = fields.image_pull_policy
    if fields.working_dir:
        container["workingDir"] = fields.working_dir


def _one_rank_per_node(affinity: Mapping[str, Any], own_labels: Mapping[str, str]) -> dict[str, Any]:
    """The user's affinity plus a required anti-affinity: no two of the MiniCluster's pods on one node."""
    anti = dict(affinity.get("podAntiAffinity") or {})
    required = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    required.append({"labelSelector": {"matchLabels": dict(own_labels)}, "topologyKey": HOSTNAME_KEY})
    anti["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return {**affinity, "podAntiAffinity": anti}


def _init_container(mc: Owner) -> dict[str, Any]:
    """commands.init: as root in the application image, before the ranks start. Outside Pod Security's restricted
    profile (root, the runtime's default capabilities): a namespace that enforces it refuses these pods. Only what
    it writes to a volume (spec.volumeMounts) reaches the application container."""
    container: dict[str, Any] = {
        "name": INIT_CONTAINER,
        "image": mc.image,
        "command": list(mc.pod.init),
        "env": list(mc.env),
        "volumeMounts": list(mc.volume_mounts),
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                            "allowPrivilegeEscalation": False},
    }
    if mc.resources:
        container["resources"] = dict(mc.resources)
    _apply_container(mc.pod, container)
    return container


def dropped_sidecars(wanted: Mapping[str, Any], kept: Mapping[str, Any]) -> bool:
    """Whether an API server kept fewer native sidecars in a pod template than were asked for: one without them
    (before 1.29) drops restartPolicy from init containers, which would then keep every pod from starting."""
    def sidecars(template: Mapping[str, Any]) -> int:
        return sum(c.get("restartPolicy") == "Always" for c in (template.get("spec") or {}).get("initContainers") or [])
    return sidecars(kept) < sidecars(wanted)


def _service(service: Mapping[str, Any]) -> dict[str, Any]:
    """A native sidecar (an init container that keeps running, Kubernetes 1.29+): it starts before the rank and
    is stopped when the rank's container ends, so a service never keeps a finished pod, and its Job, alive."""
    container = {**service, "restartPolicy": "Always"}
    container.setdefault("securityContext", _RESTRICTED_CONTAINER)
    return container
