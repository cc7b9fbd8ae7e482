"""Rank 0's side of the dispatch window (protocol.md §2.10): array elements sent to a worker ahead of its cores.

Behind each array element running on a slot of the scheduler's array fast path, rank 0 keeps a chain of up to
`dispatch_window` more elements of the same array, sent to the worker in `ahead` messages. The worker starts the
next element of a chain the moment the one before it ends, so rank 0 learns of that start from the predecessor's
result: `successor` hands the started element to Execution, which tracks it as running on the predecessor's cores.
Elements still waiting come back with `returned` (after a `recall`) or are dropped with their rank; both go back
to the queue. Nothing here is journaled: after a restart the workers' `join` says what started (§2.6).
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.job import Job
from minicluster.proto import messages

if TYPE_CHECKING:
    from broker.execution import Execution

Key = tuple[int, int]
# Back-pressure: no top-up while this many recorded results are not yet durable (the journal lags).
LAG_RESULTS = 4096


class Ahead(NamedTuple):
    rank: int
    element: int  # the scheduler's element number, taken with take_ahead
    after: int  # the task of the same job it follows on the same cores
    cores: list[int]
    gpus: list[int]


class DispatchWindow:
    def __init__(self, execution: Execution, depth: int, seconds: float) -> None:
        self.execution = execution
        self.depth = depth
        self.seconds = seconds
        self.ahead: dict[Key, Ahead] = {}
        self.next_of: dict[Key, Key] = {}  # a task (running or ahead) -> the element sent to follow it
        # A running task -> the last entry of its chain and the chain's length, so that a top-up need not walk
        # the chain: kept by `fill` and `successor`, dropped whole when entries leave a chain otherwise.
        self.tails: dict[Key, tuple[Key, int]] = {}
        self.by_rank: dict[int, set[Key]] = defaultdict(set)
        self.by_job: dict[int, set[Key]] = defaultdict(set)
        self.recalling: set[Key] = set()
        # Ranks that returned entries unasked (more than they hold): how many may wait there at most, half of
        # what waited then, until the rank joins again.
        self.limit: dict[int, int] = {}
        self.unrecorded = 0

    # --- sending ahead -------------------------------------------------------------------------------------

    def fill(self, job: Job, head: Key, rank: int, cores: list[int], gpus: list[int],
             out: dict[int, messages.Ahead]) -> None:
        """Top up the chain behind `head` (running on `rank`) to `depth_of(job)` entries, into `out`'s `ahead`s."""
        if not self._open(job, rank):
            return
        tail, length = self.tails.get(head) or self._walk(head)
        room = self.depth_of(job) - length
        if rank in self.limit:
            room = min(room, self.limit[rank] - len(self.by_rank.get(rank, ())))
        elements = self.execution.manager.scheduler.take_ahead(job.id, room) if room > 0 else range(0)
        if not elements:
            return
        ahead_message = out.get(rank)
        if ahead_message is None:
            ahead_message = out[rank] = messages.Ahead()
        if job.id not in ahead_message.jobs:
            ahead_message.jobs[job.id] = self.execution.jobinfo(job, [[rank, 1]])
        attempts = job.flow.attempts if job.flow is not None else None
        for element in elements:
            task = job.pending_map[element] if job.pending_map is not None else element
            key = (job.id, task)
            self.ahead[key] = Ahead(rank, element, tail[1], cores, gpus)
            self.next_of[tail] = key
            self.by_rank[rank].add(key)
            self.by_job[job.id].add(key)
            attempt = attempts.get(task, 0) if attempts else 0
            ahead_message.tasks.append([job.id, task, job.index_of(task), cores, gpus, attempt, tail[1]])
            tail = key
        self.tails[head] = (tail, length + len(elements))

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
        if self.unrecorded > LAG_RESULTS:
            return False
        node = self.execution.manager.scheduler.graph.nodes.get(rank)
        return node is not None and node.up and node.drain_reason is None

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
            before = (job_id, ahead.after)
            if self.next_of.get(before) == key:
                del self.next_of[before]
            following = self.next_of.pop(key, None)
            if following is not None:  # it follows the dropped entry's predecessor now, as on the worker
                self.next_of[before] = following
                self.ahead[following] = self.ahead[following]._replace(after=ahead.after)
            self._forget(key)
            out[job_id].append(task)
        if unasked:
            self.limit[rank] = len(self.by_rank.get(rank, ())) // 2
        return out

    def drop_rank(self, rank: int) -> dict[int, list[int]]:
        """The rank lost its window (node loss, a new join): every entry of it, as job -> tasks."""
        out: dict[int, list[int]] = defaultdict(list)
        self.limit.pop(rank, None)
        self.tails.clear()
        for key in list(self.by_rank.get(rank, ())):
            ahead = self._forget(key)
            before = (key[0], ahead.after)
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
        self._recall(self.by_job.get(job.id, ()))

    def recall_rank(self, rank: int) -> None:
        self._recall(self.by_rank.get(rank, ()))

    def recall_after(self, key: Key) -> None:
        """The chain behind `key` (a task about to be preempted)."""
        chain = []
        following = self.next_of.get(key)
        while following is not None:
            chain.append(following)
            following = self.next_of.get(following)
        self._recall(chain)

    def _recall(self, keys: Any) -> None:
        per_rank: dict[int, list[list[int]]] = defaultdict(list)
        for key in keys:
            if key not in self.recalling:
                self.recalling.add(key)
                per_rank[self.ahead[key].rank].append(list(key))
        for rank, group in per_rank.items():
            messages.send(self.execution.send, rank, messages.Recall(group))
