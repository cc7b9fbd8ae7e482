"""The journal tables of sharing (docs/scheduling.md): accounting, banks, queue states, fair-share usage.

Created with the journal's own tables (broker/journal.py), all `IF NOT EXISTS`, so an older journal gains them.
`usage_hours` is never purged: it is what `mc usage` reports after the jobs themselves are gone.
"""

SCHEMA = """
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
