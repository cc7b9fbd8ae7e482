"""What the MiniCluster's pods say about themselves: which one is the broker, and why ranks are missing.

Pure functions over pods and events as the API server returns them.  A broker that does not answer says
nothing about why; the pods do (an admission refusal, an image that cannot be pulled, a rank that keeps
failing), so their own reasons go into the MiniCluster's `Ready` condition.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minicluster.operator.spec import INDEX_KEY, ROLE_LABEL, MiniCluster

Pod = Mapping[str, Any]

# Container waiting reasons that mean "this will not start by itself".
STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError", "CrashLoopBackOff")
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
    return _refused(pods, events) or _stuck(mc, pods) or _unschedulable(mc, pods) or failing(mc, pods)


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
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
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
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if ended:
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
