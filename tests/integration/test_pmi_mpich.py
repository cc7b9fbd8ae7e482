"""Real MPICH (PyPI wheel) + mpi4py programs bootstrapped by PMIJobServer.

Each "node" is one PMIJobServer; several servers are joined by an in-memory
exchange that does what the overlay tree does (gather every worker's puts,
merge, hand the merged set back to each), so the cross-worker path is real
PMI traffic from real MPI processes.  Every test checks the world size:
a rank that silently ran as a singleton would otherwise look like success.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.mpi_programs import C_HELLO, MPICH_BUILDS, RING, build_c
from worker.pmi import PMIExchange, PMIJobServer, mpi_env_defaults, process_mapping
from worker.pmi.engine import TASK_PUT_BYTES

pytest.importorskip("mpi4py", reason="mpi4py (with the mpich wheel) is not installed")

pytestmark = pytest.mark.mpi

RUN_TIMEOUT = 30.0

HELLO = """
import json, os
from mpi4py import MPI
c = MPI.COMM_WORLD
local = [int(os.environ[k]) for k in ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")]
print(json.dumps({"rank": c.rank, "size": c.size, "sum": c.allreduce(c.rank), "local": local}), flush=True)
"""


class TreeExchange:
    """Stands in for the overlay: merges the puts of all workers per barrier."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.calls: list[tuple[str, int, dict[str, str]]] = []
        self._rounds: dict[tuple[str, int], tuple[dict[str, str], list[int], asyncio.Event]] = {}

    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        self.calls.append((kvsname, seq, dict(local_kvs)))
        merged, arrived, done = self._rounds.setdefault((kvsname, seq), ({}, [0], asyncio.Event()))
        merged.update(local_kvs)
        arrived[0] += 1
        if arrived[0] == self.workers:
            done.set()
        await done.wait()
        return dict(merged)


@dataclass
class JobResult:
    returncodes: list[int]
    stdout: list[str]
    stderr: list[str]
    aborts: list[tuple[int, int, str]] = field(default_factory=list)

    def records(self) -> list[dict]:
        out = [json.loads(line) for text in self.stdout for line in text.splitlines() if line.startswith("{")]
        return sorted(out, key=lambda r: (r.get("phase", 0), r["rank"]))


def job_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_"))}
    return {**env, **mpi_env_defaults(), **extra}


async def run_job(
    argv: list[str],
    layout: list[int],
    *,
    mode: str = "fd",
    env_filter: Callable[[dict[str, str]], dict[str, str]] = lambda e: e,
    exchange: PMIExchange | None = None,
) -> JobResult:
    """Run ``argv`` as len(layout) "nodes" with layout[i] ranks each."""
    size = sum(layout)
    kvsname = f"mc-test-{uuid.uuid4().hex[:12]}"  # MPICH names its shm after it
    exchange = exchange or TreeExchange(len(layout))
    procs: list[asyncio.subprocess.Process] = []
    aborts: list[tuple[int, int, str]] = []

    def on_abort(rank: int, code: int, message: str) -> None:
        aborts.append((rank, code, message))
        for proc in procs:  # an MPI job is a gang: one abort ends it
            if proc.returncode is None:
                proc.kill()

    servers: list[PMIJobServer] = []
    first = 0
    try:
        for ntasks in layout:
            ranks = list(range(first, first + ntasks))
            first += ntasks
            server = PMIJobServer(
                kvsname=kvsname,
                universe_size=size,
                local_ranks=ranks,
                process_mapping=process_mapping(layout),
                exchange=exchange,
                on_abort=on_abort,
            )
            servers.append(server)
            procs += await spawn_ranks(server, ranks, argv, mode, env_filter)
            server.close_child_fds()
        outputs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in procs)), RUN_TIMEOUT
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for server in servers:
            server.close()
        await asyncio.sleep(0)
    return JobResult(
        returncodes=[p.returncode for p in procs],
        stdout=[o.decode() for o, _ in outputs],
        stderr=[e.decode() for _, e in outputs],
        aborts=aborts,
    )


async def spawn_ranks(
    server: PMIJobServer,
    ranks: list[int],
    argv: list[str],
    mode: str,
    env_filter: Callable[[dict[str, str]], dict[str, str]],
) -> list[asyncio.subprocess.Process]:
    procs = []
    port = await server.listen_tcp() if mode == "port" else 0
    for rank in ranks:
        if mode == "port":
            pmi_env, fds = server.env_for_port(rank, port), ()
        else:
            fd = server.socket_for(rank)
            pmi_env, fds = server.env_for(rank, fd), (fd,)
        procs.append(
            await asyncio.create_subprocess_exec(
                *argv,
                env=env_filter(job_env(pmi_env)),
                pass_fds=fds,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    return procs


def script(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "prog.py"
    path.write_text(text)
    return [sys.executable, str(path)]


def assert_world(result: JobResult, size: int) -> None:
    assert result.returncodes == [0] * size, result.stderr
    records = result.records()
    assert [r["rank"] for r in records] == list(range(size))
    assert all(r["size"] == size for r in records)
    assert all(r["sum"] == size * (size - 1) // 2 for r in records)


async def test_four_ranks_one_node(tmp_path: Path) -> None:
    result = await run_job(script(tmp_path, HELLO), [4])
    assert_world(result, 4)


async def test_two_nodes_exchange_business_cards(tmp_path: Path) -> None:
    tree = TreeExchange(2)
    result = await run_job(script(tmp_path, HELLO), [2, 2], exchange=tree)
    assert_world(result, 4)
    # One exchange per barrier per worker, and MPI_Init's carried the
    # network addresses of the ranks of both workers.
    first = [kvs for _, seq, kvs in tree.calls if seq == 0]
    assert len(first) == 2 and all(first)
    assert not set(first[0]) & set(first[1])
    assert len(tree.calls) % 2 == 0


async def test_uneven_layout_three_plus_two(tmp_path: Path) -> None:
    result = await run_job(script(tmp_path, HELLO), [3, 2])
    assert_world(result, 5)
    assert [r["local"] for r in result.records()] == [[0, 3], [1, 3], [2, 3], [0, 2], [1, 2]]


SESSIONS = """
import json
from mpi4py import MPI
for phase in range(3):
    s = MPI.Session.Init()
    g = s.Create_group("mpi://WORLD")
    c = MPI.Intracomm.Create_from_group(g, f"mc.phase{phase}")
    print(json.dumps({"phase": phase, "rank": c.rank, "size": c.size, "sum": c.allreduce(c.rank)}), flush=True)
    c.Free(); g.Free(); s.Finalize()
w = MPI.COMM_WORLD
for _ in range(3):
    w.Barrier()
print(json.dumps({"phase": 3, "rank": w.rank, "size": w.size, "sum": w.allreduce(w.rank)}), flush=True)
"""


async def test_several_init_phases_and_barriers(tmp_path: Path) -> None:
    tree = TreeExchange(2)
    result = await run_job(script(tmp_path, SESSIONS), [2, 2], exchange=tree)
    assert result.returncodes == [0] * 4, result.stderr
    records = result.records()
    assert [(r["phase"], r["rank"]) for r in records] == [(p, r) for p in range(4) for r in range(4)]
    assert all(r["size"] == 4 and r["sum"] == 6 for r in records)
    # MPICH runs a PMI barrier at init and another at finalize.
    assert {seq for _, seq, _ in tree.calls} >= {0, 1}


RAW_PMI_CLIENT = """
import json, os, socket, sys
sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
f = sock.makefile("rw", newline="\\n")
def ask(line):
    f.write(line + "\\n"); f.flush()
    return dict(t.split("=", 1) for t in f.readline().split())
rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
assert ask("cmd=init pmi_version=1 pmi_subversion=1")["rc"] == "0"
kvs = ask("cmd=get_my_kvsname")["kvsname"]
mapping = ask(f"cmd=get kvsname={kvs} key=PMI_process_mapping")["value"]
seen = []
for rnd in range(3):
    value = f"{rnd}-{rank}-" + "v" * 1500
    assert ask(f"cmd=put kvsname={kvs} key=k{rnd}-{rank} value={value}")["rc"] == "0"
    assert ask("cmd=barrier_in") == {"cmd": "barrier_out", "rc": "0"}
    got = [ask(f"cmd=get kvsname={kvs} key=k{rnd}-{peer}").get("value", "") for peer in range(size)]
    seen.append(all(v.startswith(f"{rnd}-{peer}-") and len(v) > 1500 for peer, v in enumerate(got)))
missing = ask(f"cmd=get kvsname={kvs} key=PMI_hwloc_xmlfile")["rc"]
assert ask("cmd=finalize")["cmd"] == "finalize_ack"
print(json.dumps({"rank": rank, "size": size, "sum": 0, "mapping": mapping, "seen": seen, "missing": missing}))
"""


async def test_raw_pmi_client_three_barriers_long_values(tmp_path: Path) -> None:
    tree = TreeExchange(2)
    result = await run_job(script(tmp_path, RAW_PMI_CLIENT), [3, 1], exchange=tree)
    assert result.returncodes == [0] * 4, result.stderr
    records = result.records()
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert all(r["size"] == 4 for r in records)
    assert all(r["mapping"] == "(vector,(0,1,3),(1,1,1))" for r in records)
    assert all(r["seen"] == [True, True, True] for r in records)
    assert all(r["missing"] == "-1" for r in records)
    assert sorted(seq for _, seq, _ in tree.calls) == [0, 0, 1, 1, 2, 2]


ABORT = """
from mpi4py import MPI
c = MPI.COMM_WORLD
assert c.size == 4
if c.rank == 1:
    c.Abort(3)
c.Barrier()
"""


def mpich_segments() -> set[Path]:
    return set(Path("/dev/shm").glob("mpich_shm_*"))


def mapped_segments() -> set[str]:
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):  # the process ended meanwhile
            mapped.update(line.split()[-1] for line in maps.read_text().splitlines() if "/mpich_shm_" in line)
    return mapped


@pytest.fixture
def reap_shm():
    """Remove the MPICH segments a killed job leaves in /dev/shm."""
    before = mpich_segments()
    yield
    in_use = mapped_segments()
    for path in mpich_segments() - before:
        if str(path) not in in_use:
            path.unlink(missing_ok=True)


async def test_abort_reaches_on_abort(tmp_path: Path, reap_shm: None) -> None:
    result = await run_job(script(tmp_path, ABORT), [2, 2])
    assert [(rank, code) for rank, code, _ in result.aborts] == [(1, 3)]
    assert all(rc != 0 for rc in result.returncodes)


async def test_pmi_port_mode(tmp_path: Path) -> None:
    result = await run_job(script(tmp_path, HELLO), [2, 2], mode="port")
    assert_world(result, 4)


async def test_pmi_port_without_pmi_id_fails_loudly(tmp_path: Path) -> None:
    def drop_id(env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k != "PMI_ID"}

    result = await run_job(script(tmp_path, HELLO), [2], mode="port", env_filter=drop_id)
    # Without PMI_ID MPICH would run each rank as a world of one; the server
    # refuses its init so MPI_Init fails instead.
    assert all(rc != 0 for rc in result.returncodes)
    assert result.records() == []


@pytest.mark.parametrize("mpi", list(MPICH_BUILDS))
async def test_c_program_built_with_mpicc(tmp_path: Path, mpi: str) -> None:
    binary = build_c(mpi, C_HELLO, tmp_path, "hello")
    result = await run_job([binary], [2, 1])
    assert_world(result, 3)


@pytest.mark.parametrize("mpi", list(MPICH_BUILDS))
async def test_ring_on_three_nodes_ends_every_time(tmp_path: Path, mpi: str) -> None:
    # With the worker's environment defaults (mpi_env_defaults): Debian's MPICH 4.0 hung in MPI_Finalize under
    # UCX_TLS=tcp,self about one run in three.  Each run is bounded by RUN_TIMEOUT.
    ring = build_c(mpi, RING, tmp_path, "ring")
    for _ in range(6):
        result = await run_job([ring], [2, 2, 2])
        assert result.returncodes == [0] * 6, result.stderr
        assert sorted((r["rank"], r["size"], r["token"]) for r in result.records()) == [
            (i, 6, (i - 1) % 6) for i in range(6)]


# -- server behaviour with raw PMI-1 clients (no MPI library involved) -------

RAW_CLIENT_HEAD = """
import json, os, socket
sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
f = sock.makefile("rw", newline="\\n")
def ask(line):
    f.write(line + "\\n"); f.flush()
    return f.readline()
"""


async def test_garbage_request_is_a_protocol_error(tmp_path: Path) -> None:
    body = RAW_CLIENT_HEAD + "print(json.dumps({'answer': ask('hello there')}))\n"
    result = await run_job(script(tmp_path, body), [1])
    assert [(rank, code) for rank, code, _ in result.aborts] == [(0, 1)]
    assert "PMI protocol error" in result.aborts[0][2]


PUT_FLOOD = RAW_CLIENT_HEAD + """
import sys
rank = int(os.environ["PMI_RANK"])
ask("cmd=init pmi_version=1 pmi_subversion=1")
kvs = ask("cmd=get_my_kvsname").split("kvsname=")[1].strip()
accepted, answer = 0, ""
if rank == 0:  # puts 1 KiB values until refused (or 20 MiB, past the limit)
    for i in range(20000):
        answer = ask(f"cmd=put kvsname={kvs} key=k{i:05d} value=" + "v" * 1018)
        if "rc=0" not in answer:
            break
        accepted += 1
else:
    ask(f"cmd=put kvsname={kvs} key=peer value=1")
barrier = ask("cmd=barrier_in")
peer = ask(f"cmd=get kvsname={kvs} key=peer")
print(json.dumps({"rank": rank, "accepted": accepted, "answer": answer, "barrier": barrier, "peer": peer}))
sys.exit(1 if rank == 0 else 0)  # as MPICH does when a put fails
"""


async def test_puts_past_the_task_limit_are_refused(tmp_path: Path) -> None:
    result = await run_job(script(tmp_path, PUT_FLOOD), [2])
    records = result.records()
    assert result.returncodes == [1, 0], result.stderr
    # Each put is 6 key bytes and 1018 value bytes; the one past the task's 16 MiB is answered with a failure.
    assert records[0]["accepted"] == TASK_PUT_BYTES // 1024
    assert records[0]["answer"].startswith("cmd=put_result rc=-1 msg=put_limit_of_a_task_reached")
    # The server serves on: the barrier completes and the other task's put is seen.
    assert [r["barrier"] for r in records] == ["cmd=barrier_out rc=0\n"] * 2
    assert all(r["peer"] == "cmd=get_result rc=0 value=1\n" for r in records)


async def test_leaving_without_finalize_is_not_an_abort(tmp_path: Path) -> None:
    body = RAW_CLIENT_HEAD + "ask('cmd=init pmi_version=1 pmi_subversion=1')\nprint(json.dumps({'rank': 0}))\n"
    result = await run_job(script(tmp_path, body), [1])
    assert result.returncodes == [0] and result.aborts == []


class FailingExchange:
    async def exchange(self, kvsname: str, seq: int, local_kvs: dict[str, str]) -> dict[str, str]:
        raise ConnectionError("overlay lost")


async def test_failed_exchange_fails_the_barrier(tmp_path: Path) -> None:
    body = RAW_CLIENT_HEAD + (
        "ask('cmd=init pmi_version=1 pmi_subversion=1')\n"
        "print(json.dumps({'answer': ask('cmd=barrier_in')}))\n"
    )
    result = await run_job(script(tmp_path, body), [2], exchange=FailingExchange())
    answers = [json.loads(out)["answer"] for out in result.stdout]
    assert answers == ["cmd=barrier_out rc=-1 msg=barrier_exchange_failed\n"] * 2


async def test_close_before_any_task_ran_leaks_nothing() -> None:
    server = PMIJobServer(
        kvsname="mc-test-unused",
        universe_size=2,
        local_ranks=[0, 1],
        process_mapping=process_mapping([2]),
        exchange=TreeExchange(1),
        on_abort=lambda rank, code, message: None,
    )
    server.socket_for(0)
    await server.listen_tcp()
    server.close()
    with pytest.raises(RuntimeError):
        server.socket_for(1)
    await asyncio.sleep(0)
    gc.collect()  # an unclosed socket would raise ResourceWarning (an error here)
