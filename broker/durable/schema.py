"""Every table of the journal (docs/architecture.md#where-state-lives): the DDL alone, which
broker/durable/journal.py runs when it opens the file. The statements on these tables are in
broker/durable/store.py (the job tables) and broker/share/store.py (the sharing tables).

The DDL lives here, below both store modules and beside the journal, so that the journal, the bottom layer, imports
none of the layers that own the tables. Every statement is `IF NOT EXISTS`, so an older journal gains new tables;
a change that an older broker cannot read bumps SCHEMA_VERSION, which the journal checks.
"""

SCHEMA_VERSION = 1

JOB_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, uid INTEGER NOT NULL, gid INTEGER NOT NULL, state TEXT NOT NULL, spec BLOB NOT NULL,
    t_submit REAL NOT NULL, t_run REAL, t_inactive REAL, status INTEGER, exception TEXT,
    seq INTEGER NOT NULL DEFAULT 0, counts BLOB
);
-- Active jobs by state at start-up; finished ones by age (purge) with their status (the counts of `status`).
DROP INDEX IF EXISTS jobs_state;
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, t_inactive, status);
CREATE TABLE IF NOT EXISTS events (
    job INTEGER NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, name TEXT NOT NULL, context BLOB NOT NULL,
    PRIMARY KEY (job, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tasks (
    job INTEGER NOT NULL, task INTEGER NOT NULL, idx INTEGER NOT NULL, rank INTEGER NOT NULL,
    status INTEGER NOT NULL, exit_code INTEGER, signal INTEGER, error TEXT, started REAL, ended REAL,
    PRIMARY KEY (job, task)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS drains (rank INTEGER PRIMARY KEY, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    job INTEGER NOT NULL, task INTEGER NOT NULL, attempt INTEGER NOT NULL, idx INTEGER NOT NULL,
    rank INTEGER, status INTEGER, exit_code INTEGER, signal INTEGER, error TEXT, started REAL, ended REAL,
    outcome TEXT NOT NULL, not_before REAL, PRIMARY KEY (job, task, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS output_attempts (
    job INTEGER NOT NULL, oseq INTEGER NOT NULL, attempt INTEGER NOT NULL, PRIMARY KEY (job, oseq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS output (
    job INTEGER NOT NULL, oseq INTEGER NOT NULL, task INTEGER NOT NULL, stream INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (job, oseq)
) WITHOUT ROWID;
"""

# Sharing (docs/scheduling.md): accounting, banks, queue states, fair-share usage. `usage_hours` is never purged:
# it is what `mc usage` reports after the jobs themselves are gone.
SHARING_TABLES = """
CREATE TABLE IF NOT EXISTS task_usage (job INTEGER NOT NULL, task INTEGER NOT NULL, cpu REAL NOT NULL,
    rss INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS task_usage_job ON task_usage(job);
CREATE TABLE IF NOT EXISTS job_usage (
    job INTEGER PRIMARY KEY, uid INTEGER NOT NULL, project TEXT NOT NULL, queue TEXT NOT NULL,
    t_start REAL, t_end REAL NOT NULL, ntasks INTEGER NOT NULL, cores INTEGER NOT NULL, gpus INTEGER NOT NULL,
    mem_mb INTEGER NOT NULL, wall REAL NOT NULL, core_seconds REAL NOT NULL, gpu_seconds REAL NOT NULL,
    cpu_seconds REAL NOT NULL, max_rss INTEGER NOT NULL, status INTEGER
);
CREATE TABLE IF NOT EXISTS usage_hours (
    hour INTEGER NOT NULL, uid INTEGER NOT NULL, project TEXT NOT NULL, queue TEXT NOT NULL,
    jobs INTEGER NOT NULL, core_seconds REAL NOT NULL, gpu_seconds REAL NOT NULL, wall_seconds REAL NOT NULL,
    cpu_seconds REAL NOT NULL, PRIMARY KEY (hour, uid, project, queue)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS banks (name TEXT PRIMARY KEY, parent TEXT NOT NULL, shares INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS bank_users (
    bank TEXT NOT NULL, uid INTEGER NOT NULL, shares INTEGER NOT NULL, is_default INTEGER NOT NULL,
    PRIMARY KEY (bank, uid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue_state (
    name TEXT PRIMARY KEY, enabled INTEGER NOT NULL, started INTEGER NOT NULL, reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fairshare_usage (
    bank TEXT NOT NULL, uid INTEGER NOT NULL, value REAL NOT NULL, t REAL NOT NULL, PRIMARY KEY (bank, uid)
) WITHOUT ROWID;
"""

TABLES = JOB_TABLES + SHARING_TABLES
