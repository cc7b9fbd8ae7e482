"""Sharing on rank 0 (docs/scheduling.md, "Queues, limits and fair share"): what a submission gets from its queue
and bank, the durable queue states and bank tree, fair share fed to the scheduler, and the periodic recomputation.

The pure parts live elsewhere: the config in minicluster/model/sharing.py, the fair-share factor and priority in
broker/policy/, limits, the bucket order and preemption choice in broker/sched/.  This module wires them to the
journal and the scheduler.
"""
from __future__ import annotations

import functools
import logging
import pwd
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any, cast

from broker import sched
from broker.job import Job, State
from broker.jobmanager import JobError, request_of
from broker.durable.journal import Journal, Statement
from broker.policy.fairshare import Assoc, FairShare
from broker.policy.priority import Priority
from broker.sched.limits import Usage as LimitUsage
from broker.share import accounting, store
from minicluster.config import InstanceConfig
from minicluster.model.jobspec import Jobspec
from minicluster.model.sharing import ROOT_BANK, QueueSpec
from minicluster.model.sharing import Sharing as SharingSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class QueueState:
    """Flux's two switches: `enabled` (accepts submissions) and `started` (its jobs are scheduled)."""

    enabled: bool = True
    started: bool = True
    reason: str = ""


MAX_UID = 2**32 - 1  # (uid_t)-1 is "no user" to the kernel


def uid_of(user: Any) -> int:
    """A user given as a uid or a login name (looked up on this node)."""
    if isinstance(user, str) and user.isascii() and user.isdigit():
        user = int(user)
    if isinstance(user, int) and not isinstance(user, bool):
        if not 0 <= user < MAX_UID:
            raise JobError("bad-request", f"uid {user} is not between 0 and {MAX_UID - 1}")
        return user
    if not isinstance(user, str) or not user or "\0" in user:
        raise JobError("bad-request", f"user must be a login name or a uid, got {user!r}")
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise JobError("not-found", f"no user {user!r} on the broker's node; give a numeric uid") from None


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Sharing:
    def __init__(self, config: InstanceConfig, journal: Journal, scheduler: sched.Scheduler) -> None:
        self.config = config
        self.journal = journal
        self.scheduler = scheduler
        self.weights = config.sharing.weights
        self.fairshare = FairShare(self.weights.half_life)
        self.config_banks: set[str] = set()
        self.config_members: set[Assoc] = set()
        self.defaults: dict[int, str] = {}
        self.state: dict[str, QueueState] = {}
        self.queues: dict[str, QueueSpec] = {}
        scheduler.limits = sched.LimitCounters()
        scheduler.preempt_grace = config.kill_grace
        scheduler.usage_hook = self._usage_changed
        self.apply(config.sharing)
        self._load()

    def apply(self, spec: SharingSpec) -> None:
        """Queues and priority weights (at start, and when the config file changes: the operator rewrites it
        when spec.queues changes).  Counts, queue switches and the bank tree stay; a queue that left the config
        but still has jobs stays too, until they are gone and the broker restarts."""
        queues: dict[str, QueueSpec] = {q.name: q for q in spec.queues}
        for name, old in self.queues.items():
            usage = self.scheduler.limits.by_queue.get(name)
            if name not in queues and usage is not None and (usage.pending or usage.running):
                queues[name] = old
        self.queues = queues
        self.default_queue = spec.default_queue
        for name in queues:
            self.state.setdefault(name, QueueState())
        self.weights = spec.weights
        self._gpu_weight = spec.weights.gpu_weight
        priorities = {q.name: q.priority for q in queues.values()}
        self.priority = Priority(spec.weights, priorities)
        scheduler = self.scheduler
        scheduler.limits.queues = {q.name: sched.QueueLimits(q.limits, q.user_limits) for q in queues.values()}
        scheduler.term = self.priority.term
        scheduler.queue_priority = priorities
        scheduler.preemptible = {q.name for q in queues.values() if q.preemptible}

    # --- start-up -----------------------------------------------------------------------------------------

    def _load(self) -> None:
        """The bank tree from the config, then the journal's own changes; queue states; saved usage."""
        spec = self.config.sharing
        for bank in spec.banks:
            self.config_banks.add(bank.name)
        for bank in _parents_first(spec.banks):
            self.fairshare.set_bank(bank.name, bank.parent, bank.shares)
            for user, shares in bank.users:
                uid = self.config_uid(user, f"banks.{bank.name}.users")
                if uid is not None:
                    self.fairshare.set_member(bank.name, uid, shares)
                    self.config_members.add((bank.name, uid))
        for user, default in spec.default_projects:
            uid = self.config_uid(user, "default_projects")
            if uid is not None:
                self.defaults[uid] = default
        for name, parent, shares in _rows_parents_first(store.banks(self.journal)):
            try:
                self.fairshare.set_bank(name, parent, shares)
            except ValueError as exc:
                log.warning("bank %s from the journal is ignored: %s", name, exc)
        for bank, uid, shares, is_default in store.members(self.journal):
            if bank == ROOT_BANK or bank in self.fairshare.banks:
                self.fairshare.set_member(bank, uid, shares)
                if is_default:
                    self.defaults[uid] = bank
        for name, enabled, started, reason in store.queue_states(self.journal):
            if name in self.state:
                self.state[name] = QueueState(bool(enabled), bool(started), reason)
                if not started:
                    self.scheduler.stop_queue(name)
        for bank, uid, value, t in store.fairshare_usage(self.journal):
            self.fairshare.restore((bank, uid), value, t)

    @staticmethod
    def config_uid(user: str, key: str) -> int | None:
        try:
            return uid_of(user)
        except JobError as exc:
            log.error("%s: %s; ignored", key, exc)
            return None

    # --- submissions --------------------------------------------------------------------------------------

    def resolve(self, uid: int, spec: Jobspec) -> Jobspec:
        """The jobspec as queued: its queue and bank named, the queue's time limits and constraints applied."""
        name = spec.queue or self.default_queue
        queue = self.queues.get(name)
        if queue is None:
            raise JobError("invalid-jobspec", f"queue: no queue {name!r} (queues: {', '.join(self.queues)})")
        state = self.state[name]
        if not state.enabled:
            why = f": {state.reason}" if state.reason else ""
            raise JobError("invalid-jobspec", f"queue: queue {name} is disabled (not accepting jobs){why}")
        try:
            project = self.fairshare.assoc(uid, spec.project or self.defaults.get(uid))[0]
        except ValueError as exc:
            raise JobError("invalid-jobspec", f"project: {exc}") from None
        limit = spec.time_limit
        if limit is None and queue.default_time_limit:
            limit = queue.default_time_limit
        if queue.max_time_limit and (limit or self.config.default_time_limit) > queue.max_time_limit:
            raise JobError("invalid-jobspec", f"time_limit: {limit or self.config.default_time_limit:g}s exceeds "
                                              f"queue {name}'s maximum of {queue.max_time_limit:g}s")
        requires = spec.requires + tuple(r for r in queue.requires if r not in spec.requires)
        return replace(spec, queue=name, project=project, time_limit=limit, requires=requires)

    def admit(self, uid: int, spec: Jobspec, request: sched.Request, count: int) -> None:
        """Refuse a job the queue's limits never let run, or that exceeds its max queued jobs."""
        why = self.scheduler.limits.refuse(spec.queue or self.default_queue, uid, request.total_cores,
                                           request.nslots * request.gpus_per_slot, count)
        if why is not None:
            raise JobError("invalid-jobspec", f"queue: {why}")
        self.fairshare.rate_change(self.assoc_of(uid, spec), 0.0, self.fairshare.t)

    def bucket_fields(self, uid: int, spec: Jobspec) -> dict[str, Any]:
        """SchedJob's queue, user and project for a job (jobs journaled before sharing get the defaults)."""
        queue = spec.queue if spec.queue in self.queues else self.default_queue
        return {"queue": queue, "user": uid, "project": self.assoc_of(uid, spec)[0]}

    def assoc_of(self, uid: int, spec: Jobspec) -> Assoc:
        project = spec.project
        if project is None or (project != ROOT_BANK and project not in self.fairshare.banks):
            return self.fairshare.assoc(uid, None)
        return (project, uid)

    # --- fair share and priorities ------------------------------------------------------------------------

    def _usage_changed(self, job: sched.SchedJob, n: int, now: float, ran: float) -> None:
        delta = n * (job.cores + self._gpu_weight * job.gpus)
        self.fairshare.rate_change((job.project or ROOT_BANK, job.user), delta, now, ran, -n if n < 0 else 0)

    def refresh(self, now: float) -> None:
        """Fair-share factors from decayed usage, given to the scheduler as bucket bases: O(associations)."""
        factors = self.fairshare.compute(now)
        weight = self.weights.fairshare

        def base(bucket: Hashable) -> float:
            _queue, user, project = cast(tuple[str, int, str], bucket)
            return weight * factors.get((project or ROOT_BANK, user), 1.0)

        self.scheduler.set_bucket_bases(base)

    def reprioritize(self, now: float) -> None:
        """Every pending job's own term again (age moves on): the periodic O(queue log queue) pass."""
        if self.weights.jobsize:
            self.priority.total_cores = sum(n.total_cores for n in self.scheduler.graph.nodes.values())
        self.scheduler.reprioritize(now)

    def save_usage(self, now: float) -> list[Statement]:
        """The decayed usage of every association, for the journal (restored at the next start)."""
        return [store.fairshare_usage_saved(bank, uid, value, now) for bank, uid, value in self.fairshare.snapshot(now)]

    def fairshare_of(self, bank: str | None, uid: int) -> float:
        return self.fairshare.factors.get((bank or ROOT_BANK, uid), 1.0)

    def components(self, job: Job, now: float) -> dict[str, Any] | None:
        """A pending job's priority factors and weighted values (`mc jobs --priority`)."""
        entry = self.scheduler.pending_job(job.id)
        if entry is None:
            return None
        return self.priority.components(entry, self.fairshare_of(entry.project, entry.user), now)

    # --- what jobs show and leave behind ------------------------------------------------------------------

    def describe(self, job: Job) -> dict[str, Any]:
        """The job summary's sharing fields (protocol.md §3.6)."""
        out: dict[str, Any] = {"priority": None, "pending_reason": None, "eff": None}
        if job.state == State.SCHED:
            out["priority"] = self.scheduler.priority_of(job.id)
            out["pending_reason"] = self.scheduler.reason_of(job.id)
        elif isinstance(job.acct, tuple):
            out["eff"] = {"cpu": job.acct[0], "mem": job.acct[1]}
        return out

    def finished(self, job: Job) -> list[Statement]:
        """The job's usage record, kept on the job, and its journal rows (written with its `finish` event)."""
        spec = job.spec
        assert spec is not None
        request = request_of(spec)  # the shape as scheduled (a resource tree included)
        usage = accounting.record(job.acct or accounting.Acct(), job.is_array, job.total_tasks,
                                  request.total_cores, request.nslots * request.gpus_per_slot,
                                  request.mem_per_slot, job.t_run, job.t_inactive or 0.0)
        job.acct = accounting.efficiencies(usage)  # all a finished job keeps; the rest is in job_usage
        queue = job.queue or self.default_queue
        project = job.project or self.fairshare.assoc(job.uid, None)[0]
        return accounting.finish_statements(job.id, job.uid, project, queue, usage, job.status)

    def gauges(self) -> dict[str, Any]:
        """Per-queue and per-user counts for the status endpoint and /metrics (broker/status_http.py)."""
        limits = self.scheduler.limits
        queues = {}
        for name in self.queues:
            usage = limits.by_queue.get(name) or LimitUsage()
            state = self.state[name]
            queues[name] = {**usage.to_wire(), "enabled": state.enabled, "started": state.started}
        users: dict[str, dict[str, Any]] = {}
        for (_queue, uid), usage in limits.by_user.items():
            total = users.setdefault(str(uid), {"name": user_name(uid), "pending": 0, "running": 0, "cores": 0,
                                                "gpus": 0})
            for key, value in usage.to_wire().items():
                total[key] += value
        return {"queues": queues, "users": users}

    def fairshare_gauges(self) -> dict[str, list[tuple[Any, ...]]]:
        """For /metrics, as of the last refresh (every fairshare_interval): (bank, usage, share of the machine)
        per bank and (bank, uid, name, usage, factor) per user association; usage in weighted core-seconds."""
        banks, users = [], []
        for node in self.fairshare.nodes:
            if node.user is None:
                banks.append((node.name, node.usage, node.norm_shares))
            else:
                users.append((node.parent, node.user, user_name(node.user), node.usage, node.factor))
        return {"banks": banks, "users": users}

    # --- queue states -------------------------------------------------------------------------------------

    def set_state(self, names: list[str], action: str, reason: str) -> list[str]:
        """start/stop (scheduling) or enable/disable (accepting) queues; journaled."""
        for name in names:
            if name not in self.queues:
                raise JobError("not-found", f"no queue {name!r} (queues: {', '.join(self.queues)})")
        statements: list[Statement] = []
        for name in names:
            state = self.state[name]
            if action in ("start", "stop"):
                state.started = action == "start"
                (self.scheduler.start_queue if state.started else self.scheduler.stop_queue)(name)
            else:
                state.enabled = action == "enable"
            state.reason = "" if state.enabled and state.started else reason
            statements.append(store.queue_state_saved(name, state.enabled, state.started, state.reason))
        self.journal.write(statements)
        return names


def _parents_first(banks: Any) -> list[Any]:
    """Banks ordered so each comes after its parent (the config's order is free)."""
    return [b for _n, _p, _s, b in _rows_parents_first([(b.name, b.parent, b.shares, b) for b in banks])]


def _rows_parents_first(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    placed: set[str] = {ROOT_BANK}
    out: list[tuple[Any, ...]] = []
    left = list(rows)
    while left:
        ready = [r for r in left if r[1] in placed]
        if not ready:
            out.extend(left)  # an orphan or a loop: set_bank refuses it with a message
            break
        for row in ready:
            placed.add(row[0])
            out.append(row)
        left = [r for r in left if r[0] not in placed]
    return out
