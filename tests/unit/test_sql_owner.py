"""One owner of the SQL (issue 12 item 3; docs/architecture.md#where-state-lives): statements are written only in
the journal and the store modules; the rest of the broker calls functions named after what they record or read.

import-linter keeps `sqlite3` itself in the journal and broker/durable/store.py (pyproject.toml); this keeps SQL
text and direct reads of the journal out of every other module.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {"broker/durable/journal.py", "broker/durable/store.py", "broker/share/store.py", "broker/durable/schema.py"}
# An SQL statement's opening words, or a read of the journal that takes SQL or a connection.
SQL = re.compile(r"\b(SELECT\s+\S|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+"
                 r"(TABLE|INDEX))|\.execute(many|script)?\(|\bjournal\.(query|read)\(|\bexecute_now\(")


def offending_lines() -> list[str]:
    found = []
    for package in ("broker", "worker", "minicluster"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in OWNERS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if SQL.search(line):
                    found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_no_sql_outside_the_store_modules() -> None:
    assert offending_lines() == [], "SQL belongs in broker/durable/store.py or broker/share/store.py"


def test_the_pattern_finds_what_main_had() -> None:
    for line in ('rows = journal.query("SELECT rank, reason FROM drains")',
                 '("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))',
                 '("UPDATE jobs SET spec=? WHERE id=?", (blob, job.id))',
                 'f"DELETE FROM {table} WHERE {column}=?"',
                 'await broker.journal.read(lambda c: c.execute(sql))'):
        assert SQL.search(line), line
    for line in ('UPDATE_HELP = "change a job"', 'log.info("Select a rank")', 'self.journal.write(statements)'):
        assert not SQL.search(line), line
