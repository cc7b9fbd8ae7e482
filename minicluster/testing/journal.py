"""The broker's journal for tests: the real sqlite journal (broker/durable/journal.py) in a directory the test owns.

It runs its real writer thread, so a test sees group commit and durability as the broker does; `flushed`
waits until everything appended so far is committed (writes commit in order).  A journal held wholly in
memory with a synchronous writer needs a seam inside broker/durable/journal.py and is left to phase B of issue 12.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from broker.durable.journal import Journal


@contextlib.asynccontextmanager
async def temp_journal(directory: str | os.PathLike[str]) -> AsyncIterator[Journal]:
    """A started Journal in `directory` (created 0700 if missing), closed on exit."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    journal = Journal(os.fspath(directory))
    journal.start()
    try:
        yield journal
    finally:
        await journal.close()


async def flushed(journal: Journal) -> None:
    """Wait until every write and append made so far is durable."""
    await journal.write([])
