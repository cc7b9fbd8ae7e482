"""A page of `attempts` reads a bounded part of the journal (the real sqlite journal, temp_journal)."""
from __future__ import annotations

from broker.durable import store
from broker.durable.store import JobStore
from minicluster.testing import flushed, temp_journal


async def test_a_page_of_attempts_reads_at_most_limit_rows_and_the_same_first_rows(tmp_path) -> None:
    async with temp_journal(tmp_path / "state") as journal:
        # 1,000 tasks; every third ran twice (a retry before its final attempt).
        journal.append([store.attempt_recorded((1, t, 0, t, t % 4, 1, 1, None, None, 1.0, 2.0, "retry", None))
                        for t in range(0, 1000, 3)])
        journal.append([store.task_result(1, t, t, t % 4, 0, 0, None, None, 3.0, 4.0) for t in range(1000)])
        await flushed(journal)
        jobs = JobStore(journal)
        whole_earlier, whole_final = await jobs.attempts(1, 10, None)
        earlier, final = await jobs.attempts(1, 10, None, limit=25)
    assert len(whole_final) == 990 and len(final) == 25 and len(earlier) == 25

    def page(a: list[list[object]], b: list[list[object]]) -> list[list[object]]:
        return sorted(a + b, key=lambda r: (r[0], r[2]))[:25]
    assert page(earlier, final) == page(whole_earlier, whole_final)
