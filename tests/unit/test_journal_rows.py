"""How the journal's writer hands runs of INSERTs to sqlite (issue 33): thousands of rows per statement, not one
call per row, with every row and value kept and a statement that cannot commit still failing only its write."""
from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from broker.durable import store
from broker.durable.journal import JournalError, Statement, _run_transaction
from minicluster.testing import temp_journal

TASKS = 2 * 4096 + 40  # two statements of 4,096 rows, one of 32, 8 rows one by one


def results(job: int, count: int) -> list[Statement]:
    return [store.task_result(job, t, t + 1, t % 7, t % 3, t % 5, None, f"e{t}" if t % 11 == 0 else None,
                              t * 0.5, t * 0.5 + 1) for t in range(count)]


def test_a_run_of_results_reaches_sqlite_as_a_few_statements(tmp_path: Path) -> None:
    """Each sqlite call gives up the GIL and must take it back from rank 0's busy event loop: one call per row
    (executemany) left the writer far behind a million-task array."""
    conn = sqlite3.connect(tmp_path / "j.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE tasks (job, task, idx, rank, status, exit_code, signal, error, started, ended, "
                 "PRIMARY KEY (job, task)) WITHOUT ROWID")
    conn.execute("CREATE TABLE events (job, seq, ts, name, context)")
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    statements = [*results(1, TASKS), store.event(1, 1, 0.0, "finish", b""), *results(2, 3)]
    _run_transaction(conn, statements)
    inserts = [sql for sql in traced if sql.startswith("INSERT")]
    assert len(inserts) == 3 + 8 + 1 + 3, len(inserts)  # and the event and the 3 results of job 2 one by one
    rows = conn.execute("SELECT * FROM tasks ORDER BY job, task").fetchall()
    assert rows == [tuple(params) for _, params in sorted(results(1, TASKS) + results(2, 3),
                                                          key=lambda s: (s[1][0], s[1][1]))]
    assert conn.execute("SELECT job, name FROM events").fetchall() == [(1, "finish")]


def test_a_repeated_result_in_one_run_keeps_the_last_as_before(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "j.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE tasks (job, task, idx, rank, status, exit_code, signal, error, started, ended, "
                 "PRIMARY KEY (job, task)) WITHOUT ROWID")
    first, again = results(1, 2), [store.task_result(1, 1, 2, 4, 9, 9, None, "again", 3.0, 4.0)]
    _run_transaction(conn, first + again)
    assert conn.execute("SELECT task, status, error FROM tasks ORDER BY task").fetchall() == [
        (0, 0, "e0"), (1, 9, "again")]


async def test_a_bad_row_in_a_shared_run_fails_only_its_own_write(tmp_path: Path) -> None:
    """Three writes queued together share one multi-row INSERT; the one whose value sqlite cannot store fails
    alone and the others commit whole."""
    async with temp_journal(tmp_path) as journal:
        good = journal.write(results(1, 5000))
        bad = journal.write([store.task_result(2, 0, 1, 0, 2**70, None, None, None, None, None)])
        after = journal.write(results(3, 5000))
        outcome = await asyncio.wait_for(asyncio.gather(good, bad, after, return_exceptions=True), 30)
        assert outcome[0] is None and outcome[2] is None
        assert isinstance(outcome[1], JournalError)
        assert journal.query("SELECT job, COUNT(*) FROM tasks GROUP BY job") == [(1, 5000), (3, 5000)]
