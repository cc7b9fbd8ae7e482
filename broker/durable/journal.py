"""The broker's durable record: sqlite in WAL mode, written by one thread with group commit.

Every write is a list of (sql, params) statements.  The writer thread takes everything queued, runs it in one
transaction, commits, and only then resolves the callers' futures, so "acknowledged" always means "durable"
(docs/architecture.md#where-state-lives).  Reads go through a second connection on a reader thread so the event loop
never waits on the disk.

When the disk cannot take a commit (full, an I/O error, the file locked or made read-only) nothing fails: the
writer keeps the batch, marks the journal `stalled` (new submissions are refused meanwhile) and retries until it
commits, so the broker resumes by itself once space returns.  A write queued with `refuse_after` (a submission)
is not kept that long: once its time is up, the writer takes it out of the batch between two attempts, so it never
commits, and fails its future with `JournalRefused`; the writer alone decides, so a write is either committed or
refused, never both.  A statement that can never commit (a constraint,
a value sqlite cannot store) fails only its own write: the batch is committed again write by write.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, Union

from broker.durable.schema import SCHEMA_VERSION, TABLES
from broker.durable.statelock import lock_file
from minicluster.model.histogram import Histogram

log = logging.getLogger(__name__)

Statement = tuple[str, Sequence[Any]]
# What to tell once a write is committed: a future to resolve, a callback to run, nothing, or several of these
# (the writes gathered by Journal.one_write, told in order).
Waiter = Union["asyncio.Future[None]", Callable[[], None], None, list[Any]]
# A queued write: its statements, who to tell, and the monotonic time after which it is refused (None: never).
_Write = tuple[list[Statement], Waiter, float | None]
T = TypeVar("T")


class JournalError(RuntimeError):
    pass


class JournalRefused(JournalError):
    """A write with `refuse_after` could not commit in time: it was taken out of the batch and never commits."""


class JournalUnavailable(OSError):
    """The journal cannot be written now (the disk is full, ...): at start-up, the broker cannot start."""


# sqlite primary result codes of a disk that cannot take a write now, but may later: FULL, IOERR, BUSY,
# LOCKED, READONLY, NOMEM, CANTOPEN, PROTOCOL.
_TRANSIENT_CODES = frozenset((13, 10, 5, 6, 8, 7, 14, 15))
# The one row of values at the end of an INSERT that _execute_run sends many rows at a time.
_ONE_ROW = re.compile(r"VALUES\s*(\(\?(?:\s*,\s*\?)*\))\s*$", re.IGNORECASE)
# At most this many rows per INSERT: 100 KB of SQL text for a task result, well below sqlite's 1 MB limit. Runs
# shorter than _ROWS_AT_LEAST (and what is left of a run) go through executemany, as a few single jobs' events do.
_ROWS_PER_STATEMENT = 4096
_ROWS_AT_LEAST = 32
# How long the writer waits between retries of a stalled commit, at most.
_RETRY_MAX = 1.0


def transient(exc: BaseException) -> bool:
    """True for a failure of the disk, not of the statements: the same commit may succeed later."""
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is None or code & 0xFF in _TRANSIENT_CODES
    return isinstance(exc, OSError | MemoryError)


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL syncs the WAL at each commit: acknowledged submissions survive power loss, not just kill -9.
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


class Journal:
    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, "journal.sqlite")
        # Held until close(): one writer per journal (broker/durable/statelock.py). sqlite's own locks are fcntl
        # locks, which a flock does not touch.
        self._lock_fd: int | None = lock_file(self.path, f"journal {self.path}")
        try:
            self._set_up()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._writes: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        # The writes gathered by one_write() while it is open (on the event loop's thread), else None.
        self._gathered: list[tuple[list[Statement], Waiter]] | None = None
        # Set by the writer when it takes the stop request while retrying a stalled commit.
        self._stop_taken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer = threading.Thread(target=self._write_loop, name="journal-writer", daemon=True)
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "journal-reader", initializer=self._open_reader)
        self._reader_local = threading.local()
        self.commits = 0
        self.statements = 0
        # For /metrics: each commit's time from its first attempt to durable (a stall's retries included), and
        # how many times commits stalled.
        self.commit_seconds = Histogram()
        self.stalls = 0
        # Why commits are being retried (the disk is full, ...), None while they go through.
        self.stalled: str | None = None
        self._closing = False
        self._gave_up: BaseException | None = None
        self._lookup_conn: sqlite3.Connection | None = None

    def _set_up(self) -> None:
        with self._startup_io():
            setup = _connect(self.path)
            # The journal holds every job's environment and output: owner only (WAL and SHM files inherit it).
            os.chmod(self.path, 0o600)
            setup.executescript(TABLES)
            found = setup.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if found is None:
                setup.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            setup.close()
        if found is not None and found[0] != SCHEMA_VERSION:
            raise JournalError(f"{self.path} has schema {found[0]}, this broker reads {SCHEMA_VERSION}")

    # --- synchronous use, before the event loop serves anyone -------------------------------------------

    @contextlib.contextmanager
    def _startup_io(self) -> Iterator[None]:
        """A disk that cannot take a write at start-up stops the broker with a message that says so."""
        try:
            yield
        except Exception as exc:
            if transient(exc):
                raise JournalUnavailable(f"cannot write the journal {self.path} ({exc}); free space on its "
                                         "filesystem and start again") from None
            raise

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read on the calling thread: for start-up recovery only."""
        with self._startup_io():
            conn = _connect(self.path)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def lookup(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read by primary key on the calling thread, through a connection kept for it: for a finished job
        missing from the broker's cache (broker/history.py), a page-cache read of one row, cheaper than the
        round trip through the reader thread."""
        if self._lookup_conn is None:
            self._lookup_conn = _connect(self.path)
        return self._lookup_conn.execute(sql, params).fetchall()

    def execute_now(self, statements: list[Statement]) -> None:
        """A synchronous transaction: for start-up only, before the writer thread runs."""
        with self._startup_io():
            conn = _connect(self.path)
            try:
                _run_transaction(conn, statements)
            finally:
                conn.close()

    # --- asynchronous use --------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._writer.start()

    def write(self, statements: list[Statement]) -> asyncio.Future[None]:
        """Queue one atomic group of statements; the future resolves once it is committed."""
        assert self._loop is not None, "Journal.start() first"
        fut: asyncio.Future[None] = self._loop.create_future()
        self._queue(statements, fut)
        return fut

    @contextlib.contextmanager
    def one_write(self, refuse_after: float | None = None) -> Iterator[None]:
        """Every write() and append() made inside goes to the writer as one write, committed whole or not at all.

        With `refuse_after` (seconds), a write the disk cannot take by then is refused instead: every future
        inside fails with JournalRefused and no callback runs. Only for code on the event loop, not nested.
        """
        assert self._loop is not None and self._gathered is None, "Journal.start() first; one_write does not nest"
        gathered: list[tuple[list[Statement], Waiter]] = []
        self._gathered = gathered
        try:
            yield
        finally:
            self._gathered = None
            waiters: list[Any] = [waiter for _, waiter in gathered]
            deadline = None if refuse_after is None else time.monotonic() + refuse_after
            self._writes.put(([s for group, _ in gathered for s in group], waiters, deadline))

    def _queue(self, statements: list[Statement], waiter: Waiter) -> None:
        if self._gathered is not None:
            self._gathered.append((statements, waiter))
        else:
            self._writes.put((statements, waiter, None))

    def append(self, statements: list[Statement], then: Callable[[], None] | None = None) -> None:
        """Like write(), without a future: `then` (if any) runs on the loop once committed, in order.

        For the many writes nobody awaits (most job events), a future per write is measurable overhead.
        """
        self._queue(statements, then)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, lambda: fn(self._reader_local.conn))

    async def close(self) -> None:
        self._closing = True  # a stalled commit gives up: what is not durable by now never will be
        if self._writer.is_alive():
            self._writes.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
        self._reader.shutdown(wait=True)
        if self._lookup_conn is not None:
            self._lookup_conn.close()
            self._lookup_conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open_reader(self) -> None:
        self._reader_local.conn = _connect(self.path)

    def _write_loop(self) -> None:
        conn = _connect(self.path)
        running = True
        while running:
            taken = [self._writes.get()]
            # Group commit: take everything that queued up while the last transaction was syncing.
            while len(taken) < 4096:
                try:
                    taken.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            batch = [item for item in taken if item is not None]
            running = len(batch) == len(taken)  # None asks the writer to stop
            if batch:
                self._commit(conn, batch)
            running = running and not self._stop_taken
        conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[_Write]) -> None:
        # Once closing gave up on a stalled commit, nothing after it may commit: a later event of a job would
        # leave a gap in its log where the lost one was.
        error = self._gave_up or self._commit_until_durable(conn, batch)
        if error is not None and self._closing:
            self._gave_up = error
        assert self._loop is not None
        if error is not None and len(batch) > 1 and not self._closing:
            # One write's statement cannot commit: commit the others write by write, fail only that one.
            for write in batch:
                alone = [write]  # empty once refused (its waiters have heard)
                failed = self._commit_until_durable(conn, alone, take_queued=False)
                self._loop.call_soon_threadsafe(_resolve, [w[1] for w in alone], failed and _failure(failed))
            return
        self._loop.call_soon_threadsafe(_resolve, [waiter for _, waiter, _ in batch], error and _failure(error))

    def _commit_until_durable(self, conn: sqlite3.Connection, batch: list[_Write],
                              take_queued: bool = True) -> BaseException | None:
        """Commit the batch, retrying while the disk cannot take it; the error of statements that can never commit.

        While it retries, writes queued meanwhile join the batch (with `take_queued`), and those whose time is up
        are refused (taken out of it, so that no later attempt commits them): `batch` may change, may end empty.
        """
        delay = 0.01
        began = time.monotonic()
        while True:
            statements = [s for group, _, _ in batch for s in group]
            try:
                _run_transaction(conn, statements)
            except Exception as exc:  # the writer must survive anything: every waiter hears how its write ended
                if not transient(exc) or self._closing:
                    log.error("journal commit of %d statements failed: %r", len(statements), exc)
                    return exc
                if self.stalled is None:
                    log.error("journal commits stalled, retrying until they go through: %s", exc)
                    self.stalls += 1
                self.stalled = str(exc)
                self._wait_to_retry(batch, delay, take_queued)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            if self.stalled is not None:
                log.warning("journal commits go through again")
                self.stalled = None
            self.commits += 1
            self.statements += len(statements)
            self.commit_seconds.observe(time.monotonic() - began)
            return None

    def _wait_to_retry(self, batch: list[_Write], delay: float, take_queued: bool) -> None:
        """Sleep before the next attempt (no longer than the first refusal is due), take in what was queued
        meanwhile, and refuse the writes whose time is up: from here on, no attempt carries them."""
        now = time.monotonic()
        due = min((d for _, _, d in batch if d is not None), default=now + delay)
        time.sleep(max(0.0, min(delay, due - now)))
        while take_queued and not self._stop_taken:
            try:
                item = self._writes.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._stop_taken = True
            else:
                batch.append(item)
        now = time.monotonic()
        refused = [w for w in batch if w[2] is not None and w[2] <= now]
        if not refused:
            return
        batch[:] = [w for w in batch if w[2] is None or w[2] > now]
        error = JournalRefused(f"the journal could not be written in time ({self.stalled})")
        log.error("journal: %d write(s) refused, not durable in time: %s", len(refused), self.stalled)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_resolve, [w[1] for w in refused], error)


def _execute_run(conn: sqlite3.Connection, sql: str, rows: list[Sequence[Any]]) -> None:
    """A run of the same statement (a batch of task results, output chunks, events). An INSERT of one row of
    values goes as INSERTs of 32 to 4,096 rows (fewer where sqlite takes fewer variables): every sqlite call
    lets go of the GIL and must take it back from a busy event loop (up to the 5 ms switch interval), so one call
    per row (executemany) held the writer to about 23,000 rows/s behind a busy rank 0 and made million-task arrays
    wait for their journal (docs/performance.md, "A million tasks timed from the user's command")."""
    row = _values_row(sql)
    start = 0
    if row is not None:
        variables = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        most = min(_ROWS_PER_STATEMENT, variables // row.count("?"))
        while len(rows) - start >= _ROWS_AT_LEAST:
            # Powers of two only: a few distinct statements per table, which sqlite3's statement cache keeps.
            count = 1 << (min(most, len(rows) - start).bit_length() - 1)
            chunk = rows[start:start + count]
            conn.execute(_rows_of(sql, row, count), [value for values in chunk for value in values])
            start += count
    if start < len(rows):
        conn.executemany(sql, rows[start:] if start else rows)


@functools.lru_cache(maxsize=64)
def _values_row(sql: str) -> str | None:
    """The `(?,...,?)` an INSERT of one row of values ends in; None for any other statement."""
    match = _ONE_ROW.search(sql)
    return match.group(1) if match and sql.lstrip().upper().startswith("INSERT") else None


@functools.lru_cache(maxsize=128)
def _rows_of(sql: str, row: str, count: int) -> str:
    return sql + ("," + row) * (count - 1)


def _failure(exc: BaseException) -> JournalError:
    return JournalError(f"journal write failed: {exc}")


def _run_transaction(conn: sqlite3.Connection, statements: list[Statement]) -> None:
    conn.execute("BEGIN")
    try:
        for sql, group in itertools.groupby(statements, key=lambda s: s[0]):
            _execute_run(conn, sql, [params for _, params in group])
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (disk full) can leave the transaction open: the next BEGIN would fail, and a later
        # commit would carry this one's rows.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def when_durable(fut: asyncio.Future[None], then: Callable[[], object]) -> None:
    """Run `then` once the commit behind `fut` succeeded; after a failed one nothing is shown or sent."""
    def done(f: asyncio.Future[None]) -> None:
        if not f.cancelled() and f.exception() is None:
            then()
    fut.add_done_callback(done)


def _resolve(waiters: list[Waiter], error: BaseException | None) -> None:
    for waiter in waiters:
        if isinstance(waiter, list):
            _resolve(waiter, error)
        elif not isinstance(waiter, asyncio.Future):
            if error is None and waiter is not None:
                waiter()
        elif waiter.done():
            continue
        elif error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
