"""Finished jobs live in the journal, not in memory (issue 17 item 4; architecture.md#where-state-lives).

A job leaves the job manager's table once its `clean` event is durable and comes here: the most recently used
`capacity` finished jobs (config `finished_cache`) stay in memory (what `mc jobs ID`, attach, output and eventlog
of a job that just ended look up); any other is read back by id from the journal when asked for and takes a place
in the cache. Counts of
finished jobs (by success) are kept as they change, so `status` does not walk the history; at start-up they come
from the journal's state index, and nothing else of the history is read.
"""
from __future__ import annotations

from collections import OrderedDict

from broker.job import Job, State
from broker.share.accounting import UsageRecord, efficiencies
from broker.durable.store import JobStore, Row, unpack
from minicluster.model import jobspec as jobspec_model
from minicluster.model.text import control_character, printable


def stored_spec(blob: bytes) -> jobspec_model.Jobspec:
    """A jobspec as the journal holds it. A name stored before names were refused control characters is made
    printable rather than refused: a restart never loses a job to a rule newer than the job."""
    data = unpack(blob)
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and control_character(name) is not None:
        data = {**data, "name": printable(name)}
    return jobspec_model.from_wire(data)


def record_of(row: Row, retries: int = 0) -> Job:
    """A job's record from its JOB_COLUMNS row (broker/durable/store.py); an inactive one is retired at once."""
    job_id, uid, gid, state, spec_blob, t_submit, t_run, t_inactive, status, exception, seq, counts = row[:12]
    job = Job(job_id, uid, stored_spec(spec_blob), t_submit, gid)
    job.restore_row(State(state), t_run, t_inactive, status, exception, seq,
                    unpack(counts) if counts is not None else None, retries)
    return job


def finished_record_of(row: Row) -> Job:
    """A finished job's record from its FINISHED_COLUMNS row: with its retries and efficiencies."""
    job = record_of(row, retries=row[12])
    if row[14] is not None:  # t_end: the job has a usage record
        job.acct = efficiencies(UsageRecord(*row[13:24]))
    return job


class History:
    def __init__(self, store: JobStore, capacity: int) -> None:
        self.store = store
        self.capacity = capacity
        self.cache: OrderedDict[int, Job] = OrderedDict()
        self.succeeded = 0   # finished with status 0 (or none)
        self.failed = 0

    @property
    def count(self) -> int:
        return self.succeeded + self.failed

    def load_counts(self) -> None:
        self.succeeded, self.failed = self.store.inactive_counts()

    def add(self, job: Job) -> None:
        """`job`'s `clean` event is durable: it is finished."""
        if job.status:
            self.failed += 1
        else:
            self.succeeded += 1
        self._keep(job)

    def get(self, job_id: int) -> Job | None:
        job = self.cache.get(job_id)
        if job is not None:
            self.cache.move_to_end(job_id)
            return job
        row = self.store.finished_job(job_id)
        if row is None:
            return None
        job = finished_record_of(row)
        self._keep(job)
        return job

    def cached(self, job_id: int) -> Job | None:
        return self.cache.get(job_id)

    def forget(self, purged: list[tuple[int, int | None]]) -> None:
        """(id, status) of jobs purged from the journal."""
        for job_id, status in purged:
            self.cache.pop(job_id, None)
            if status:
                self.failed -= 1
            else:
                self.succeeded -= 1

    def _keep(self, job: Job) -> None:
        self.cache[job.id] = job
        self.cache.move_to_end(job.id)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
