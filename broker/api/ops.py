"""Client operations (protocol.md §3.3), one small function each, registered by name with its request class.

Each takes the peer (uid from the kernel) and its typed request (minicluster/proto/requests.py), decoded and
checked once in `Operations.handler`.  The broker object gives access to the job manager, the rank table, the
resource graph and the journal's reader.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from broker.durable import store
from broker.api.access import check_owner, listed, readable_record
from broker.api.brokerview import BrokerView
from broker.api.clientapi import MAX_ERROR_MESSAGE, Peer
from broker.history import finished_record_of
from broker.job import State
from broker.durable.journal import JournalRefused
from broker.stop import MODES as STOP_MODES
from broker.jobmanager import JobError
from minicluster.model import jobspec as jobspec_model
from minicluster.model.idset import IdSet
from minicluster.proto import requests
from minicluster.proto.envelope import BadMessage

OPS: dict[str, tuple[Callable[..., Any], type[requests.Request]]] = {}
# Output responses carry at most this much data, whatever the job's output size (frames are 16 MiB at most).
OUTPUT_RESPONSE_BYTES = 1 << 20
# Output history is read from the journal in pages of about this size.
OUTPUT_PAGE_BYTES = 4 << 20
# Data of one `stdin` request.
STDIN_MAX_BYTES = 1 << 20


def op(name: str, request: type[requests.Request] = requests.Empty) -> Callable[[Callable[..., Any]],
                                                                            Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        OPS[name] = (fn, request)
        return fn
    return register


class Operations:
    """Binds the registered operations to one broker."""

    def __init__(self, broker: BrokerView) -> None:
        self.broker = broker

    def handler(self, name: Any) -> Callable[[Peer, dict[str, Any]], Any] | None:
        entry = OPS.get(name) if isinstance(name, str) else None
        if entry is None:
            return None
        fn, request = entry

        def checked(peer: Peer, message: dict[str, Any]) -> Any:
            try:
                typed = requests.decode(request, message)
            except BadMessage as exc:
                raise JobError(exc.code, str(exc)) from None
            return fn(self.broker, peer, typed)

        return checked


def _refuse_when_stopping(broker: BrokerView) -> None:
    if broker.stopping:
        raise JobError("shutting-down", "the MiniCluster is shutting down")


@op("hello")
def hello(broker: BrokerView, peer: Peer, req: requests.Empty) -> dict[str, Any]:
    cfg = broker.config
    return {"version": 1, "name": cfg.name, "size": cfg.size, "uid": peer.uid, "owner_uid": broker.owner_uid}


def _spec(req_spec: Any) -> jobspec_model.Jobspec:
    try:
        return jobspec_model.from_wire(req_spec)
    except jobspec_model.InvalidJobspec as exc:
        raise JobError("invalid-jobspec", str(exc)) from None


@op("submit", requests.Submit)
def submit(broker: BrokerView, peer: Peer, req: requests.Submit) -> asyncio.Future[dict[str, Any]]:
    _refuse_when_stopping(broker)
    spec = _spec(req.jobspec)
    job_id, durable = broker.manager.submit(peer.uid, peer.gid, spec)
    return reply_when_done(durable, {"job": job_id})


# Specs a `submit-many` handles per loop iteration: a large batch must not stall every other client meanwhile.
SUBMIT_SLICE = 256


@op("submit-many", requests.SubmitMany)
def submit_many(broker: BrokerView, peer: Peer, req: requests.SubmitMany) -> asyncio.Future[dict[str, Any]]:
    _refuse_when_stopping(broker)
    specs = req.jobspecs

    async def in_slices() -> dict[str, Any]:
        answers: list[Any] = []
        durable: dict[int, asyncio.Future[None]] = {}  # answer index -> its submission's write
        for start in range(0, len(specs), SUBMIT_SLICE):
            if start:
                await asyncio.sleep(0)
            for raw in specs[start:start + SUBMIT_SLICE]:
                try:
                    job_id, durable[len(answers)] = broker.manager.submit(peer.uid, peer.gid, _spec(raw))
                    answers.append(job_id)
                except JobError as exc:
                    answers.append(_error_answer(exc))
        # Each submission is committed or refused (a full disk) on its own.
        ends = await asyncio.gather(*durable.values(), return_exceptions=True)
        for at, end in zip(durable, ends, strict=True):
            if isinstance(end, BaseException):
                answers[at] = _error_answer(_as_refusal(end))
        return {"jobs": answers}

    return asyncio.ensure_future(in_slices())


def _error_answer(exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, JobError) else "internal"
    return {"code": code, "message": str(exc)[:MAX_ERROR_MESSAGE]}


def _as_refusal(exc: BaseException) -> BaseException:
    """A submission the journal refused (it could not be made durable in time) is refused as `unavailable`."""
    if isinstance(exc, JournalRefused):
        return JobError("unavailable", f"{exc}; nothing was submitted: try again once the broker's disk has space")
    return exc


def once_durable(broker: BrokerView, body: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    """`body`, once everything the operation journaled is durable (writes commit in order)."""
    return reply_when_done(broker.journal.write([]), body)


def reply_when_done(fut: asyncio.Future[None], body: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    """`body` once `fut` is done, or its failure as the client's refusal (for the operations of every module)."""
    out: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    def relay(f: asyncio.Future[None]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(_as_refusal(exc))
        else:
            out.set_result(body)

    fut.add_done_callback(relay)
    return out


@op("jobs", requests.Jobs)
def jobs(broker: BrokerView, peer: Peer, req: requests.Jobs) -> Any:
    """Newest first, a page at a time (protocol.md §3.3): finished jobs are read from the journal."""
    limit, before = max(req.limit, 1), req.before
    manager = broker.manager
    if req.ids is not None:
        return _listing(broker, peer, req, [manager.get(i) for i in req.ids][:limit], None)
    if req.all:
        return asyncio.ensure_future(_all_jobs(broker, peer, req, limit))
    hidden = manager.unacknowledged  # submissions not durable yet
    selected = []
    for j in reversed(manager.jobs.values()):  # the active jobs, in id order
        if j.state != State.INACTIVE and (before is None or j.id < before) and j.id not in hidden:
            selected.append(j)
            if len(selected) > limit:
                break
    more = len(selected) > limit
    return _listing(broker, peer, req, selected[:limit], selected[limit - 1].id if more else None)


async def _all_jobs(broker: BrokerView, peer: Peer, req: requests.Jobs, limit: int) -> dict[str, Any]:
    manager = broker.manager
    rows = await manager.store.finished_jobs_before(req.before, limit)
    selected = []
    for row in rows:
        job = manager.jobs.get(row[0])
        if job is not None:
            if job.id not in manager.unacknowledged:
                selected.append(job)  # its record in memory says more than its row
        elif row[3] == State.INACTIVE.value:
            selected.append(manager.history.cached(row[0]) or finished_record_of(row))
    return _listing(broker, peer, req, selected, rows[-1][0] if len(rows) == limit else None)


def _listing(broker: BrokerView, peer: Peer, req: requests.Jobs, selected: list[Any],
             next_before: int | None) -> dict[str, Any]:
    manager = broker.manager
    summaries = [listed(broker, peer, manager.summary(j, req.alloc)) for j in selected]
    if req.priority:
        now = manager.clock()
        for summary, record in zip(summaries, selected, strict=True):
            summary["priority_components"] = broker.sharing.components(record, now)
    return {"jobs": summaries, "next": next_before}


@op("job", requests.OneJob)
def job(broker: BrokerView, peer: Peer, req: requests.OneJob) -> Any:
    record = readable_record(broker, peer, req.job)
    summary = broker.manager.summary(record)

    async def with_failed() -> dict[str, Any]:
        failed = await broker.manager.store.failed_indices(record.id)
        return {"job": summary, "failed": str(IdSet.from_ints(failed))}

    return asyncio.ensure_future(with_failed())


@op("cancel", requests.ManyJobs)
def cancel(broker: BrokerView, peer: Peer, req: requests.ManyJobs) -> asyncio.Future[dict[str, Any]]:
    cancelled, errors = broker.manager.cancel(peer.uid, req.jobs)
    return once_durable(broker, {"cancelled": cancelled, "errors": errors})


@op("eventlog", requests.Eventlog)
def eventlog(broker: BrokerView, peer: Peer, req: requests.Eventlog) -> AsyncIterator[dict[str, Any]]:
    record = readable_record(broker, peer, req.job)
    start, follow = req.start, req.follow

    async def history() -> list[list[Any]]:
        rows = await broker.manager.store.events_since(record.id, start)
        return [[seq, ts, name, store.unpack(ctx)] for seq, ts, name, ctx in rows]

    return _follow(broker, record, follow, history, broker.watchers.follow_events, "events",
                   lambda item: item[0], start)


@op("output", requests.Output)
def output(broker: BrokerView, peer: Peer, req: requests.Output) -> AsyncIterator[dict[str, Any]]:
    record = readable_record(broker, peer, req.job)
    follow, index, attempt = req.follow, req.index, req.attempt
    task = None
    if index is not None:
        task = task_of_index(record, index)
    return _output(broker, peer, record, follow, task, attempt)


async def _output(broker: BrokerView, peer: Peer, record: Any, follow: bool, task: int | None,
                  attempt: int | None) -> AsyncIterator[dict[str, Any]]:
    """History read in pages, then live chunks; responses of at most OUTPUT_RESPONSE_BYTES (protocol.md §3.3)."""
    follower = broker.watchers.follow_output(record.id) if follow and not record.closed else None
    batch = _Chunks(task, attempt)
    try:
        files = await _output_files(broker, record)
        if files is not None:
            batch.extra["files"] = files
        next_seq = 0
        while True:
            # A client that sends many `output` requests and reads none holds two pages, not one per request.
            async with peer.bulk_reads:
                page = await broker.manager.store.output_page(record.id, next_seq, attempt, OUTPUT_PAGE_BYTES)
                for item in page:
                    if batch.add(item):
                        yield batch.take()
            if not page:
                break
            next_seq = page[-1][0] + 1
        yield batch.take()
        while follower is not None:
            item = await follower.queue.get()
            while item is not None:
                if follower.overflowed:
                    raise JobError("bad-request", "client fell too far behind; re-read the output")
                if item[0] >= next_seq:
                    next_seq = item[0] + 1
                    batch.add(item)
                if batch.full or follower.queue.empty():
                    break
                item = follower.queue.get_nowait()
            if batch.chunks:
                yield batch.take()
            if item is None:
                break
        cap = await _truncated(broker, record)
        if cap is not None:
            yield {"chunks": [], "truncated": cap}
    finally:
        if follower is not None:
            broker.watchers.unfollow(record.id, follower)


class _Chunks:
    """Output chunks gathered into one response, up to OUTPUT_RESPONSE_BYTES of data."""

    def __init__(self, task: int | None, attempt: int | None = None) -> None:
        self.task = task
        self.attempt = attempt
        self.chunks: list[list[Any]] = []
        self.size = 0
        self.extra: dict[str, Any] = {}

    @property
    def full(self) -> bool:
        return self.size >= OUTPUT_RESPONSE_BYTES

    def add(self, item: list[Any]) -> bool:
        """Add [oseq, task, stream, data(, attempt)] if it is visible; True once the response is full."""
        if (self.task is None or item[1] == self.task) and (
                self.attempt is None or (item[4] if len(item) > 4 else 0) == self.attempt):
            self.chunks.append(item[1:4])
            self.size += len(item[3]) + 16
        return self.full

    def take(self) -> dict[str, Any]:
        body = {"chunks": self.chunks, **self.extra}
        self.chunks, self.size, self.extra = [], 0, {}
        return body


async def _output_files(broker: BrokerView, record: Any) -> str | None:
    """The output template of a job whose output went to files on the nodes."""
    if record.spec is not None:
        return record.spec.output
    spec = await broker.manager.store.spec(record.id)
    return store.unpack(spec).get("output") if spec is not None else None


async def _truncated(broker: BrokerView, record: Any) -> int | None:
    """The cap, if the job's output reached it (after a restart, its `output-truncated` event says so)."""
    if record.truncated:
        return broker.config.output_cap
    context = await broker.manager.store.truncation(record.id)
    return store.unpack(context).get("cap") if context is not None else None


def task_of_index(record: Any, index: int) -> int:
    if record.array is None:
        if not 0 <= index < record.ntasks:
            raise JobError("not-found", f"job {record.id} has no task {index}")
        return index
    try:
        return record.array.ordinal(index)
    except ValueError:
        raise JobError("not-found", f"job {record.id} has no array index {index}") from None


async def _follow(broker: BrokerView, record: Any, follow: bool,
                  history: Callable[[], Awaitable[list[list[Any]]]], subscribe: Callable[[int], Any], key: str,
                  seq_of: Callable[[list[Any]], int],
                  start: int) -> AsyncIterator[dict[str, Any]]:
    """History from sqlite, then live items, skipping sequence numbers already sent (no gaps, no repeats)."""
    follower = subscribe(record.id) if follow and not record.closed else None
    try:
        past = await history()
        yield {key: past}
        next_seq = (seq_of(past[-1]) + 1) if past else start
        while follower is not None:
            item = await follower.queue.get()
            if item is None:
                return
            if follower.overflowed:
                raise JobError("bad-request", "client fell too far behind; re-read from the last sequence")
            if seq_of(item) >= next_seq:
                next_seq = seq_of(item) + 1
                yield {key: [item]}
    finally:
        if follower is not None:
            broker.watchers.unfollow(record.id, follower)


@op("wait", requests.ManyJobs)
def wait(broker: BrokerView, peer: Peer, req: requests.ManyJobs) -> AsyncIterator[dict[str, Any]]:
    records = [readable_record(broker, peer, i) for i in req.jobs]

    async def results() -> AsyncIterator[dict[str, Any]]:
        followers = {r.id: broker.watchers.follow_inactive(r.id) for r in records if not r.closed}
        try:
            for r in records:
                if r.id not in followers:
                    yield {"job": r.id, "status": r.status, "state": r.state.value, "exception": r.exception}
            for follower in followers.values():
                yield await follower.queue.get()
        finally:
            for job_id, follower in followers.items():
                broker.watchers.unfollow(job_id, follower)

    return results()


@op("task-results", requests.TaskResults)
def task_results(broker: BrokerView, peer: Peer, req: requests.TaskResults) -> Any:
    record = readable_record(broker, peer, req.job)
    start, limit = req.start, req.limit
    fut = broker.manager.store.task_results(record.id, start, limit, req.errors)
    return asyncio.ensure_future(_wrap(fut, "tasks"))


async def _wrap(awaitable: Any, key: str) -> dict[str, Any]:
    return {key: await awaitable}


@op("stdin", requests.Stdin)
def stdin(broker: BrokerView, peer: Peer, req: requests.Stdin) -> Any:
    record = broker.manager.get(req.job)
    data, eof = req.data, req.eof
    if peer.uid != record.uid:
        raise JobError("permission", f"only the owner of job {record.id} may write to its stdin")
    if len(data) > STDIN_MAX_BYTES:
        raise JobError("bad-request", f"stdin data of {len(data)} bytes exceeds {STDIN_MAX_BYTES}")
    if record.state == State.INACTIVE:
        return {"open": False}
    if record.spec is None or record.spec.stdin is None:
        raise JobError("bad-request", f"job {record.id} was not submitted with stdin")
    relay = broker.execution.stdin
    # When this client goes away, the tasks read end-of-file rather than wait for it forever.
    peer.closers.setdefault(("stdin", record.id), lambda: relay.close(record.id))
    return relay.write(record.id, data, eof)


@op("resources", requests.Resources)
def resources(broker: BrokerView, peer: Peer, req: requests.Resources) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": broker.graph.summary()}
    if req.tree:
        out["tree"] = broker.graph.tree()
    return out


@op("status")
def status(broker: BrokerView, peer: Peer, req: requests.Empty) -> dict[str, Any]:
    cfg = broker.config
    execution = broker.execution
    return {"name": cfg.name, "size": cfg.size, "fanout": cfg.fanout, "epoch": broker.epoch,
            "ranks": broker.ranks.rows(), "queue": broker.manager.queue_counts(),
            "tasks": {"started": execution.tasks_started, "ended": execution.tasks_ended},
            "journal": {"stalled": broker.journal.stalled}}


@op("drain", requests.Drain)
def drain(broker: BrokerView, peer: Peer, req: requests.Drain) -> asyncio.Future[dict[str, Any]]:
    check_owner(broker, peer, "drain ranks")
    ranks = _ranks(broker, req.ranks)
    reason = req.reason or "drained by the owner"
    for r in ranks:
        broker.graph.drain(r, reason)
        broker.execution.window.recall_rank(r)  # its elements sent ahead run elsewhere (protocol.md §2.10)
    durable = broker.journal.write([store.rank_drained(r, reason) for r in ranks])
    return reply_when_done(durable, {"drained": ranks})


@op("undrain", requests.Undrain)
def undrain(broker: BrokerView, peer: Peer, req: requests.Undrain) -> asyncio.Future[dict[str, Any]]:
    check_owner(broker, peer, "undrain ranks")
    ranks = _ranks(broker, req.ranks)
    for r in ranks:
        broker.graph.undrain(r)
    durable = broker.journal.write([store.rank_undrained(r) for r in ranks])
    broker.manager.wake_scheduler()
    return reply_when_done(durable, {"undrained": ranks})


def _ranks(broker: BrokerView, ranks: list[Any]) -> list[int]:
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or r not in broker.graph.nodes:
            raise JobError("not-found", f"rank {r!r} is not part of the MiniCluster's resources")
    return ranks


@op("shutdown", requests.Shutdown)
def shutdown(broker: BrokerView, peer: Peer, req: requests.Shutdown) -> dict[str, Any]:
    check_owner(broker, peer, "shut the MiniCluster down")
    if req.mode not in STOP_MODES:
        raise JobError("bad-request", f"shutdown mode must be one of {', '.join(STOP_MODES)}, got {req.mode!r}")
    asyncio.get_running_loop().call_later(0.05, broker.request_stop, req.mode)
    return {}
