"""Graph-based resource matcher and queue scheduler (pure library, no I/O).

The broker builds a ResourceGraph from worker hellos, queues SchedJobs on a
Scheduler and calls schedule(now) from its event loop; see docs/scheduling.md.
"""

from .alloc import Allocation, RankAlloc, Slot
from .backfill import Reservation
from .graph import ResourceGraph
from .jobs import Preemption, SchedJob, Start
from .limits import LimitCounters, QueueLimits
from .policies import DEFAULT_POLICY, POLICIES, check_policy
from .queue import DEFAULT_BACKFILL_DEPTH, Scheduler
from .request import InfeasibleRequest, Request, format_constraint, parse_constraint
from .walk import rebuild as rebuild_allocation

__all__ = [
    "Allocation", "DEFAULT_BACKFILL_DEPTH", "DEFAULT_POLICY", "InfeasibleRequest", "LimitCounters", "POLICIES",
    "Preemption", "QueueLimits", "RankAlloc", "Request", "Reservation", "ResourceGraph", "SchedJob", "Scheduler",
    "Slot", "Start", "check_policy", "format_constraint", "parse_constraint", "rebuild_allocation",
]
