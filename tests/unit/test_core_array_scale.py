"""An array's cost per element does not grow with the array (issue 17 item 5), counted, not timed: the broker's
core (tests/unit/core_rig.py) runs a small and a ten times larger array the way a worker would report them, and
every container it holds stays as large for both, while the journal gets one row per element and a fixed number
besides."""
from __future__ import annotations

import collections

import pytest

from broker.job import Job, State
from tests.unit import core_rig
from tests.unit.core_rig import Core

RANKS, CORES = 2, 64
SLOTS = RANKS * CORES
# The small one is past every fixed allowance already (the deadline heap drops ended tasks' entries past 1,024).
SMALL, LARGE = 2_000, 10_000
# One bit per element, by design: results re-sent after a restart are told apart from new ones (broker/job.py).
PER_ELEMENT_BY_DESIGN = {"done_bits"}
Footprint = dict[str, int]


# Two elements wait behind each busy core (protocol.md §2.10), whatever their length: both arrays fill the window.
WINDOW = {"dispatch_window": 2, "dispatch_window_seconds": 1e9}


@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path, **WINDOW) as rig:
        for rank in range(RANKS):
            rig.add_rank(rank, f"cores={CORES},memory=4096")
        yield rig


def footprint(roots: dict[str, object], depth: int = 3) -> Footprint:
    """len() of every container reachable from `roots` through attributes and dict values, by path."""
    sizes: Footprint = {}
    seen: set[int] = set()

    def walk(path: str, obj: object, left: int) -> None:
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, (dict, list, set, frozenset, tuple, collections.deque, bytearray)):
            sizes[path] = len(obj)
            if isinstance(obj, dict) and left:
                for key, value in list(obj.items())[:SLOTS]:
                    walk(f"{path}[]" if isinstance(key, (int, tuple)) else f"{path}[{key}]", value, left - 1)
            return
        if not left:
            return
        names = getattr(obj, "__dict__", {}).keys() | set(getattr(type(obj), "__slots__", ()))
        for name in names:
            if name not in PER_ELEMENT_BY_DESIGN and hasattr(obj, name):
                walk(f"{path}.{name}", getattr(obj, name), left - 1)

    for name, root in roots.items():
        walk(name, root, depth)
    return sizes


async def run_array(core: Core, n: int) -> tuple[Footprint, int]:
    """Run an n-element array to its end as workers would, batching each rank's results; the largest size each
    container reached on the way, and the statements the journal took."""
    job: Job = core.submit(("true", "{cc}"), array=f"1-{n}")
    await core.durable()
    statements = core.journal.statements
    peak: Footprint = collections.Counter()
    while job.state is not State.INACTIVE:
        core.schedule()
        await core.durable()
        core.sender.take()  # what went to the workers: the test plays them from the core's own view below
        by_rank: dict[int, list[int]] = collections.defaultdict(list)
        for (job_id, task), running in core.execution.tasks.items():
            if job_id == job.id:
                by_rank[running.rank].append(task)
        assert by_rank, "an unfinished array always has elements running"
        now = core.clock()
        for rank, tasks in by_rank.items():  # each worker reports all its ends at once; the window starts the next
            core.execution.on_done(rank, [[job.id, task, 0, 0, None, None, now, now] for task in tasks])
            roots = {"execution": core.execution, "scheduler": core.scheduler, "manager": core.manager,
                     "job": job}
            for path, size in footprint(roots).items():
                peak[path] = max(peak[path], size)
        core.execution.check_deadlines(now)  # as the broker does every 0.1 s
        core.clock.advance(0.001)
    await core.durable()
    return dict(peak), core.journal.statements - statements


async def test_no_container_of_the_core_grows_with_the_array_and_each_element_is_one_journal_row(core: Core) -> None:
    small_peak, small_rows = await run_array(core, SMALL)
    large_peak, large_rows = await run_array(core, LARGE)
    grown = {path: (small_peak.get(path, 0), size) for path, size in large_peak.items()
             if size > small_peak.get(path, 0) + SLOTS}
    assert grown == {}, "containers larger for a larger array (path: small, large)"
    assert large_rows - LARGE == small_rows - SMALL, "journal statements besides one per element"
    assert not core.execution.tasks and not core.scheduler._running and not core.execution.by_job
