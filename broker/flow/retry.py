"""Failure and success policies (protocol.md §3.9.2–3.9.3): what to do when a task's attempt ends. Pure.

`Policy.action` maps one task's exit to an action by the job's rules; `decide` turns an action and the retry
counts into an outcome; `SuccessTracker` tells when an array's success policy is met. The broker applies the
outcome (records the attempt, requeues, fails the index or the job).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from minicluster.model.idset import IdSet
from minicluster.model.jobspec import Jobspec

# Actions, weakest first: a plain job's attempt takes the strongest of its tasks'.
SUCCESS, IGNORE, RETRY, FAIL, FAIL_JOB = "success", "ignore", "retry", "fail", "fail-job"
STRENGTH = {SUCCESS: 0, IGNORE: 1, RETRY: 2, FAIL: 3, FAIL_JOB: 4}
MAX_BACKOFF = 3600.0

# Outcomes of an attempt.
SUCCEEDED = "succeeded"    # exit 0, or a failure a rule ignores: counts as success
RETRIED = "retry"          # run again (counts against the retries)
FAILED = "failed"          # final failure of this job or index
FAILED_JOB = "fail-job"    # final, and the whole job ends now


class Decision(NamedTuple):
    outcome: str
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Policy:
    exit_rules: tuple[tuple[IdSet, str], ...] = ()
    signal_rules: tuple[tuple[IdSet, str], ...] = ()
    retries: int | None = None
    per_index: int | None = None
    retry_delay: float = 0.0
    max_failed: int | None = None

    @classmethod
    def of(cls, spec: Jobspec) -> Policy:
        return cls(
            exit_rules=tuple((IdSet.parse(codes), action) for codes, action in spec.on_exit),
            signal_rules=tuple((IdSet.parse(sigs), action) for sigs, action in spec.on_signal),
            retries=spec.retries, per_index=spec.max_retries_per_index, retry_delay=spec.retry_delay,
            max_failed=spec.max_failed_indexes,
        )

    def action(self, status: int, exit_code: int | None, signal: int | None) -> str:
        """The action for one task's end: the first rule that matches, else success for 0 and retry otherwise.

        A task that could not start (no exit code, no signal) is matched by its status (126/127) as an exit code.
        """
        if signal is not None:
            for sigs, action in self.signal_rules:
                if signal in sigs:
                    return action
        else:
            code = exit_code if exit_code is not None else status
            for codes, action in self.exit_rules:
                if code in codes:
                    return action
        return SUCCESS if status == 0 else RETRY

    def can_retry(self, index_retries: int, total_retries: int) -> bool:
        """Whether one more retry fits the per-index and the job-wide budget (an unset one is unbounded unless
        both are unset)."""
        if self.retries is None and self.per_index is None:
            return False
        return ((self.per_index is None or index_retries < self.per_index)
                and (self.retries is None or total_retries < self.retries))

    def delay(self, retry: int) -> float:
        """Seconds before the `retry`-th retry (1, 2, ...): exponential from retry_delay, capped."""
        if self.retry_delay <= 0:
            return 0.0
        cap = max(self.retry_delay, MAX_BACKOFF)
        return min(self.retry_delay * 2.0 ** min(retry - 1, 64), cap)


def strongest(actions: list[str]) -> str:
    return max(actions, key=STRENGTH.__getitem__) if actions else SUCCESS


def decide(policy: Policy, action: str, index_retries: int, total_retries: int) -> Decision:
    """The outcome of an attempt whose action is `action`, after `index_retries` retries of this job or index and
    `total_retries` of the whole job."""
    if action in (SUCCESS, IGNORE):
        return Decision(SUCCEEDED)
    if action == FAIL_JOB:
        return Decision(FAILED_JOB)
    if action == RETRY and policy.can_retry(index_retries, total_retries):
        return Decision(RETRIED, policy.delay(index_retries + 1))
    return Decision(FAILED)


class SuccessTracker:
    """An array's success policy: `indexes` all succeeded, or `count` of them (of all indexes without
    `indexes`) did. Each index is reported at most once."""

    __slots__ = ("needed", "left", "met")

    def __init__(self, indexes: IdSet | None, count: int | None) -> None:
        self.needed: set[int] | None = set(indexes) if indexes is not None else None
        self.left = count if count is not None else len(indexes) if indexes is not None else 0
        self.met = False

    def succeeded(self, index: int) -> bool:
        """Index `index` succeeded; True the first time the policy is met."""
        if self.met:
            return False
        if self.needed is not None:
            if index not in self.needed:
                return False
            self.needed.discard(index)
        self.left -= 1
        self.met = self.left <= 0
        return self.met
