"""What the MiniCluster's pods say about themselves: which one is the broker, and why ranks are missing.

Pure functions over pods and events as the API server returns them.  A broker that does not answer says
nothing about why; the pods do (an admission refusal, an image that cannot be pulled, a rank that keeps
failing), so their own reasons go into the MiniCluster's `Ready` condition.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minicluster import exitcodes
from minicluster.operator.spec import INDEX_KEY, ROLE_LABEL, MiniCluster

Pod = Mapping[str, Any]

# Container waiting reasons that mean "this will not start by itself".
STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError", "CrashLoopBackOff")
# Terminated reasons of a container that never ran: containerd's StartError, Docker's ContainerCannotRun.
NEVER_RAN = ("StartError", "ContainerCannotRun")
# The one line a process whose executable is for another architecture leaves (runc: "exec /path: exec format error").
WRONG_ARCH = "exec format error"
MAX_MESSAGE = 600


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def rank_of(mc: MiniCluster, pod: Pod) -> int | None:
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(ROLE_LABEL) == "broker":
        return 0
    index = (meta.get("annotations") or {}).get(INDEX_KEY) or (meta.get("labels") or {}).get(INDEX_KEY)
    if index is None or not str(index).isdigit():
        return None
    if mc.storage and int(index) == 0:
        return None  # index 0 of the workers' Job: rank 0 runs in its own Job
    return int(index)


def live(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not (pod.get("metadata") or {}).get(
        "deletionTimestamp")


def broker_pod(mc: MiniCluster, pods: Sequence[Pod]) -> Pod | None:
    """The running pod of rank 0, if any."""
    return next((p for p in pods if live(p) and rank_of(mc, p) == 0), None)


def problem(mc: MiniCluster, pods: Sequence[Pod], events: Sequence[Mapping[str, Any]]) -> Problem | None:
    """The most telling reason why ranks are missing, from the pods' own status and the Jobs' events."""
    return (_refused(pods, events) or cannot_start(mc, pods) or _stuck(mc, pods) or _unschedulable(mc, pods)
            or failing(mc, pods))


def cannot_start(mc: MiniCluster, pods: Sequence[Pod]) -> Problem | None:
    """A container of a rank with no running pod that could not start in its image: never ran (the runtime or
    command missing), an executable for another architecture, or `mc boot`'s own start checks (exit
    CANNOT_START). Retrying would fail the same way, so this is the reason, from the first failed pod on."""
    running = {rank_of(mc, p) for p in pods if live(p)}
    for pod in sorted(pods, key=lambda p: (rank_of(mc, p) is None, rank_of(mc, p) or 0)):
        if rank_of(mc, pod) in running and rank_of(mc, pod) is not None:
            continue
        for status in _statuses(pod):
            ended = (status.get("state") or {}).get("terminated") or {}
            reason = _start_failure(ended)
            if reason:
                text = f"{_who(mc, pod)}, container {status.get('name', '?')}: exit code {ended.get('exitCode')}"
                message = str(ended.get("message") or "").strip()
                return Problem(reason, _short(f"{text}: {message}" if message else text))
    return None


def _start_failure(ended: Mapping[str, Any]) -> str | None:
    """Why a terminated container could not start in its image (its Ready reason), or None if it ran."""
    message = str(ended.get("message") or "")
    if ended.get("reason") in NEVER_RAN:
        return str(ended["reason"])
    if ended.get("exitCode") == exitcodes.NOT_STARTED:
        return "StartError"
    if ended.get("exitCode") == exitcodes.CANNOT_START and message.startswith(exitcodes.CANNOT_START_MESSAGE):
        return "RuntimeCannotStart"
    if ended.get("exitCode") and message.strip().endswith(WRONG_ARCH):
        return "ExecFormatError"
    return None


def _statuses(pod: Pod) -> list[Mapping[str, Any]]:
    """The pod's init containers' statuses, then its containers': an init container that failed explains why the
    others never started."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _refused(pods: Sequence[Pod], events: Sequence[Mapping[str, Any]]) -> Problem | None:
    # The Job controller could not create a pod (admission, quota): the event is all there is.
    newest_pod = max((str((p.get("metadata") or {}).get("creationTimestamp", "")) for p in pods), default="")
    refusals = [e for e in events if e.get("reason") == "FailedCreate" and _when(e) >= newest_pod]
    if not refusals:
        return None
    latest = max(refusals, key=_when)
    return Problem("FailedCreate", _short(latest.get("message", "the Job could not create a pod")))


def _stuck(mc: MiniCluster, pods: Sequence[Pod]) -> Problem | None:
    for pod in _by_rank(mc, pods):
        for status in _statuses(pod):
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK:
                return Problem(waiting["reason"], _short(f"{_who(mc, pod)}: {waiting.get('message', '')}"))
    return None


def _unschedulable(mc: MiniCluster, pods: Sequence[Pod]) -> Problem | None:
    for pod in _by_rank(mc, pods):
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return Problem(cond.get("reason") or "Unschedulable",
                               _short(f"{_who(mc, pod)}: {cond.get('message', '')}"))
    return None


def failing(mc: MiniCluster, pods: Sequence[Pod]) -> Problem | None:
    """A rank with no running pod whose pods failed: how often, and how the last one ended. Failed pods that
    never had a rank (no index: the Job is not Indexed, or rank 0's slot of the workers' Job) come last."""
    running = {rank_of(mc, p) for p in pods if live(p)}
    failed: dict[int, list[Pod]] = {}
    unranked: list[Pod] = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Failed":
            continue
        rank = rank_of(mc, pod)
        if rank is None:
            unranked.append(pod)
        elif rank not in running:
            failed.setdefault(rank, []).append(pod)
    if failed:
        rank, attempts = max(failed.items(), key=lambda item: len(item[1]))
        return Problem("PodFailed", _short(f"rank {rank}'s pod failed {_times(attempts)}; last {_ending(attempts)}"))
    if unranked:
        some = "a pod" if len(unranked) == 1 else f"{len(unranked)} pods"
        return Problem("PodFailed", _short(f"{some} without a rank failed; last {_ending(unranked)}"))
    return None


def _times(attempts: Sequence[Pod]) -> str:
    return "once" if len(attempts) == 1 else f"{len(attempts)} times"


def _ending(attempts: Sequence[Pod]) -> str:
    """How the newest of `attempts` ended: its container's exit code, reason and termination message."""
    pod = max(attempts, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")))
    name = (pod.get("metadata") or {}).get("name", "?")
    for status in _statuses(pod):
        ended = (status.get("state") or {}).get("terminated")
        if ended and ended.get("exitCode"):
            text = f"{name}: exit code {ended.get('exitCode')} ({ended.get('reason', 'Error')})"
            return f"{text}: {ended['message'].strip()}" if ended.get("message") else text
    reason = (pod.get("status") or {}).get("reason")
    return f"{name}: {reason}" if reason else name


def _by_rank(mc: MiniCluster, pods: Sequence[Pod]) -> list[Pod]:
    pending = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
    return sorted(pending, key=lambda p: (rank_of(mc, p) is None, rank_of(mc, p) or 0))


def _who(mc: MiniCluster, pod: Pod) -> str:
    rank = rank_of(mc, pod)
    name = (pod.get("metadata") or {}).get("name", "?")
    return f"pod {name}" if rank is None else f"rank {rank} (pod {name})"


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 1] + "…"
