"""Rank 0's side of the dispatch window (protocol.md §2.10): array elements and small single-slot jobs sent to a
worker ahead of its cores.

Behind each array element running on a slot of the scheduler's array fast path, rank 0 keeps a chain of up to
`dispatch_window` more elements of the same array; behind each running small one-core job, a chain of such jobs
taken from the head of the queue. They go to the worker in `ahead` messages. The worker starts the next entry of a
chain the moment the one before it ends, so rank 0 learns of that start from the predecessor's result:
`successor` hands the started entry to Execution, which tracks it as running on the predecessor's cores. Entries
still waiting come back with `returned` (after a `recall`) or are dropped with their rank; both go back to the
queue. Nothing here is journaled: after a restart the workers' `join` says what started (§2.6).
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol

from broker.job import Job, State
from broker.jobmanager import JobManager
from minicluster.config import InstanceConfig
from minicluster.proto import messages
from minicluster.proto.messages import Send

Key = tuple[int, int]
# Back-pressure: no top-up while this many recorded results are not yet durable (the journal lags). Elements the
# window does not take go through the scheduler, which costs rank 0 several times the CPU and records their results
# all the same: a threshold that a journal thread briefly short of CPU crosses (4,096 was 0.2 s at 20,000 tasks/s)
# made a busy rank 0 busier still (docs/performance.md, "Where the 8-slot wall time goes").
LAG_RESULTS = 16_384
# How many (user, argv) shapes of single jobs keep a mean run time, and how much a new run time moves it: fixed,
# not config (docs/scheduling.md, "The dispatch window", says why).
SHAPES = 1024
SHAPE_WEIGHT = 0.2


class Ahead(NamedTuple):
    rank: int
    element: int  # the scheduler's element number, taken with take_ahead (0 for a single job)
    after: Key  # the task it follows on the same cores: of the same array, or another single job's
    cores: list[int]
    gpus: list[int]
    expect: float = 0.0  # a single job's expected run time, what it adds to its chain's work


class Running(Protocol):
    """A task rank 0 tracks as running (broker/execution.py's RunningTask), as the window reads it."""

    @property
    def timed_from(self) -> float: ...


JobInfoOf = Callable[[Job, list[list[int]]], messages.JobInfo]


class DispatchWindow:
    """`manager`: the job table, the queue and the journal; `running`: the tasks rank 0 tracks as running, kept by
    broker/execution.py, read here; `jobinfo`: the `run` description of a job for a layout."""

    def __init__(self, config: InstanceConfig, manager: JobManager, send: Send, running: Mapping[Key, Running],
                 jobinfo: JobInfoOf) -> None:
        self.manager = manager
        self.send = send
        self.running = running
        self.jobinfo = jobinfo
        self.depth = config.dispatch_window
        self.seconds = config.dispatch_window_seconds
        # A chain of single jobs waits behind a job at most this much longer than that job's expected run time.
        self.grace = config.dispatch_window_grace
        self.ahead: dict[Key, Ahead] = {}
        self.next_of: dict[Key, Key] = {}  # a task (running or ahead) -> the element sent to follow it
        # A running task -> the last entry of its chain and the chain's length, so that a top-up need not walk
        # the chain: kept by `fill` and `successor`, dropped whole when entries leave a chain otherwise.
        self.tails: dict[Key, tuple[Key, int]] = {}
        self.by_rank: dict[int, set[Key]] = defaultdict(set)
        self.by_job: dict[int, set[Key]] = defaultdict(set)
        self.recalling: set[Key] = set()
        # Recalled and not sent yet: one `recall` per rank at the end of the loop's turn (or before a `kill` there).
        self.to_recall: dict[int, list[Key]] = defaultdict(list)
        # Ranks that returned entries unasked (more than they hold): how many may wait there at most, half of
        # what waited then, until the rank joins again.
        self.limit: dict[int, int] = {}
        self.unrecorded = 0
        # Single jobs: the mean run time of the last ones of each (uid, argv), the measure of "small".
        self.shapes: dict[tuple[int, tuple[str, ...]], float] = {}

    # --- sending ahead -------------------------------------------------------------------------------------

    def fill(self, job: Job, head: Key, rank: int, cores: list[int], gpus: list[int],
             out: dict[int, messages.Ahead]) -> None:
        """Top up the chain behind `head` (running on `rank`) to `depth_of(job)` entries, into `out`'s `ahead`s."""
        if not self._open(job, rank):
            return
        tail, length = self.tails.get(head) or self._walk(head)
        if tail in self.recalling:
            return  # the worker may have dropped it: an entry behind it would start there at once
        room = self.depth_of(job) - length
        if rank in self.limit:
            room = min(room, self.limit[rank] - len(self.by_rank.get(rank, ())))
        elements = self.manager.scheduler.take_ahead(job.id, room) if room > 0 else range(0)
        attempts = job.flow.attempts if job.flow is not None else None
        ahead_message = None
        for element in elements:
            task = job.pending_map[element] if job.pending_map is not None else element
            if job.is_done(task) or (job.id, task) in self.running:
                continue  # a run rank 0 had taken back recorded it or runs it (protocol.md §2.10): dropped
            if ahead_message is None:
                ahead_message = out.get(rank)
                if ahead_message is None:
                    ahead_message = out[rank] = messages.Ahead()
                if job.id not in ahead_message.jobs:
                    ahead_message.jobs[job.id] = self.jobinfo(job, [[rank, 1]])
            key = (job.id, task)
            self.ahead[key] = Ahead(rank, element, tail, cores, gpus)
            self.next_of[tail] = key
            self.by_rank[rank].add(key)
            self.by_job[job.id].add(key)
            attempt = attempts.get(task, 0) if attempts else 0
            ahead_message.tasks.append([job.id, task, job.index_of(task), cores, gpus, attempt, tail[1]])
            tail, length = key, length + 1
        self.tails[head] = (tail, length)

    def _walk(self, head: Key) -> tuple[Key, int]:
        tail, length = head, 0
        while (following := self.next_of.get(tail)) is not None:
            tail, length = following, length + 1
        return tail, length

    def depth_of(self, job: Job) -> int:
        """How many elements may wait behind one of the job's cores: as many as run in about `seconds` by its
        results so far, at most `depth`; one until the first results say how long an element takes."""
        ended = job.succeeded + job.failed + job.cancelled
        if not ended or job.acct is None:
            return 1
        per_element = job.acct.element_seconds / ended
        if per_element * self.depth <= self.seconds:
            return self.depth
        return max(1, int(self.seconds / per_element))

    def _open(self, job: Job, rank: int) -> bool:
        spec = job.spec
        if not self.depth or spec is None or not job.is_array or job.ending or spec.stdin_tasks:
            return False
        return self._open_rank(rank)

    def _open_rank(self, rank: int) -> bool:
        if not self.depth or self.unrecorded > LAG_RESULTS or self.manager.journal.stalled is not None:
            return False
        node = self.manager.scheduler.graph.nodes.get(rank)
        return node is not None and node.up and node.drain_reason is None

    # --- single jobs ---------------------------------------------------------------------------------------

    def fill_jobs(self, head: Key, rank: int, cores: list[int], gpus: list[int],
                  out: dict[int, messages.Ahead]) -> None:
        """Top up the chain behind single job `head` (running on `rank`, one core) with small single jobs from the
        head of the queue, to about `seconds` of expected work (at least one, at most `depth`)."""
        manager = self.manager
        if not self._open_rank(rank) or gpus or len(cores) != 1 or not self.is_small(manager.jobs[head[0]]):
            return  # behind a job that may run long, jobs would wait where another core could take them
        tail, length, planned = head, 0, 0.0
        while (following := self.next_of.get(tail)) is not None:
            tail, length = following, length + 1
            planned += self.ahead[following].expect
        if tail in self.recalling:
            return  # as in `fill`
        room = self.depth - length
        if rank in self.limit:
            room = min(room, self.limit[rank] - len(self.by_rank.get(rank, ())))
        while room > 0 and (planned < self.seconds or not length):
            taken = manager.scheduler.take_ahead_job(self.small, tail[0])
            if taken is None:
                return
            job = manager.jobs[taken.job_id]
            expect = self.expected(job)
            assert expect is not None, "only a small job is taken"
            ahead_message = out.get(rank)
            if ahead_message is None:
                ahead_message = out[rank] = messages.Ahead()
            ahead_message.jobs[job.id] = self.jobinfo(job, [[rank, 1]])
            key = (job.id, 0)
            self.ahead[key] = Ahead(rank, 0, tail, cores, gpus, expect)
            self.next_of[tail] = key
            self.by_rank[rank].add(key)
            self.by_job[job.id].add(key)
            ahead_message.tasks.append([job.id, 0, 0, cores, gpus, 0, tail[1], tail[0]])
            tail, length, planned, room = key, length + 1, planned + expect, room - 1

    def small(self, job_id: int) -> bool:
        """Whether a queued job may go ahead (protocol.md §2.10)."""
        job = self.manager.jobs.get(job_id)
        return job is not None and job.state == State.SCHED and not job.ending and self.is_small(job)

    def is_small(self, job: Job) -> bool:
        """One task, no workflow state, no stdin or PMI, and an expected run time known and within `seconds`."""
        if job.is_array or job.flow is not None:
            return False
        spec = job.spec
        if spec is None or spec.ntasks != 1 or spec.stdin_tasks or spec.pmi_mode is not None:
            return False
        expect = self.expected(job)
        return expect is not None and expect <= self.seconds

    def expected(self, job: Job) -> float | None:
        """A single job's expected run time: the mean of its shape's last runs, else its own time limit."""
        spec = job.spec
        assert spec is not None
        mean = self.shapes.get((job.uid, spec.argv))
        return mean if mean is not None else spec.time_limit

    def observe(self, job: Job, seconds: float) -> None:
        """A single job ran `seconds`: its shape's mean moves towards that."""
        spec = job.spec
        if spec is None or spec.ntasks != 1:
            return
        shapes, shape = self.shapes, (job.uid, spec.argv)
        mean = shapes.get(shape)
        if mean is None:
            if len(shapes) >= SHAPES:
                del shapes[next(iter(shapes))]  # the oldest shape seen
            shapes[shape] = seconds
        else:
            shapes[shape] = mean + SHAPE_WEIGHT * (seconds - mean)

    def started_ahead(self, job: Job, rank: int) -> None:
        """A single job sent ahead (or, after a restart, one the journal still holds as queued) started on
        `rank`: its `alloc` and `start` come now, after its task."""
        if job.state != State.SCHED:
            return
        manager = self.manager
        manager.scheduler.cancel(job.id)  # queued again after a restart, if its worker came back late
        manager.post_started(job, str(rank))

    def ahead_rank(self, job: Job) -> int | None:
        """The rank a single job was sent ahead to, while it has neither started nor come back."""
        ahead = None if job.is_array else self.ahead.get((job.id, 0))
        return ahead.rank if ahead is not None else None

    # --- what happened to them -----------------------------------------------------------------------------

    def successor(self, key: Key) -> tuple[Key, Ahead] | None:
        """Task `key` ended: the element that followed it has started in its place (or None)."""
        following = self.next_of.pop(key, None)
        chain = self.tails.pop(key, None)
        if following is None:
            return None
        if chain is not None and chain[1] > 1:
            self.tails[following] = (chain[0], chain[1] - 1)
        return following, self._forget(following)

    def returned(self, rank: int, keys: list[list[int]]) -> dict[int, list[int]]:
        """The worker dropped these unstarted: they are unlinked from their chains; returns job -> tasks."""
        out: dict[int, list[int]] = defaultdict(list)
        unasked = False
        self.tails.clear()
        for job_id, task in keys:
            key = (job_id, task)
            ahead = self.ahead.get(key)
            if ahead is None or ahead.rank != rank:
                continue
            unasked = unasked or key not in self.recalling
            before = ahead.after
            if self.next_of.get(before) == key:
                del self.next_of[before]
            following = self.next_of.pop(key, None)
            if following is not None:  # it follows the dropped entry's predecessor now, as on the worker
                self.next_of[before] = following
                self.ahead[following] = self.ahead[following]._replace(after=before)
            self._forget(key)
            out[job_id].append(task)
        if unasked:
            self.limit[rank] = len(self.by_rank.get(rank, ())) // 2
        return out

    def ended_early(self, key: Key) -> None:
        """Entry `key` ran and ended before rank 0 heard its predecessor end: the worker started it at once, as
        what it follows was not there (protocol.md §2.10). Its successor follows its predecessor, as on the worker,
        so the predecessor's end hands the cores on to that one rather than to this task again; a recall makes
        the worker drop it, should it still wait there (a result from a run rank 0 took back)."""
        ahead = self.ahead[key]
        self.tails.clear()
        if self.next_of.get(ahead.after) == key:
            del self.next_of[ahead.after]
        following = self.next_of.pop(key, None)
        if following is not None:
            self.next_of[ahead.after] = following
            self.ahead[following] = self.ahead[following]._replace(after=ahead.after)
        self._forget(key)
        messages.send(self.send, ahead.rank, messages.Recall([list(key)]))

    def drop_rank(self, rank: int) -> dict[int, list[int]]:
        """The rank lost its window (node loss, a new join): every entry of it, as job -> tasks."""
        out: dict[int, list[int]] = defaultdict(list)
        self.limit.pop(rank, None)
        self.tails.clear()
        for key in list(self.by_rank.get(rank, ())):
            ahead = self._forget(key)
            before = ahead.after
            if self.next_of.get(before) == key:
                del self.next_of[before]
            self.next_of.pop(key, None)
            out[key[0]].append(key[1])
        return out

    def _forget(self, key: Key) -> Ahead:
        ahead = self.ahead.pop(key)
        self.recalling.discard(key)
        for index, group in ((self.by_rank, ahead.rank), (self.by_job, key[0])):
            keys = index[group]
            keys.discard(key)
            if not keys:
                del index[group]
        return ahead

    # --- recalling -----------------------------------------------------------------------------------------

    def recall_job(self, job: Job) -> None:
        self.recall(self.by_job.get(job.id, ()))

    def recall_rank(self, rank: int) -> None:
        self.recall(self.by_rank.get(rank, ()))

    def recall_overtaken(self) -> None:
        """After a scheduling pass: take back the single jobs sent ahead that a job still waiting in the queue
        comes before (it arrived, or priorities moved, since they were taken)."""
        if self.ahead:
            overtaken = self.manager.scheduler.overtaken_ahead()
            if overtaken:
                self.recall([(job_id, 0) for job_id in overtaken if (job_id, 0) in self.ahead])

    def recall_overdue(self, now: float) -> None:
        """Take back the chains of single jobs whose running head has run `grace` seconds longer than expected
        (`now`: monotonic), so that they wait no longer where another core may take them first."""
        if not self.ahead:
            return
        tasks, jobs = self.running, self.manager.jobs
        overdue = []
        for key, ahead in self.ahead.items():
            after = ahead.after
            running = tasks.get(after) if after[0] != key[0] else None
            if running is None:
                continue  # an array element, or not first in its chain
            head = jobs.get(after[0])
            expect = self.expected(head) if head is not None and head.spec is not None else None
            if now - running.timed_from > (expect or 0.0) + self.grace:
                overdue.append(after)
        for after in overdue:
            self.recall_after(after)

    def recall_after(self, key: Key) -> None:
        """The chain behind `key` (a task about to be preempted)."""
        chain = []
        following = self.next_of.get(key)
        while following is not None:
            chain.append(following)
            following = self.next_of.get(following)
        self.recall(chain)

    def recall(self, keys: Iterable[Key]) -> None:
        """Take these entries back: one `recall` per rank at the end of the loop's turn (`send_recalls`)."""
        to_recall = self.to_recall
        for key in keys:
            if key not in self.recalling:
                self.recalling.add(key)
                if not to_recall:
                    asyncio.get_running_loop().call_soon(self.send_recalls)
                to_recall[self.ahead[key].rank].append(key)

    def send_recalls(self, ranks: Iterable[int] | None = None) -> None:
        """Send what was recalled since the last time (to `ranks` only, if given): one `recall` per rank, without
        the entries that started or came back meanwhile."""
        to_recall = self.to_recall
        if not to_recall:
            return
        for rank in list(to_recall) if ranks is None else ranks:
            keys = to_recall.pop(rank, None)
            waiting = [list(key) for key in keys or () if key in self.recalling and self.ahead[key].rank == rank]
            if waiting:
                messages.send(self.send, rank, messages.Recall(waiting))
