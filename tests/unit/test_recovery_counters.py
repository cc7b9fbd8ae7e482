"""broker/recovery.py restores every per-job counter from a real journal (issue 10 item 4): the event and output
sequences, the output bytes kept (and a truncation), the task counts, and those of a job caught in CLEANUP."""
from __future__ import annotations

from pathlib import Path

from broker import nodes, sched
from broker.execution import Execution
from broker.job import State
from broker.jobmanager import JobManager
from broker.durable.journal import Journal
from broker.recovery import load
from broker.durable.store import pack
from broker.supervise import Supervisor
from broker.watchers import Watchers
from minicluster import config as config_mod
from minicluster.testing import RecordingSender, jobspec_wire


def manager_on(journal: Journal, state: Path) -> JobManager:
    config = config_mod.from_mapping({"name": "t", "size": 1, "endpoint": f"ipc://{state}/o-{{rank}}.sock",
                                      "curve_cert": str(state / "curve"), "state_dir": str(state),
                                      "output_cap": 100}, source="test")
    graph, _ = nodes.build_graph(config)
    return JobManager(config, journal, sched.Scheduler(graph, config.policy, config.default_time_limit),
                      Watchers(), owner_uid=0, next_id=1,
                      tasks=lambda manager: Execution(config, manager, RecordingSender(rank=0).send, "unix:///none"),
                      wake_scheduler=lambda: None, background=Supervisor(lambda name, exc: None))


def journal_job(journal: Journal, job_id: int, events: list[tuple[str, dict]], tasks: list[tuple[int, int]],
                output: list[bytes], **spec: object) -> None:
    statements = [("INSERT INTO jobs (id, uid, gid, state, spec, t_submit) VALUES (?,?,?,?,?,?)",
                   (job_id, 0, 0, "NEW", pack(jobspec_wire(**spec)), 1.0))]
    statements += [("INSERT INTO events VALUES (?,?,?,?,?)", (job_id, seq, 1.0 + seq, name, pack(ctx)))
                   for seq, (name, ctx) in enumerate(events)]
    statements += [("INSERT INTO tasks VALUES (?,?,?,?,?,?,?,?,?,?)", (job_id, task, task, 0, status, status, None,
                                                                        None, 1.0, 2.0)) for task, status in tasks]
    statements += [("INSERT INTO output VALUES (?,?,?,?,?)", (job_id, oseq, 0, 1, data))
                   for oseq, data in enumerate(output)]
    journal.execute_now(statements)


RUNNING = [("submit", {}), ("depend", {}), ("priority", {}), ("alloc", {"ranks": "0"}), ("start", {})]


def test_a_running_job_goes_on_from_its_counters(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path))
    journal_job(journal, 1, RUNNING, [(0, 0), (1, 3)], [b"a\n", b"bb\n", b"ccc\n"], ntasks=3, mpi="none")
    journal_job(journal, 2, [*RUNNING, ("output-truncated", {"cap": 100})], [], [b"x" * 60], array="1-4")
    manager = manager_on(journal, tmp_path)
    load(manager)
    job = manager.jobs[1]
    assert (job.state, job.seq, job.oseq, job.output_bytes, job.truncated) == (State.RUN, 5, 3, 9, False)
    assert (job.succeeded, job.failed, job.tasks_left, job.ranks) == (1, 1, 1, {0})
    array = manager.jobs[2]
    assert (array.seq, array.oseq, array.output_bytes, array.truncated) == (6, 1, 100, True)


def test_a_job_caught_in_cleanup_keeps_the_counts_of_its_finish(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path))
    finish = {"status": 143, "counts": {"succeeded": 1, "failed": 0, "cancelled": 2}}
    events = [*RUNNING, ("exception", {"type": "cancel", "severity": 0, "note": "cancelled", "status": 143}),
              ("finish", finish), ("release", {})]
    journal_job(journal, 1, events, [(0, 0)], [b"one\n"], ntasks=3, mpi="none")
    manager = manager_on(journal, tmp_path)
    load(manager)
    job = manager.jobs[1]
    assert (job.state, job.seq, job.oseq, job.status) == (State.CLEANUP, 8, 1, 143)
    assert (job.succeeded, job.failed, job.cancelled, job.tasks_left) == (1, 0, 2, 0)
