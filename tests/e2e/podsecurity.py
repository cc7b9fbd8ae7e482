"""The Pod Security Standards' "restricted" profile (Kubernetes 1.25+, `restricted:latest`), as a pure check.

Kubernetes 1.20, the API server the e2e tier runs, has no PodSecurity admission; the e2e harness serves these
checks as a validating admission webhook, so a pod that breaks them is refused at creation exactly where a
modern API server refuses it (the Job then records FailedCreate).  Messages follow the real admission's wording.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def restricted_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """Every "restricted" rule `pod_spec` breaks (baseline rules included); empty when it passes."""
    pod_sc = pod_spec.get("securityContext") or {}
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    found = _host_access(pod_spec) + _volumes(pod_spec)
    found += _per_container(containers, "privileged", lambda sc: sc.get("privileged") is True,
                            'securityContext.privileged=false')
    found += _per_container(containers, "allowPrivilegeEscalation != false",
                            lambda sc: sc.get("allowPrivilegeEscalation") is not False,
                            "securityContext.allowPrivilegeEscalation=false")
    found += _per_container(containers, "unrestricted capabilities", _capabilities_bad,
                            'securityContext.capabilities.drop=["ALL"]')
    found += _pod_or_containers(pod_sc, containers, "runAsNonRoot != true",
                                lambda sc: sc.get("runAsNonRoot"), lambda v: v is True,
                                "securityContext.runAsNonRoot=true")
    found += _pod_or_containers(pod_sc, containers, "seccompProfile",
                                lambda sc: (sc.get("seccompProfile") or {}).get("type"),
                                lambda v: v in ("RuntimeDefault", "Localhost"),
                                'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    if pod_sc.get("runAsUser") == 0 or any((c.get("securityContext") or {}).get("runAsUser") == 0
                                           for c in containers):
        found.append("runAsUser=0 (pod and containers must not set runAsUser=0)")
    unsafe = [s.get("name") for s in pod_sc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    if unsafe:
        found.append(f"forbidden sysctls ({', '.join(map(str, unsafe))})")
    return found


def _host_access(spec: Mapping[str, Any]) -> list[str]:
    found = [f"host namespaces ({k}=true)" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    ports = [str(p.get("hostPort")) for c in spec.get("containers") or [] for p in c.get("ports") or []
             if p.get("hostPort")]
    if ports:
        found.append(f"hostPort (containers use hostPorts {', '.join(ports)})")
    return found


def _volumes(spec: Mapping[str, Any]) -> list[str]:
    bad = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            bad.append(f'"{volume.get("name")}" ({", ".join(sorted(kinds - ALLOWED_VOLUMES))})')
    return [f"restricted volume types (volumes {', '.join(bad)})"] if bad else []


def _capabilities_bad(sc: Mapping[str, Any]) -> bool:
    caps = sc.get("capabilities") or {}
    return "ALL" not in (caps.get("drop") or []) or bool(set(caps.get("add") or []) - {"NET_BIND_SERVICE"})


def _per_container(containers: list[Mapping[str, Any]], rule: str, bad: Any, fix: str) -> list[str]:
    names = [c.get("name", "?") for c in containers if bad(c.get("securityContext") or {})]
    if not names:
        return []
    who = ", ".join(f'"{n}"' for n in names)
    return [f"{rule} (container{'s' if len(names) > 1 else ''} {who} must set {fix})"]


def _pod_or_containers(pod_sc: Mapping[str, Any], containers: list[Mapping[str, Any]], rule: str,
                       get: Any, ok: Any, fix: str) -> list[str]:
    pod_value = get(pod_sc)
    names = []
    for c in containers:
        value = get(c.get("securityContext") or {})
        if not ok(value if value is not None else pod_value):
            names.append(c.get("name", "?"))
    if not names:
        return []
    who = ", ".join(f'"{n}"' for n in names)
    return [f"{rule} (pod or container{'s' if len(names) > 1 else ''} {who} must set {fix})"]


def message(pod_name: str, violations: list[str]) -> str:
    return f'pods "{pod_name}" is forbidden: violates PodSecurity "restricted:latest": {", ".join(violations)}'
