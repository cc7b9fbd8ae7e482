"""The rank-0 core without sockets or processes: the real JobManager, Execution, scheduler and journal, wired as
broker/service.py wires them, with the test kit's fakes at the edges.

- time is a FakeClock (JobManager's `clock`; Execution reads the manager's);
- the overlay's `send` is a RecordingSender, so every `run`, `kill` and `done-ack` passes through the codec;
- the journal is the real sqlite journal (broker/durable/journal.py, its writer thread included), on tmpfs when there
  is one: a test takes milliseconds, not the ~10 ms per commit of FULL sync on a disk;
- nothing schedules by itself: the test says when (`schedule()`), as the broker's `_wake_scheduler` would.

Sharing (queues, banks, accounting) stays off, as in a manager whose `sharing` was never set.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from broker.flow import recovery as flowrecovery
from broker import nodes, sched
from broker.execution import Execution
from broker.job import Job
from broker.jobmanager import JobManager
from broker.durable.journal import Journal, Statement
from broker.recovery import Reattach, load
from broker.durable.store import unpack
from broker.supervise import Supervisor
from broker.watchers import Watchers
from minicluster.config import InstanceConfig
from minicluster.testing import FakeClock, RecordingSender, flushed, jobspec, resources

URI = "unix:///nonexistent/core-rig.sock"
TMPFS = "/dev/shm"


@contextlib.asynccontextmanager
async def started(fallback: Path, **config: Any) -> AsyncIterator[Core]:
    """A started Core of a two-rank instance (ranks join with `add_rank`); its journal lives on tmpfs when there
    is one (else in `fallback`) and is removed on exit."""
    with contextlib.ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=TMPFS))) if os.access(TMPFS, os.W_OK) \
            else fallback
        core = Core(InstanceConfig(size=2, state_dir=os.fspath(base / "state"), **config), FakeClock())
        core.start()
        try:
            yield core
        finally:
            await core.close()


@contextlib.asynccontextmanager
async def restarted(previous: Core, advance: float = 5.0) -> AsyncIterator[Core]:
    """The next life of rank 0: `previous` stops after its last commit (kill -9), a fresh one loads its journal
    as Broker.__init__ does and starts with the reattach window open; `advance` seconds pass in between."""
    await previous.close()
    previous.clock.advance(advance)
    core = Core(previous.config, previous.clock)
    core.placed = previous.placed
    recovered = load(core.manager)
    core.manager.next_id = recovered.next_id
    core.epoch = recovered.epoch
    core.reattach = Reattach(core.manager, recovered.active)
    core.workflows = flowrecovery.recover(core.manager.workflow, core.journal, recovered.active)
    core.start()
    try:
        yield core
    finally:
        await core.close()


class Core:
    """One life of rank 0 on the journal in `config.state_dir`; `restarted` gives the next life on that journal."""

    def __init__(self, config: InstanceConfig, clock: FakeClock) -> None:
        self.config = config
        self.clock = clock
        self.journal = Journal(self.config.state_dir)
        self.graph, _ = nodes.build_graph(self.config)
        self.scheduler = sched.Scheduler(self.graph, self.config.policy, self.config.default_time_limit)
        self.watchers = Watchers()
        self.sender = RecordingSender(rank=0)
        # What a workflow ran in the background and failed (the broker would stop on it).
        self.background_failures: list[tuple[str, BaseException]] = []
        self.manager = JobManager(self.config, self.journal, self.scheduler, self.watchers, os.getuid(), next_id=1,
                                  tasks=self._execution, wake_scheduler=lambda: None,
                                  background=Supervisor(lambda name, exc: self.background_failures.append((name, exc))),
                                  clock=self.clock)
        # Set in a restarted core until `settle` closes the window.
        self.reattach: Reattach | None = None
        self.workflows: flowrecovery.Recovered | None = None
        # (job, task) -> (rank, cores) of every task `running` saw dispatched, in this life or the ones before.
        self.placed: dict[tuple[int, int], tuple[int, list[int]]] = {}
        self.epoch = 0
        self.crashed = False

    def _execution(self, manager: JobManager) -> Execution:
        self.execution = Execution(self.config, manager, self.sender.send, URI, monotonic=self.clock)
        return self.execution

    def start(self) -> None:
        self.journal.start()

    async def close(self) -> None:
        await self.journal.close()

    # --- driving -------------------------------------------------------------------------------------------

    def add_rank(self, rank: int, override: str = "cores=2,memory=4096") -> None:
        assert nodes.add_rank(self.graph, rank, resources(override).to_wire(), frozenset()) is None
        self.manager.ranks_changed()

    def submit(self, argv: tuple[str, ...] = ("true",), **fields: Any) -> Job:
        job_id, _ = self.manager.submit(os.getuid(), os.getgid(), jobspec(argv, **fields))
        return self.manager.jobs[job_id]

    async def running(self, **fields: Any) -> Job:
        """Submit a job that starts in this scheduling pass, and wait until its `run`s went out."""
        record = self.submit(**fields)
        await self.durable()  # a job is queued once its submission is durable
        assert record.id in {start.job_id for start in self.schedule()}, "the job should start now"
        await self.durable()
        for rank, entries in self.runs():
            for job_id, task, _index, cores, *_ in entries:
                self.placed[(job_id, task)] = (rank, cores)
        return record

    def schedule(self) -> list[sched.Start]:
        starts = self.scheduler.schedule(self.clock())
        if starts:
            self.execution.start(starts)
        self.execution.window.recall_overtaken()
        return starts

    async def turn(self) -> None:
        """The end of the event loop's turn: what waits for it is sent (the dispatch window's recalls)."""
        await asyncio.sleep(0)

    async def durable(self) -> None:
        """Everything posted so far is committed, and its commit callbacks (run dispatch, watchers) have run."""
        assert not self.crashed, "a crashed life commits nothing more: go on with `restarted`"
        await flushed(self.journal)
        await flushed(self.journal)  # callbacks of the first flush may have written (a `run` after its alloc)

    def done(self, rank: int, job: Job, task: int, status: int = 0, error: str | None = None,
             attempt: int | None = None) -> None:
        """The worker on `rank` reports one result (protocol.md §2.5 `done`; §2.9 for `attempt`)."""
        started = self.clock() - 1.0
        result = [job.id, task, status, status if status < 128 else None, status - 128 if status >= 128 else None,
                  error, started, self.clock()]
        self.execution.on_done(rank, [result if attempt is None else [*result, attempt]])

    def reports(self, *running: tuple[Job, list[int]]) -> dict[int, list[list[Any]]]:
        """What the workers running these (job, tasks) list in their `join` (protocol.md §2.7), by rank."""
        out: dict[int, list[list[Any]]] = defaultdict(list)
        for job, tasks in running:
            for task in tasks:
                rank, cores = self.placed[(job.id, task)]
                out[rank].append([job.id, task, cores, []])
        return out

    def settle(self, reports: dict[int, list[list[Any]]]) -> None:
        """Close the reattach window with these reports, as Broker._close_reattach_window does."""
        assert self.reattach is not None and self.workflows is not None
        for rank, running in reports.items():
            self.reattach.report(rank, running)
        self.reattach.settle(self.execution, self.clock())
        self.reattach = None
        flowrecovery.settled(self.manager.workflow, self.workflows)

    def crash_at(self, event: str) -> None:
        """Rank 0 dies just before the write that carries `event`: nothing from that write on reaches the journal.

        A fault at the journal's edge (as kill -9 between two commits), not a change to what the manager does:
        its in-memory effects go on and are thrown away with this life."""
        self.crashed = True
        journal = self.journal
        append, write = journal.append, journal.write
        dead = False

        def alive(statements: list[Statement]) -> bool:
            nonlocal dead
            dead = dead or any(sql.startswith("INSERT INTO events") and params[3] == event
                               for sql, params in statements)
            return not dead

        def crashing_append(statements: list[Statement], then: Callable[[], None] | None = None) -> None:
            if alive(statements):
                append(statements, then)

        def crashing_write(statements: list[Statement]) -> asyncio.Future[None]:
            return write(statements) if alive(statements) else asyncio.get_running_loop().create_future()

        journal.append = crashing_append  # type: ignore[method-assign]
        journal.write = crashing_write  # type: ignore[method-assign]

    # --- reading -------------------------------------------------------------------------------------------

    def events(self, job: Job) -> list[tuple[str, dict[str, Any]]]:
        """The job's durable eventlog as `mc eventlog` reads it: (name, context) in order."""
        rows = self.journal.query("SELECT name, context FROM events WHERE job=? ORDER BY seq", (job.id,))
        return [(name, unpack(context)) for name, context in rows]

    def event_names(self, job: Job) -> list[str]:
        return [name for name, _ in self.events(job)]

    def kills(self) -> list[tuple[int, list[list[int]], int]]:
        """(rank, keys, signal) of every `kill` sent since the last look."""
        return [(m.dst, m.body["keys"], m.body["signal"]) for m in self.sender.take("kill")]

    def runs(self) -> list[tuple[int, list[list[Any]]]]:
        """(rank, [job, task, ...] entries) of every `run` sent since the last look."""
        return [(m.dst, m.body["tasks"]) for m in self.sender.take("run")]
