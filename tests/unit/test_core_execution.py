"""Execution without sockets (tests/unit/core_rig.py): dispatch, and how results, failures and lost ranks settle
a job (protocol.md §2.5–2.7, §3.6)."""
from __future__ import annotations

import signal

import pytest

from broker.job import State
from minicluster.proto import messages
from tests.unit import core_rig
from tests.unit.core_rig import Core

NODE_LOST = 128 + signal.SIGKILL


@pytest.fixture
async def core(tmp_path):
    async with core_rig.started(tmp_path) as rig:
        rig.add_rank(0, "cores=1,memory=1024")
        rig.add_rank(1, "cores=1,memory=1024")
        yield rig


async def test_run_goes_out_only_once_the_alloc_is_durable_one_to_each_rank(core: Core) -> None:
    record = core.submit(("hostname", "-s"), ntasks=2)
    await core.durable()
    core.schedule()
    assert record.state is State.RUN and core.runs() == [], "no run before the alloc is durable"
    await core.durable()
    messages = core.sender.take("run")
    assert sorted(m.dst for m in messages) == [0, 1]
    runs = {m.dst: m.body for m in messages}
    assert [entry[:3] for rank in (0, 1) for entry in runs[rank]["tasks"]] == [[record.id, 0, 0], [record.id, 1, 1]]
    info = runs[1]["jobs"][record.id]
    # No --mpi: the workers serve what the program's ELF links, else the instance's mpi_default (pmi1).
    assert (info["argv"], info["ntasks"], info["layout"], info["mpi"]) == (["hostname", "-s"], 2, [[0, 1], [1, 1]],
                                                                           "auto:pmi1")
    assert info["env"]["MC_URI"] == core_rig.URI
    assert core.event_names(record)[-2:] == ["alloc", "start"]
    assert dict(core.events(record))["alloc"] == {"ranks": "0-1"}


async def test_results_of_every_task_finish_the_job_and_free_its_cores(core: Core) -> None:
    record = await core.running(ntasks=2)
    waiting = core.submit(ntasks=2)
    core.done(0, record, 0)
    assert record.state is State.RUN and core.schedule() == [], "one task still holds a core"
    core.done(1, record, 1)
    assert record.state is State.INACTIVE and record.status == 0
    await core.durable()
    assert core.events(record)[-3] == ("finish", {"status": 0, "counts": {"succeeded": 2, "failed": 0,
                                                                          "cancelled": 0}})
    assert [start.job_id for start in core.schedule()] == [waiting.id]


async def test_a_failed_task_of_independent_tasks_does_not_end_the_others(core: Core) -> None:
    record = await core.running(ntasks=2)
    core.done(1, record, 1, 2)
    assert record.state is State.RUN and not record.ending and core.kills() == []
    core.done(0, record, 0, 0)
    assert record.state is State.INACTIVE and record.status == 2 and (record.succeeded, record.failed) == (1, 1)
    assert record.exception is None and record.reason is None


async def test_a_task_that_could_not_start_names_the_reason(core: Core) -> None:
    record = await core.running()
    core.done(0, record, 0, 127, error="no-such-program: not found")
    assert record.state is State.INACTIVE and record.status == 127
    assert record.reason == "task 0 on rank 0: no-such-program: not found"


@pytest.mark.parametrize("mpi", ["pmi1", "pmix"])
async def test_a_failed_task_of_an_mpi_job_ends_the_gang_with_its_status(core: Core, mpi: str) -> None:
    record = await core.running(ntasks=2, mpi=mpi)
    core.done(1, record, 1, 3)
    assert record.exception == "abort" and record.ending
    assert core.kills() == [(0, [[record.id, 0]], signal.SIGTERM)]
    core.done(0, record, 0, 128 + signal.SIGTERM)
    assert record.state is State.INACTIVE and record.status == 3, "the job ends with its cause's status"
    await core.durable()
    assert dict(core.events(record))["exception"] == {
        "type": "abort", "severity": 0, "note": "task 1 on rank 1 exited with status 3", "status": 3}


async def test_pmi_init_after_a_failure_makes_the_job_a_gang(core: Core) -> None:
    record = await core.running(ntasks=2)
    core.done(1, record, 1, 4)
    assert not record.ending
    core.execution.pmi.on_init(messages.PmiInit(record.id))
    assert record.exception == "abort" and core.kills() == [(0, [[record.id, 0]], signal.SIGTERM)]


async def test_a_lost_rank_ends_a_plain_job_with_node_lost(core: Core) -> None:
    record = await core.running(ntasks=2)
    core.execution.rank_lost(1)
    assert record.exception == "node-lost" and record.reason == "rank 1 was lost"
    # (The lost rank's task is signalled too, before it is ended locally: a message its rank never reads.)
    assert (0, [[record.id, 0]], signal.SIGTERM) in core.kills()
    assert record.state is State.RUN and record.running == 1, "the lost task ended; the other is being killed"
    core.done(0, record, 0, 128 + signal.SIGTERM)
    assert record.state is State.INACTIVE and record.status == NODE_LOST


async def test_a_lost_rank_fails_only_its_own_array_elements(core: Core) -> None:
    record = await core.running(array="0-1")
    core.execution.rank_lost(1)
    assert record.exception is None and record.state is State.RUN
    assert (record.failed, record.tasks_left) == (1, 1)
    core.done(0, record, 0)
    assert record.state is State.INACTIVE and record.status == NODE_LOST and record.succeeded == 1


async def test_a_rank_that_rejoins_without_its_task_loses_the_job_and_its_strays_are_killed(core: Core) -> None:
    record = await core.running(ntasks=2)
    core.execution.reconcile(1, [[99, 0, [0], []]])
    assert record.exception == "node-lost" and record.reason == "rank 1 restarted"
    kills = core.kills()
    assert (0, [[record.id, 0]], signal.SIGTERM) in kills and (1, [[99, 0]], signal.SIGKILL) in kills
    assert record.running == 1 and record.failed == 1, "the task rank 1 forgot ended as node-lost"


async def test_a_rank_that_rejoins_with_all_its_tasks_changes_nothing(core: Core) -> None:
    record = await core.running(ntasks=2)
    core.execution.reconcile(1, [[record.id, 1, [0], []]])
    assert not record.ending and core.kills() == []
