"""Multifactor priority (docs/scheduling.md, "Priority"), after Slurm's priority/multifactor plugin:

    priority = W_fairshare · F_fairshare + W_queue · F_queue + W_urgency · F_urgency + W_age · F_age
               + W_jobsize · F_jobsize

with every factor in [0, 1]: the Fair Tree factor of the job's (bank, user) association; the queue's base priority
over the highest queue priority; urgency / 31; min(age / max_age, 1); the job's cores over the instance's cores.

The fair-share part is shared by all jobs of a bucket (queue, user, bank) and is the bucket's base in the
scheduler's order (broker/sched/ordering.py); the rest is the job's own term.  Pure: no I/O, no clock.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.sched import SchedJob
from minicluster.model.sharing import Weights

MAX_URGENCY = 31


class Priority:
    def __init__(self, weights: Weights, queue_priority: Mapping[str, int], total_cores: int = 0) -> None:
        self.weights = weights
        self.queue_priority = dict(queue_priority)
        top = max(self.queue_priority.values(), default=0)
        self._queue_scale = 1.0 / top if top else 0.0
        self.total_cores = total_cores

    def factors(self, job: SchedJob, now: float) -> dict[str, float]:
        """The job's own factors (everything but fair share), each in [0, 1]."""
        w = self.weights
        age = max(0.0, now - job.submit_time)
        return {
            "queue": self.queue_priority.get(job.queue, 0) * self._queue_scale,
            "urgency": job.urgency / MAX_URGENCY,
            "age": min(age / w.max_age, 1.0),
            "jobsize": min(job.cores / self.total_cores, 1.0) if self.total_cores else 0.0,
        }

    def term(self, job: SchedJob, now: float) -> float:
        """The job's own part of its priority (the scheduler's `term`)."""
        w = self.weights
        age = now - job.submit_time
        value = (w.queue * self.queue_priority.get(job.queue, 0) * self._queue_scale
                 + w.urgency * job.urgency / MAX_URGENCY)
        if w.age and age > 0:
            value += w.age * (age / w.max_age if age < w.max_age else 1.0)
        if w.jobsize and self.total_cores:
            value += w.jobsize * min(job.cores / self.total_cores, 1.0)
        return value

    def base(self, fairshare: float) -> float:
        """The bucket's part: its association's fair-share factor, weighted."""
        return self.weights.fairshare * fairshare

    def components(self, job: SchedJob, fairshare: float, now: float) -> dict[str, Any]:
        """Each factor, its weighted value and the total, as `mc jobs --priority` shows them."""
        w = self.weights
        factors = {"fairshare": fairshare, **self.factors(job, now)}
        weights = {"fairshare": w.fairshare, "queue": w.queue, "urgency": w.urgency, "age": w.age,
                   "jobsize": w.jobsize}
        weighted = {name: weights[name] * value for name, value in factors.items()}
        return {"factors": factors, "weighted": weighted, "priority": sum(weighted.values())}
