"""MPI jobs on a real 4-rank MiniCluster (conftest's `cluster4`: fanout 2, so rank 3 is two hops from rank 0,
2 cores per rank).

Every task is a real MPICH process (PyPI's wheel, and for the C programs Debian's MPICH too) bootstrapped by the
workers' PMI-1 servers; the barrier exchange travels the overlay tree.  Each test checks the world size, because
a rank that silently ran as a singleton would otherwise look like success.
"""
from __future__ import annotations

import dataclasses
import json
import mmap
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from minicluster.client import Client
from minicluster.proto import messages
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.mpi_programs import COLLECTIVES, MPICH_BUILDS, RING, build_c
from worker.pmi.engine import TASK_PUT_BYTES
from worker.pmi.shm import SHM_DIR, fnv1a32, remove_unmapped_segments, segments_of
from worker.pmi.jobs import PMIJobs

pytest.importorskip("mpi4py", reason="mpi4py (with the mpich wheel) is not installed")

pytestmark = pytest.mark.mpi

PMI_VARS = ("PMI_", "MPIR_CVAR_PMI", "MPI_LOCAL")
# The segment MPICH maps for intra-node traffic; its name is derived from the kvsname (worker/pmi/shm.py).
SEGMENT_OF_SELF = "[l.split()[-1] for l in open('/proc/self/maps') if '/mpich_shm_' in l][:1]"

HELLO = f"""
import json, os
from mpi4py import MPI
c = MPI.COMM_WORLD
node = c.Split_type(MPI.COMM_TYPE_SHARED)
print(json.dumps({{"rank": c.rank, "size": c.size, "sum": c.allreduce(c.rank + 1), "node_size": node.size,
                  "host": MPI.Get_processor_name(), "node_rank": int(os.environ["MC_NODE_RANK"]),
                  "peers": node.allgather(c.rank), "segment": {SEGMENT_OF_SELF}}}), flush=True)
"""

# Rank argv[1] fails (argv[2]: exit or abort) once every rank is inside MPI; the rest wait in a barrier
# that never completes.
FAILING = f"""
import json, os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
print(json.dumps({{"rank": c.rank, "size": c.size, "segment": {SEGMENT_OF_SELF}}}), flush=True)
c.Barrier()
if c.rank == int(sys.argv[1]):
    if sys.argv[2] == "abort":
        c.Abort(3)
    os._exit(4)  # a crash: no MPI_Finalize
c.Barrier()
"""

C_PROG = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("{\"rank\": %d, \"size\": %d, \"sum\": %d, \"host\": \"%s\"}\n", rank, size, sum, host);
    MPI_Finalize();
    return 0;
}
"""


def python_job(code: str, *args: str, **fields: Any) -> dict[str, Any]:
    return job([sys.executable, "-c", code, *args], **fields)


def records(client: Client, job_id: int) -> list[dict[str, Any]]:
    """One JSON line per task, in MPI rank order."""
    lines = [json.loads(line) for out in output_of(client, job_id).values() for line in out.splitlines()]
    return sorted(lines, key=lambda r: r["rank"])


def exception_of(client: Client, job_id: int) -> tuple[dict[str, Any], float]:
    """The job's exception context and the seconds from the exception to the job's end."""
    events = list(client.eventlog(job_id))
    raised = next(e for e in events if e[2] == "exception")
    finished = next(e for e in events if e[2] == "finish")
    return raised[3], finished[1] - raised[1]


# Rank 1 dies before MPI_Init while its node-mate waits in MPI_Init's barrier.
DIES_BEFORE_INIT = """
import os, sys, time
if os.environ["MC_TASK_RANK"] == "1":
    os._exit(5)
time.sleep(0.5)
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
"""


def test_rank_dying_before_mpi_init_ends_the_job(client4: Client) -> None:
    # No --mpi: the job counts as MPI once its tasks use PMI; the barrier no longer waits for the dead rank.
    job_id = client4.submit(python_job(DIES_BEFORE_INIT, nnodes=1, ntasks=2, time_limit=60))
    result = wait_for(client4, job_id)
    assert result["exception"] == "abort" and result["status"] == 5
    assert client4.job(job_id)["reason"] == "task 1 on rank 0 exited with status 5"


@pytest.mark.smoke
def test_world_of_eight_ranks_on_four_nodes(client4: Client) -> None:
    job_id = client4.submit(python_job(HELLO, nnodes=4, ntasks=8))
    assert wait_for(client4, job_id)["status"] == 0
    recs = records(client4, job_id)
    assert [r["rank"] for r in recs] == list(range(8))
    assert {r["size"] for r in recs} == {8} and {r["sum"] for r in recs} == {36}
    # Ranks fill the nodes in order, and MPICH sees the same nodes (from PMI_process_mapping) as the workers.
    assert [r["node_rank"] for r in recs] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r["node_size"] == 2 and r["peers"] == [r["rank"] & ~1, r["rank"] | 1] for r in recs)
    assert {r["host"] for r in recs} == {socket.gethostname()}  # the "nodes" all run on this machine
    # Each node has its own shared-memory segment, shared by its two ranks only.
    segments = [tuple(r["segment"]) for r in recs]
    assert len(set(segments)) == 4 and all(segments[i] == segments[i + 1] for i in range(0, 8, 2))


def test_barriers_and_collectives_across_the_tree(client4: Client) -> None:
    job_id = client4.submit(python_job(COLLECTIVES, nnodes=4, ntasks=8))
    assert wait_for(client4, job_id)["status"] == 0
    recs = records(client4, job_id)
    assert len(recs) == 8
    for r in recs:
        me = r["rank"]
        assert r["size"] == 8 and r["root"] == {"from": 0, "n": 8}
        assert r["gathered"] == [i * i for i in range(8)]
        assert r["swapped"] == [src * 100 + me for src in range(8)]
        assert r["ring"] == (me - 1) % 8
        assert r["total"] == (28 if me == 7 else None)


@pytest.mark.parametrize(("how", "note", "status"), [("exit", "task 7 on rank 3 exited with status 4", 4),
                                                     ("abort", "task 7 on rank 3 called abort(3)", 3)])
def test_failing_rank_ends_the_job(client4: Client, cluster4: LocalCluster, how: str, note: str,
                                   status: int) -> None:
    # Task 7 runs on rank 3, two hops from rank 0; the other ranks are left spinning in a barrier.
    job_id = client4.submit(python_job(FAILING, "7", how, nnodes=4, ntasks=8))
    result = wait_for(client4, job_id)
    # As mpiexec: the failing rank's status, or MPI_Abort's code; not 143 of the ranks it took down.
    assert result["exception"] == "abort" and result["status"] == status
    context, ending = exception_of(client4, job_id)
    assert context["type"] == "abort" and context["note"].startswith(note)
    assert ending < cluster4.config.kill_grace + 1.0
    recs = records(client4, job_id)
    assert [r["size"] for r in recs] == [8] * 8 and all(r["segment"] for r in recs)
    survivors = [row for row in client4.task_results(job_id) if row[1] != 7]
    # SIGTERM ended them: none needed the SIGKILL that follows the kill grace.
    assert len(survivors) == 7 and all(row[5] == 15 for row in survivors), survivors
    # The killed ranks never finalized; their workers removed the segments they left.
    leftovers = {seg for r in recs for seg in r["segment"] if os.path.exists(seg)}
    assert not leftovers


def test_non_mpi_jobs_get_no_pmi(client4: Client) -> None:
    code = f"import os; print(sorted(k for k in os.environ if k.startswith({PMI_VARS!r})))"
    opted_out = client4.submit(python_job(code, nnodes=2, ntasks=4, mpi="none"))
    single = client4.submit(python_job(code))
    for job_id, ntasks in ((opted_out, 4), (single, 1)):
        assert wait_for(client4, job_id)["status"] == 0
        assert list(output_of(client4, job_id).values()) == [b"[]\n"] * ntasks


def test_ranks_sharing_a_hosts_cores_leave_mpi_tasks_unpinned(client4: Client) -> None:
    # cluster4's ranks share this host's cores: an MPI task may run on any of them, a plain task on its own.
    code = "import os; print(len(os.sched_getaffinity(0)))"
    mpi = client4.submit(python_job(code, nnodes=2, ntasks=4, mpi="pmi1"))
    plain = client4.submit(python_job(code, nnodes=2, ntasks=4, mpi="none"))
    assert wait_for(client4, mpi)["status"] == 0 and wait_for(client4, plain)["status"] == 0
    host = str(len(os.sched_getaffinity(0))).encode()
    assert list(output_of(client4, mpi).values()) == [host + b"\n"] * 4
    assert list(output_of(client4, plain).values()) == [b"1\n"] * 4


def test_ranks_sharing_a_hosts_cores_tell_open_mpi_to_yield(client4: Client) -> None:
    # cluster4's four ranks run on this one host: an MPI rank that busy-polls takes the core its peer needs.
    code = "import os; print(os.environ.get('OMPI_MCA_mpi_yield_when_idle'))"
    default = client4.submit(python_job(code, nnodes=2, ntasks=2, mpi="pmi1"))
    own = client4.submit(python_job(code, nnodes=2, ntasks=2, mpi="pmi1", env={"OMPI_MCA_mpi_yield_when_idle": "0"}))
    plain = client4.submit(python_job(code, nnodes=2, ntasks=2, mpi="none"))
    for job_id, seen in ((default, b"1\n"), (own, b"0\n"), (plain, b"None\n")):
        assert wait_for(client4, job_id)["status"] == 0
        assert list(output_of(client4, job_id).values()) == [seen] * 2


@pytest.fixture(scope="module", params=list(MPICH_BUILDS))
def mpich(request: pytest.FixtureRequest) -> str:
    """Each MPICH build in turn: PyPI's wheel and Debian's."""
    return str(request.param)


def test_c_program_built_with_mpicc(client4: Client, mpich: str, tmp_path: Path) -> None:
    c_program = build_c(mpich, C_PROG, tmp_path, "hello")
    job_id = client4.submit(job([c_program], nnodes=4, ntasks=4, time_limit=60))
    assert wait_for(client4, job_id)["status"] == 0
    recs = records(client4, job_id)
    assert [(r["rank"], r["size"], r["sum"]) for r in recs] == [(i, 4, 6) for i in range(4)]
    assert {r["host"] for r in recs} == {socket.gethostname()}
    assert sorted(int(row[3]) for row in client4.task_results(job_id)) == [0, 0, 0, 0]


def test_ring_ends_every_time(client4: Client, mpich: str, tmp_path: Path) -> None:
    # Debian's MPICH 4.0 under the old default UCX_TLS=tcp,self: all six ranks printed, then one spun in UCX in
    # MPI_Finalize while the others waited in its PMI barrier, in about a third to a half of the runs.  Eight
    # runs in a row, each bounded by its time limit, so a hang that comes that often cannot pass.
    ring = build_c(mpich, RING, tmp_path, "ring")
    for run in range(8):
        job_id = client4.submit(job([ring], nnodes=3, ntasks=6, time_limit=20))
        result = wait_for(client4, job_id, 60)
        assert result["exception"] is None and result["status"] == 0, f"run {run}: {result}"
        recs = records(client4, job_id)
        assert [(r["rank"], r["size"], r["token"]) for r in recs] == [(i, 6, (i - 1) % 6) for i in range(6)]


def test_barrier_never_completes_until_time_limit(client4: Client) -> None:
    # Rank 0 never calls MPI_Init; the others wait for it in the barrier at the end of theirs.
    code = "import os, time\nif os.environ['PMI_RANK'] == '0': time.sleep(60)\nfrom mpi4py import MPI"
    job_id = client4.submit(python_job(code, nnodes=4, ntasks=4, time_limit=1.5))
    result = wait_for(client4, job_id)
    assert result["exception"] == "timeout"
    context, _ = exception_of(client4, job_id)
    assert "1.5" in context["note"]
    assert [row[5] for row in client4.task_results(job_id)] == [15] * 4


# Task 0 puts 1 KiB values over its PMI_FD until a put is refused (at most 20 MiB, past its 16 MiB), prints what
# it got and exits 1, as MPICH would; task 1 waits in the first barrier.
PUT_FLOOD = """
import json, os, socket, sys
f = socket.socket(fileno=int(os.environ["PMI_FD"])).makefile("rw", newline="\\n")
def ask(line):
    f.write(line + "\\n"); f.flush()
    return f.readline()
ask("cmd=init pmi_version=1 pmi_subversion=1")
kvs = ask("cmd=get_my_kvsname").split("kvsname=")[1].strip()
if os.environ["PMI_RANK"] == "1":
    ask("cmd=barrier_in")
    sys.exit(0)
accepted, answer = 0, ""
for i in range(20000):
    answer = ask(f"cmd=put kvsname={kvs} key=k{i:05d} value=" + "v" * 1018)
    if "rc=0" not in answer:
        break
    accepted += 1
print(json.dumps({"rank": 0, "accepted": accepted, "answer": answer}), flush=True)
sys.exit(1)
"""


def test_puts_past_the_limit_end_the_job_not_rank0(client4: Client) -> None:
    job_id = client4.submit(python_job(PUT_FLOOD, nnodes=2, ntasks=2, mpi="pmi1", time_limit=60))
    result = wait_for(client4, job_id)
    assert result["exception"] == "abort" and result["status"] == 1
    [rec] = records(client4, job_id)
    assert rec["accepted"] == TASK_PUT_BYTES // 1024
    assert rec["answer"].startswith("cmd=put_result rc=-1 msg=put_limit_of_a_task_reached")
    # Rank 0 serves on: the next MPI job across the same nodes runs.
    job_id = client4.submit(python_job(HELLO, nnodes=2, ntasks=2, time_limit=60))
    assert wait_for(client4, job_id)["status"] == 0
    assert [r["sum"] for r in records(client4, job_id)] == [3, 3]


# An intercommunicator between the two halves of the world (two workers' ranks), made again from its groups with
# MPI 4's group constructor, as mpi4py's own test_comm_inter does. The remote group names the other worker's
# processes by their process group, whose identity is the kvsname: with one kvsname per worker MPICH filed them
# under a made-up second group and the constructor aborted (allreduce_group.c: cdst != MPI_UNDEFINED).
INTERCOMM = """
import json
from mpi4py import MPI
world = MPI.COMM_WORLD
low = world.rank < world.size // 2
half = world.Split(0 if low else 1, key=0)
inter = half.Create_intercomm(0, world, world.size // 2 if low else 0)
local, remote = inter.Get_group(), inter.Get_remote_group()
again = MPI.Intercomm.Create_from_groups(local, 0, remote, 0)
print(json.dumps({"rank": world.rank, "size": world.size, "remote_size": again.remote_size,
                  "congruent": MPI.Comm.Compare(inter, again) == MPI.CONGRUENT,
                  "peers": again.allgather(world.rank)}), flush=True)
"""


def test_intercommunicator_across_workers(client4: Client) -> None:
    job_id = client4.submit(python_job(INTERCOMM, nnodes=2, ntasks=4, time_limit=60))
    assert wait_for(client4, job_id)["status"] == 0
    recs = records(client4, job_id)
    assert [r["rank"] for r in recs] == [0, 1, 2, 3] and {r["size"] for r in recs} == {4}
    assert all(r["remote_size"] == 2 and r["congruent"] for r in recs)
    assert [r["peers"] for r in recs] == [[2, 3], [2, 3], [0, 1], [0, 1]]


def test_kvsname_is_rank_0s_and_a_workers_own_only_for_an_older_rank_0() -> None:
    # Two worker processes (e.g. one before and one after a restart) serving the same job id.
    named = messages.JobInfo(argv=["a"], env={}, ntasks=2, layout=[[1, 1], [2, 1]], uid=0, gid=0, kvsname="mc-1-ab")
    unnamed = dataclasses.replace(named, kvsname=None)
    workers = [PMIJobs(rank=1, send=lambda kind, dest, body: None) for _ in range(2)]
    assert {w.kvsname(1, named) for w in workers} == {"mc-1-ab"}
    names = [w.kvsname(1, unnamed) for w in workers]
    assert names[0] != names[1] and all(n.startswith("mc-1-") for n in names)


def test_only_unmapped_segments_are_removed() -> None:
    kvsname = f"mc-test-{os.getpid()}"
    prefix = SHM_DIR / f"mpich_shm_{fnv1a32(kvsname):x}"
    stale, live = Path(f"{prefix}_0"), Path(f"{prefix}_1")
    for path in (stale, live):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    try:
        with live.open("r+b") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE):
            assert segments_of(kvsname) == [stale, live]
            assert remove_unmapped_segments(kvsname) == [stale]
            assert segments_of(kvsname) == [live]
    finally:
        for path in (stale, live):
            path.unlink(missing_ok=True)
