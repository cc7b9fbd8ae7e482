"""Task execution as seen from rank 0: dispatch (`run`), results (`done`), output, kills, time limits and
lost ranks (protocol.md §2.5–2.7); the PMI exchange is broker/pmiexchange.py's, the window broker/window.py's, and
what each result is and means broker/results.py's (pure): `on_done` carries its verdicts out.

Tracks every running task by (job, task) with its rank, so a lost rank, a cancel or a time limit can be
turned into the right `kill` messages and exceptions.  Job-level consequences go back to the JobManager.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import secrets
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

from broker import sched
from broker.durable import store
from broker.job import Job, State
from broker.jobmanager import JobManager, request_of
from broker.pmiexchange import PmiExchange
from broker import results
from broker.results import FINAL, JUDGE, SECOND_RUN, STRAY
from broker.durable.journal import Statement, when_durable
from broker.share import accounting
from broker.stdin import StdinRelay
from broker.window import DispatchWindow
from minicluster.proto import messages
from minicluster.proto.messages import Send
from minicluster.proto.rows import Result
from minicluster.config import InstanceConfig
from minicluster.model.idset import IdSet

log = logging.getLogger(__name__)

Key = tuple[int, int]
NODE_LOST_STATUS = 128 + signal.SIGKILL


class RunningTask(NamedTuple):
    rank: int
    element: int
    started: float  # wall clock, for results and users
    timed_from: float  # monotonic: the time limit counts from here, whatever the wall clock does


class FreedCores:
    """What the results of one `done` did with their cores, carried out together once all are read."""

    __slots__ = ("now", "released", "passed", "aheads", "killed")

    def __init__(self, now: float) -> None:
        self.now = now
        self.released: list[tuple[int, int]] = []  # array elements whose cores go back to the scheduler
        self.passed: dict[int, list[tuple[int, int]]] = {}  # job -> (element, the one that took over its cores)
        self.aheads: dict[int, messages.Ahead] = {}  # chains topped up, per rank
        self.killed: list[Key] = []  # entries that started behind a task of a job that is ending


class DoneBatch:
    """What carrying out the results of one `done` gathers, to write, free and finish together at its end."""

    __slots__ = ("now", "freed", "statements", "usage_rows", "touched")

    def __init__(self, now: float) -> None:
        self.now = now
        self.freed = FreedCores(now)
        self.statements: list[Statement] = []
        self.usage_rows: list[Statement] = []  # after the task rows, so each kind still goes through one executemany
        self.touched: dict[int, Job] = {}  # the jobs whose results came, in the order they came


NO_STRAYS: frozenset[Key] = frozenset()


class Execution:
    def __init__(self, config: InstanceConfig, manager: JobManager, send: Send, uri: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        # The clock time limits count on (a test passes a fake one).
        self.monotonic = monotonic
        self.manager = manager
        self.send = send
        self.uri = uri
        self.tasks: dict[Key, RunningTask] = {}
        self.by_rank: dict[int, set[Key]] = defaultdict(set)
        self.by_job: dict[int, set[Key]] = defaultdict(set)
        self._deadlines: list[tuple[float, int, int]] = []
        # Plain jobs whose `run` waits for their alloc event to be durable.
        self._undispatched: set[int] = set()
        # Array elements being preempted (broker/share/preemption.py): they end counted as cancelled.
        self.preempted: dict[Key, str] = {}
        # Per rank: the tasks it came back running that rank 0 neither knew there nor could adopt (recorded already,
        # running or waiting ahead elsewhere, or of a job that ends), killed at its join: such a run does not count
        # (protocol.md §2.10).
        self._strays: dict[int, set[Key]] = {}
        self.stdin = StdinRelay(send)
        self.pmi = PmiExchange(manager, send)
        self.window = DispatchWindow(config, manager, send, self.tasks, self.jobinfo)
        # Since this broker started, for rates (`mc top`).
        self.tasks_started = 0
        self.tasks_ended = 0
        self.tasks_failed = 0  # of those ended, with a non-zero status (as judged: a retried attempt is not one)

    # --- dispatch ------------------------------------------------------------------------------------------

    def start(self, starts: list[sched.Start]) -> None:
        batches: dict[int, messages.Run] = {}
        aheads: dict[int, messages.Ahead] = {}
        gangs: list[tuple[Job, list[tuple[int, sched.Slot]], messages.JobInfo]] = []
        stale: list[tuple[int, int]] = []
        now = self.manager.clock()
        durable: asyncio.Future[None] | None = None
        for st in starts:
            job = self.manager.jobs.get(st.job_id)
            if job is None or job.state == State.INACTIVE:
                stale.append((st.job_id, st.element))
            elif job.is_array:
                self._start_element(job, st, now, batches, aheads, stale)
            else:
                durable = self._start_job(job, st, now, gangs)
        if stale:
            # A task that a run rank 0 had taken back recorded after all (protocol.md §2.10): not run again.
            log.info("%d queued elements were recorded meanwhile: not started", len(stale))
            self.manager.scheduler.release_many(stale, now)
            self.manager.wake_scheduler()
        for rank, run in batches.items():
            messages.send(self.send, rank, run)
        self._send_ahead(aheads)  # after the `run`s: an entry must find the task it follows
        if durable is not None:
            # Journal writes commit in order: once the last alloc is durable, all of this pass's are.
            durable.add_done_callback(lambda _: self._dispatch_gangs(gangs))

    def _track(self, job: Job, task: int, rank: int, element: int, now: float) -> None:
        assert job.spec is not None
        limit = self.manager.time_limit(job.spec)
        key = (job.id, task)
        running = self.tasks[key] = RunningTask(rank, element, now, self.monotonic())
        self.by_rank[rank].add(key)
        self.by_job[job.id].add(key)
        job.task_started(rank)
        self.tasks_started += 1
        heapq.heappush(self._deadlines, (running.timed_from + limit, job.id, task))

    def adopt(self, job: Job, task: int, element: int, rank: int, allocation: sched.Allocation | None,
              now: float) -> None:
        """Track a task that survived a broker restart (broker/recovery.py) or that its rank came back running
        (`reconcile`); ValueError, with nothing changed, if the allocation's resources are not free."""
        if allocation is not None:
            assert job.spec is not None
            self.manager.scheduler.adopt(job.id, element, allocation, now, self.manager.time_limit(job.spec),
                                         job=self.manager.sched_job(job, request_of(job.spec)))
        self._track(job, task, rank, element, now)

    def _start_element(self, job: Job, st: sched.Start, now: float, batches: dict[int, messages.Run],
                       aheads: dict[int, messages.Ahead], stale: list[tuple[int, int]]) -> None:
        task = job.pending_map[st.element] if job.pending_map is not None else st.element
        if job.is_done(task) or (job.id, task) in self.tasks:  # recorded, or adopted (protocol.md §2.10)
            stale.append((job.id, st.element))
            return
        ((rank, slot),) = st.allocation.tasks
        self.manager.post_started(job, str(rank))
        self._track(job, task, rank, st.element, now)
        batch = batches.get(rank)
        if batch is None:
            batch = batches[rank] = messages.Run()
        if job.id not in batch.jobs:
            batch.jobs[job.id] = self.jobinfo(job, [[rank, 1]])
        cores, gpus = list(slot.cores), list(slot.gpus)
        entry = [job.id, task, job.index_of(task), cores, gpus]
        flow = job.flow
        if flow is not None and flow.attempts and task in flow.attempts:
            entry.append(flow.attempts[task])   # protocol.md §2.9; absent means attempt 0
        batch.tasks.append(entry)
        if self.window.depth:
            self.window.fill(job, (job.id, task), rank, cores, gpus, aheads)

    def _send_ahead(self, aheads: dict[int, messages.Ahead]) -> None:
        for rank, ahead in aheads.items():
            messages.send(self.send, rank, ahead)

    def _start_job(self, job: Job, st: sched.Start, now: float,
                   gangs: list[tuple[Job, list[tuple[int, sched.Slot]], messages.JobInfo]]) -> asyncio.Future[None]:
        slots = st.allocation.task_slots()
        for task, (rank, _) in enumerate(slots):
            self._track(job, task, rank, 0, now)
        layout = [[rank, len(ra.slots)] for rank, ra in st.allocation.items()]
        self._undispatched.add(job.id)
        gangs.append((job, slots, self.jobinfo(job, layout)))
        durable = self.manager.post_started(job, str(IdSet.from_ints(job.ranks)), durable=True)
        assert durable is not None, "the scheduler starts only queued jobs"
        return durable

    def _dispatch_gangs(self, gangs: list[tuple[Job, list[tuple[int, sched.Slot]], messages.JobInfo]]) -> None:
        """Send the `run`s of plain jobs whose alloc is durable, one message per rank for all of them."""
        per_rank: dict[int, messages.Run] = {}
        readers: dict[int, dict[int, list[int]]] = {}
        for job, slots, info in gangs:
            # A cancel that came before the alloc was durable already ended these tasks.
            if job.id not in self._undispatched:
                continue
            self._undispatched.discard(job.id)
            attempt = [job.flow.attempt] if job.flow is not None and job.flow.attempt else []
            for task, (rank, slot) in enumerate(slots):
                run = per_rank.get(rank)
                if run is None:
                    run = per_rank[rank] = messages.Run()
                run.jobs[job.id] = info
                run.tasks.append([job.id, task, task, list(slot.cores), list(slot.gpus), *attempt])
            if info.stdin:
                reading = set(info.stdin)
                targets: dict[int, list[int]] = {}
                for task, (rank, _slot) in enumerate(slots):
                    if task in reading:
                        targets.setdefault(rank, []).append(task)
                readers[job.id] = targets
        for rank, run in per_rank.items():
            messages.send(self.send, rank, run)
        if self.window.depth:  # after the `run`s: chains of small single jobs behind the one-core ones
            aheads: dict[int, messages.Ahead] = {}
            for job, slots, _info in gangs:
                if len(slots) == 1 and job.id not in self._undispatched and job.id in self.by_job:
                    rank, slot = slots[0]
                    self.window.fill_jobs((job.id, 0), rank, list(slot.cores), list(slot.gpus), aheads)
            self._send_ahead(aheads)
        for job_id, targets in readers.items():
            self.stdin.dispatched(job_id, targets)

    def jobinfo(self, job: Job, layout: list[list[int]]) -> messages.JobInfo:
        spec = job.spec
        assert spec is not None
        env = dict(spec.env)
        env["MC_URI"] = self.uri
        mpi = spec.pmi_mode if not job.is_array else None
        kvsname = None
        if mpi is not None:
            # One name per dispatch, the same on every worker (it is the MPI process group's identity), and new
            # for each one: MPICH names its shared-memory segments after it (docs/mpi.md, kvsname).
            kvsname = f"mc-{job.id}-{secrets.token_hex(6)}"
            if spec.mpi is None:  # the program's ELF decides, else the instance's default
                default = self.config.mpi_default
                mpi = default if default == "auto" else f"auto:{default}"
        return messages.JobInfo(
            argv=list(spec.argv), env=env, ntasks=job.total_tasks, layout=layout, uid=job.uid, gid=job.gid,
            cwd=spec.cwd, output=spec.output, mpi=mpi, array=job.is_array, stdin=spec.stdin_tasks,
            mem_per_task=spec.mem_per_task, umask=spec.umask, kvsname=kvsname)

    # --- results and output --------------------------------------------------------------------------------

    def on_done(self, rank: int, rows: list[list[Any]], ack: bool = True) -> None:
        """Carry out what broker/results.py judges each result of a batch from `rank` to be, one after another;
        write the batch's rows at once and acknowledge it once they are durable."""
        batch = DoneBatch(self.manager.clock())
        strays = self._strays.get(rank, NO_STRAYS) if self._strays else NO_STRAYS
        keys = []
        jobs, tasks, preempted = self.manager.jobs, self.tasks, self.preempted
        for row in rows:
            result = Result.of_checked(row)  # checked as its message was decoded (or built in _end_locally)
            job_id, task = result.job, result.task
            keys.append([job_id, task, result.attempt] if result.attempt else [job_id, task])
            job = jobs.get(job_id)
            running = tasks.get((job_id, task))
            verdict = results.sort(rank, result, job, None if running is None else running.rank, strays)
            if job is None:
                continue  # purged: acknowledged only, as the verdicts not handled below
            if verdict is FINAL:
                was_preempted = (job_id, task) in preempted if preempted else False
                final = results.final(rank, result, job, (result.status, False), was_preempted, batch.now)
                self._record(rank, job, result, row, final, batch)
            elif verdict is JUDGE:
                self._judge(rank, job, result, row, batch)
            elif verdict is SECOND_RUN:
                self._give_back(job, task, batch)
            elif verdict is STRAY:
                self._strays[rank].discard((job_id, task))  # once: a later run of it counts
        self._settle_freed(batch.freed)
        self.manager.workflow.attempts.commit()
        fut = self.manager.journal.write(batch.statements + batch.usage_rows)
        self._count_unrecorded(fut, len(batch.statements))
        if ack and keys:  # each result's `done-ack` key: the attempt left out when 0 (protocol.md §2.9)
            when_durable(fut, lambda: messages.send(self.send, rank, messages.DoneAck(keys)))
        for job in batch.touched.values():
            self._after_results(job, batch.now)

    def _judge(self, rank: int, job: Job, result: Result, row: list[Any], batch: DoneBatch) -> None:
        """A workflow's attempt, judged by broker/flow/attempts.py: recorded as the task's result if final, else
        recorded as an attempt (it held its cores all the same) and queued again once that is durable."""
        judged = self.manager.workflow.attempts.judge(job, result.task, rank, row, result.attempt)
        if judged is not None:
            preempted = (job.id, result.task) in self.preempted
            self._record(rank, job, result, row, results.final(rank, result, job, judged, preempted, batch.now),
                         batch)
            return
        self._account(job, result, row, batch.usage_rows)
        running = self._untrack((job.id, result.task))
        if running is not None:
            job.task_stopped()
            if job.is_array:
                self._free_slot(job, result.task, running, batch.freed)
        batch.touched[job.id] = job

    def _record(self, rank: int, job: Job, result: Result, row: list[Any], final: results.Final,
                batch: DoneBatch) -> None:
        """Record a task's result and carry out what it means for the job (`results.final`)."""
        task = result.task
        key = (job.id, task)
        if final.started_ahead:
            self.window.started_ahead(job, rank)  # it started ahead before a restart (protocol.md §2.10)
        job.mark_done(task)
        running = self._untrack(key)
        self.tasks_ended += 1
        self.tasks_failed += bool(final.counted)
        if self.preempted:
            self.preempted.pop(key, None)
        batch.statements.append(store.task_result(job.id, task, job.index_of(task), rank, result.status,
                                                  result.exit_code, result.signal, result.error, result.started,
                                                  result.ended))
        self._account(job, result, row, batch.usage_rows)
        job.record_result(final.counted, was_running=running is not None, cancelled=final.cancelled)
        if running is not None:
            self._free_slot(job, task, running, batch.freed)
            started, ended = result.started, result.ended
            if not job.is_array and self.window.depth and started is not None and ended is not None:
                self.window.observe(job, ended - started)
        elif self.window.ahead and key in self.window.ahead:
            if self.window.ahead[key].rank == rank:
                self.window.ended_early(key)  # its predecessor's result is still to come
            else:
                self.window.recall([key])  # recorded from a run rank 0 took back: not needed again
        failure = final.failure
        if failure is not None:
            if failure.decides:
                self.pmi.task_failed(job, task, failure.at, failure.cause)
            if failure.reason:
                job.reason = failure.cause[1]
        batch.touched[job.id] = job

    def _give_back(self, job: Job, task: int, batch: DoneBatch) -> None:
        """A second run of a task recorded already (an entry that waited ahead of it) ended: its cores come back."""
        running = self._untrack((job.id, task))
        assert running is not None
        job.task_stopped()
        self._free_slot(job, task, running, batch.freed)
        batch.touched[job.id] = job

    def _free_slot(self, job: Job, task: int, running: RunningTask, freed: FreedCores) -> None:
        """A task ended: its cores go to the entry sent ahead to follow it, which the worker has started in its
        place (protocol.md §2.10), else back to the scheduler (an array element's here, a job's once it ended)."""
        started = self.window.successor((job.id, task)) if self.window.ahead else None
        if started is None:
            if job.is_array:
                freed.released.append((job.id, running.element))
            return
        key, ahead = started
        following = self.manager.jobs[key[0]]  # a single job sent ahead finishes only once it is back or ran
        now = freed.now
        if following is job:
            freed.passed.setdefault(job.id, []).append((running.element, ahead.element))
        else:
            self.window.started_ahead(following, ahead.rank)
            self.manager.scheduler.hand_over(job.id, running.element, following.id, now)
        self._track(following, key[1], ahead.rank, ahead.element, now)
        if following.ending or following.state == State.INACTIVE:
            freed.killed.append(key)
        elif following is job:
            self.window.fill(job, key, ahead.rank, ahead.cores, ahead.gpus, freed.aheads)
        else:
            self.window.fill_jobs(key, ahead.rank, ahead.cores, ahead.gpus, freed.aheads)

    def _settle_freed(self, freed: FreedCores) -> None:
        scheduler, now = self.manager.scheduler, freed.now
        for job_id, passes in freed.passed.items():  # before the releases: an element passed to may have ended too
            scheduler.pass_on(job_id, passes, now)
        if freed.released:
            # Array elements free their cores together: one accounting pass per node.
            scheduler.release_many(freed.released, now)
        self._send_ahead(freed.aheads)
        if freed.killed:
            self._signal(freed.killed, signal.SIGTERM)

    def _count_unrecorded(self, fut: asyncio.Future[None], count: int) -> None:
        """Results recorded but not yet durable, the window's measure of a lagging journal."""
        if not count or not self.window.depth:
            return
        window = self.window
        window.unrecorded += count

        def durable(_: asyncio.Future[None]) -> None:
            window.unrecorded -= count
        fut.add_done_callback(durable)

    def on_returned(self, rank: int, keys: list[list[int]]) -> None:
        """Elements sent ahead came back unstarted (protocol.md §2.10): queued again."""
        self._requeue(self.window.returned(rank, keys))

    def _requeue(self, tasks_by_job: dict[int, list[int]]) -> None:
        for job_id, tasks in tasks_by_job.items():
            job = self.manager.jobs.get(job_id)
            if job is None:
                continue
            if job.is_array:
                # Nothing for a job that is ending, nor for a task that a run rank 0 had taken back recorded after
                # all or runs (adopted).
                self.manager.workflow.attempts.queue_tasks(
                    job, [task for task in tasks if not job.is_done(task) and (job_id, task) not in self.tasks])
            else:
                self.manager.scheduler.drop_ahead(job_id)
                self.manager.workflow.attempts.queue_plain(job)  # nor here; nor while it is held
            self.manager.maybe_finish(job)
        if tasks_by_job:
            self.manager.wake_scheduler()

    @staticmethod
    def _account(job: Job, result: Result, row: list[Any], usage_rows: list[Any]) -> None:
        """Add one result to the job's usage sums (broker/share/accounting.py): the per-result hot path."""
        acct = job.acct
        if acct is None:
            acct = job.acct = accounting.Acct()
        started, ended = result.started, result.ended
        if ended is not None and started is not None and ended >= started:
            acct.span(started, ended)
        if result.usage is not None:  # CPU time and peak memory, if it carries them (the test executor's do not)
            used = accounting.note_usage(job, acct, row)
            if used is not None:
                usage_rows.append(used)

    def _after_results(self, job: Job, now: float) -> None:
        scheduler = self.manager.scheduler
        # In the reattach window results may end a job whose allocation is not adopted yet: nothing to release.
        if not job.is_array and job.running == 0 and job.state == State.RUN and scheduler.holds(job.id, 0):
            scheduler.release(job.id, 0, now)
        if job.flow is not None:
            self.manager.workflow.attempts.after_results(job)
        self.pmi.abort_gang(job)
        self.manager.maybe_finish(job)
        self.pmi.drop_ended()
        self.manager.wake_scheduler()

    def _untrack(self, key: Key) -> RunningTask | None:
        running = self.tasks.pop(key, None)
        if running is not None:
            self.by_rank[running.rank].discard(key)
            group = self.by_job[key[0]]
            group.discard(key)
            if not group:
                del self.by_job[key[0]]
        return running

    def on_output(self, chunks: list[list[Any]]) -> None:
        statements: list[Statement] = []
        published: list[tuple[int, list[Any]]] = []
        for job_id, task, stream, data in chunks:
            job = self.manager.jobs.get(job_id)
            # An inactive job's output has ended (its followers have gone), and a restart restores the
            # output sequence of active jobs only.
            if job is None or job.state == State.INACTIVE or not isinstance(data, bytes):
                continue
            room = self.config.output_cap - job.output_bytes
            if room <= 0:
                continue
            if len(data) > room:
                data = _cut_at_line_end(data, room, whole_output=job.output_bytes == 0)
                # Nothing after the cut is kept, not even a later line short enough to fit.
                job.truncate_output(self.config.output_cap)
                self.manager.post(job, "output-truncated", {"cap": self.config.output_cap})
                if not data:
                    continue
                oseq = job.next_output(0)
            else:
                oseq = job.next_output(len(data))
            statements.append(store.output_chunk(job_id, oseq, task, stream, data))
            attempt = job.flow.attempt_of(task, job.is_array) if job.flow is not None else 0
            if attempt:
                statements.append(store.output_attempt(job_id, oseq, attempt))
                published.append((job_id, [oseq, task, stream, data, attempt]))
            else:
                published.append((job_id, [oseq, task, stream, data]))
        if statements:
            fut = self.manager.journal.write(statements)
            watchers = self.manager.watchers

            def publish() -> None:
                for job_id, chunk in published:
                    watchers.output(job_id, chunk)
            when_durable(fut, publish)

    # --- ending tasks --------------------------------------------------------------------------------------

    def kill_job(self, job: Job, sig: int) -> None:
        if job.id in self._undispatched:
            self._undispatched.discard(job.id)
            self._end_locally(job, list(self.by_job.get(job.id, ())), 128 + sig, "cancelled before start")
            return
        self.window.recall_job(job)  # before the kill: an entry the worker still holds must not start after it
        keys = list(self.by_job.get(job.id, ()))
        if not job.is_array and self.window.ahead:
            for key in keys:  # its cores may be wanted (a preemption): the single jobs behind it run elsewhere
                self.window.recall_after(key)
        self._signal(keys, sig)

    def job_finished(self, job: Job) -> None:
        self.stdin.ended(job.id)

    def running_tasks(self, job: Job) -> list[int]:
        return [task for _, task in self.by_job.get(job.id, ())]

    def recall_ahead(self, job: Job) -> None:
        self.window.recall_job(job)

    def ahead_rank(self, job: Job) -> int | None:
        return self.window.ahead_rank(job)

    def task_of_element(self, job: Job, element: int) -> int | None:
        """The task running as scheduler element `element` of an array, if any."""
        return next((key[1] for key in self.by_job.get(job.id, ()) if self.tasks[key].element == element), None)

    def preempt_task(self, job: Job, task: int, note: str, cancel: bool) -> None:
        """End a running array element (SIGTERM, then the kill grace); with `cancel`, counted as cancelled."""
        if cancel:
            self.preempted[(job.id, task)] = note
        self.window.recall_after((job.id, task))
        self._signal([(job.id, task)], signal.SIGTERM)

    def _signal(self, keys: list[Key], sig: int) -> None:
        per_rank: dict[int, list[list[int]]] = defaultdict(list)
        for key in keys:
            running = self.tasks.get(key)
            if running is not None:
                per_rank[running.rank].append(list(key))
        grace = self.config.kill_grace if sig == signal.SIGTERM else 0.0
        self.window.send_recalls(per_rank)  # an entry recalled behind a task must not start after its kill
        for rank, group in per_rank.items():
            messages.send(self.send, rank, messages.Kill(group, int(sig), grace))

    def _end_locally(self, job: Job, keys: list[Key], status: int, error: str) -> None:
        """Record tasks as ended without hearing from their worker (lost rank, never dispatched)."""
        now = self.manager.clock()
        by_rank: dict[int, list[list[Any]]] = defaultdict(list)
        for key in keys:
            running = self.tasks.get(key)
            if running is not None:
                by_rank[running.rank].append([key[0], key[1], status, None, None, error, running.started, now])
        for rank, rows in by_rank.items():
            self.on_done(rank, rows, ack=False)

    def check_deadlines(self, now: float) -> None:
        """End the tasks whose time limit passed; `now` is monotonic time (time.monotonic())."""
        if len(self._deadlines) > 2 * len(self.tasks) + 1024:
            # Entries of tasks that already ended are dropped lazily; rebuild so the heap stays O(running).
            live = [entry for entry in self._deadlines if (entry[1], entry[2]) in self.tasks]
            heapq.heapify(live)
            self._deadlines = live
        while self._deadlines and self._deadlines[0][0] <= now:
            _, job_id, task = heapq.heappop(self._deadlines)
            job = self.manager.jobs.get(job_id)
            running = self.tasks.get((job_id, task))
            if job is None or running is None or job.spec is None:
                continue
            if running.timed_from + self.manager.time_limit(job.spec) > now:
                continue  # the limit was raised since (`update`); a later entry stands for it
            if job.is_array:
                log.info("job %d task %d reached its time limit", job_id, task)
                self._signal([(job_id, task)], signal.SIGTERM)
            else:
                assert job.spec is not None
                limit = self.manager.time_limit(job.spec)
                self.manager.raise_exception(job, "timeout", f"time limit of {limit:g}s reached")

    def retime(self, job: Job) -> None:
        """The job's time limit changed: its running tasks get deadlines from their start and the new limit."""
        assert job.spec is not None
        limit = self.manager.time_limit(job.spec)
        for key in self.by_job.get(job.id, ()):
            heapq.heappush(self._deadlines, (self.tasks[key].timed_from + limit, job.id, key[1]))

    # --- ranks ---------------------------------------------------------------------------------------------

    def rank_lost(self, rank: int, why: str = "node-lost") -> None:
        self._requeue(self.window.drop_rank(rank))  # first: their predecessors' ends below must not start them
        keys = list(self.by_rank.get(rank, ()))
        jobs = {key[0] for key in keys}
        for job_id in jobs:
            job = self.manager.jobs[job_id]
            if not job.is_array:
                self.manager.raise_exception(job, "node-lost", f"rank {rank} was lost")
        for job_id in jobs:
            job = self.manager.jobs[job_id]
            self._end_locally(job, [k for k in keys if k[0] == job_id], NODE_LOST_STATUS, why)

    def reconcile(self, rank: int, reported: list[list[Any]]) -> None:
        """A rank (re)joined listing the tasks it still runs: end the ones it lost, adopt the ones it ran from its
        window that are still to run, kill the other ones we do not know there."""
        self._requeue(self.window.drop_rank(rank))  # a joining worker drops what waited (protocol.md §2.10)
        reported_keys = {(int(r[0]), int(r[1])): r for r in reported}
        known = self.by_rank.get(rank, set())
        lost = known - reported_keys.keys()
        if lost:
            for job_id in {k[0] for k in lost}:
                job = self.manager.jobs[job_id]
                if not job.is_array:
                    self.manager.raise_exception(job, "node-lost", f"rank {rank} restarted")
                self._end_locally(job, [k for k in lost if k[0] == job_id], NODE_LOST_STATUS, "node-lost")
        unknown = [(key, entry) for key, entry in reported_keys.items() if key not in known]
        strays = {key for key, entry in unknown if not self._adopt_taken_back(rank, key, entry)}
        if len(strays) < len(unknown):
            log.warning("rank %d came back running %d tasks of its window that were queued again: they go on there",
                        rank, len(unknown) - len(strays))
        # The strays of its last join, if any remain, ended in results that came before this join's.
        self._strays.pop(rank, None)
        if strays:
            self._strays[rank] = strays
            messages.send(self.send, rank, messages.Kill([list(k) for k in strays], int(signal.SIGKILL)))

    def _adopt_taken_back(self, rank: int, key: Key, entry: list[Any]) -> bool:
        """Whether the task the rank reports running, which rank 0 does not know there, is adopted: one of the
        window entries rank 0 took back when it lost the rank (protocol.md §2.10), still queued, not running or
        waiting ahead elsewhere, nor recorded. Its run goes on where it is; the queued copy is dropped at its turn."""
        job = self.manager.jobs.get(key[0])
        task = key[1]
        if (job is None or job.ending or job.spec is None or key in self.tasks or key in self.window.ahead
                or not 0 <= task < job.total_tasks or job.is_done(task)):
            return False
        attempt = int(entry[4]) if len(entry) > 4 else 0
        if job.flow is not None and not job.flow.current(task, attempt, job.is_array):
            return False
        if not job.is_array and (job.state != State.SCHED or job.total_tasks != 1):
            return False  # a single job is adopted only while queued again; a gang job's end was decided
        try:
            cores, gpus = tuple(int(c) for c in entry[2]), tuple(int(g) for g in entry[3])
            allocation = sched.Allocation({rank: sched.RankAlloc((sched.Slot(cores, gpus),))})
            element = -1 - task if job.is_array else 0  # negative: apart from the elements still queued
            now = self.manager.clock()
            self.adopt(job, task, element, rank, allocation, now)
        except (TypeError, ValueError):  # cores not free, or not the rank's: a stray after all
            return False
        if job.is_array:
            self.manager.post_started(job, str(rank))
        else:
            self.window.started_ahead(job, rank)  # out of the queue; its `alloc` and `start` now
        return True


def _cut_at_line_end(data: bytes, room: int, whole_output: bool) -> bytes:
    """The longest prefix of `data` that fits `room` and ends a line; a job whose first line alone exceeds the
    cap keeps the cap's worth of it rather than nothing."""
    end = data.rfind(b"\n", 0, room) + 1
    if end == 0 and whole_output:
        return data[:room]
    return data[:end]
