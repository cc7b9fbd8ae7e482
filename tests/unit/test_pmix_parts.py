"""The PMIx server's pure parts and its ctypes view of libpmix, checked against the real library and headers."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minicluster.model.jobspec import InvalidJobspec, from_wire
from minicluster.proto import messages
from tests.host import skip_unless_ready
from worker.pmi import detect, libpmix
from worker.pmi.pmix_keys import JobLayout, job_keys, node_name
from worker.pmi.engine import JOB_PUT_BYTES
from worker.pmi.jobs import serve_modes
from worker.pmi.pmix_host import GroupRequest, serves_groups
from worker.pmi.pmix_jobs import PMIxJobs, _Job

HEADERS = Path("/usr/lib/x86_64-linux-gnu/pmix2/include")

ABI_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include <pmix_server.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(pmix_proc_t), sizeof(pmix_value_t),
           sizeof(pmix_info_t), offsetof(pmix_info_t, flags), offsetof(pmix_info_t, value),
           sizeof(pmix_data_array_t), sizeof(pmix_server_module_t), offsetof(pmix_server_module_t, abort),
           offsetof(pmix_server_module_t, fence_nb), offsetof(pmix_server_module_t, direct_modex),
           offsetof(pmix_server_module_t, group));
    printf("%d %d %d %d %d %d %d %d %u %d %d %d %d\n", PMIX_BOOL, PMIX_STRING, PMIX_UINT16, PMIX_UINT32, PMIX_INFO,
           PMIX_DATA_ARRAY, PMIX_PROC_RANK, PMIX_OPERATION_SUCCEEDED, PMIX_RANK_WILDCARD, PMIX_SIZE,
           PMIX_BYTE_OBJECT, PMIX_GROUP_CONSTRUCT, PMIX_GROUP_DESTRUCT);
    return 0;
}
"""


def test_ctypes_layout_matches_the_headers(tmp_path: Path) -> None:
    if not (HEADERS / "pmix_server.h").exists() or shutil.which("cc") is None:
        skip_unless_ready("libpmix-dev headers or a C compiler missing")
    (tmp_path / "probe.c").write_text(ABI_PROBE)
    subprocess.run(["cc", f"-I{HEADERS}", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], check=True)
    sizes, consts = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                                   check=True).stdout.splitlines()
    ours = [ctypes.sizeof(libpmix.Proc), ctypes.sizeof(libpmix.Value), ctypes.sizeof(libpmix.Info),
            libpmix.Info.flags.offset, libpmix.Info.value.offset, ctypes.sizeof(libpmix.DataArray),
            # less the slot OpenPMIx 5 added (session_control), for which the struct has room
            ctypes.sizeof(libpmix.ServerModule) - ctypes.sizeof(ctypes.c_void_p), libpmix.ServerModule.abort.offset,
            libpmix.ServerModule.fence_nb.offset, libpmix.ServerModule.direct_modex.offset,
            libpmix.ServerModule.group.offset]
    assert [int(x) for x in sizes.split()] == ours
    assert [int(x) for x in consts.split()] == [libpmix.BOOL, libpmix.STRING, libpmix.UINT16, libpmix.UINT32,
                                                libpmix.INFO, libpmix.DATA_ARRAY, libpmix.PROC_RANK,
                                                libpmix.OPERATION_SUCCEEDED, libpmix.RANK_WILDCARD, libpmix.SIZE,
                                                libpmix.BYTE_OBJECT, libpmix.GROUP_CONSTRUCT, libpmix.GROUP_DESTRUCT]


def test_layout_and_keys() -> None:
    layout = JobLayout.from_wire([[3, 2], [1, 3], [2, 1]])
    assert layout.nodes == ((1, 3), (2, 1), (3, 2)) and layout.size == 6
    assert layout.ranks_per_node() == [[0, 1, 2], [3], [4, 5]]
    assert [layout.node_of(t) for t in range(6)] == [1, 1, 1, 2, 3, 3]
    with pytest.raises(ValueError):
        layout.node_of(6)
    with pytest.raises(ValueError):
        JobLayout.from_wire([[1, 0]])
    keys = job_keys("mc.7", layout, 3, "/tmp/x", regex=lambda names: "R:" + ",".join(names),
                    ppn=lambda per_node: "P:" + ";".join(",".join(map(str, r)) for r in per_node))
    job = {k: v for k, _, v in keys if k != "pmix.pdata"}
    assert job["pmix.nmap"] == f"R:{node_name(1)},{node_name(2)},{node_name(3)}"
    assert job["pmix.pmap"] == "P:0,1,2;3;4,5"
    assert (job["pmix.job.size"], job["pmix.univ.size"], job["pmix.local.size"]) == (6, 6, 2)
    assert (job["pmix.lpeers"], job["pmix.lldr"], job["pmix.nodeid"], job["pmix.num.nodes"]) == ("4,5", 4, 2, 3)
    procs = [{k: v for k, _, v in entry} for k, _, entry in keys if k == "pmix.pdata"]
    assert [(p["pmix.rank"], p["pmix.lrank"], p["pmix.nodeid"]) for p in procs] == [
        (0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 0, 2), (5, 1, 2)]


def test_info_array_holds_nested_arrays() -> None:
    array = libpmix.InfoArray([("a.b", libpmix.STRING, "text"), ("c", libpmix.DATA_ARRAY,
                                                                  [("d", libpmix.UINT16, 7)])])
    info = array.array
    assert info[0].key == b"a.b" and info[0].value.data.string == b"text"
    inner = info[1].value.data.darray.contents
    assert inner.type == libpmix.INFO and inner.size == 1
    assert ctypes.cast(inner.array, ctypes.POINTER(libpmix.Info))[0].value.data.uint16 == 7
    with pytest.raises(ValueError):
        libpmix.InfoArray([("x", 99, 1)])


def test_detect_reads_the_program_s_libraries(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert detect.needed_libraries(str(script)) == [] and detect.pmi_for(str(script), None, None) is None
    assert detect.pmi_for("no-such-program-here", "/nonexistent", None) is None
    libs = detect.needed_libraries(sys.executable) or detect.needed_libraries("/bin/ls")
    assert any(lib.startswith("libc.so") for lib in libs)
    mpicc = shutil.which("mpicc.openmpi")
    if mpicc:
        (tmp_path / "m.c").write_text("#include <mpi.h>\nint main(void){MPI_Init(0,0);return MPI_Finalize();}\n")
        subprocess.run([mpicc, "-o", str(tmp_path / "m"), str(tmp_path / "m.c")], check=True)
        assert detect.pmi_for("m", str(tmp_path), None) == "pmix"
        assert detect.pmi_for("./m", None, str(tmp_path)) == "pmix"


def test_modes() -> None:
    assert from_wire({"argv": ["x"], "ntasks": 2}).pmi_mode == "pmi1"
    assert from_wire({"argv": ["x"]}).pmi_mode is None
    assert from_wire({"argv": ["x"], "mpi": "pmix"}).pmi_mode == "pmix"
    assert from_wire({"argv": ["x"], "ntasks": 4, "mpi": "none"}).uses_pmi is False
    with pytest.raises(InvalidJobspec, match="mpi: must be one of pmi1, pmix, auto, none"):
        from_wire({"argv": ["x"], "mpi": "pmi2"})
    def info(mpi: str | bool | None, argv: list[str]) -> messages.JobInfo:
        return messages.JobInfo(argv, {}, 1, [[0, 1]], os.getuid(), os.getgid(), mpi=mpi)

    assert serve_modes(info(True, ["x"])) == {"pmi1"} and serve_modes(info(None, ["x"])) == set()
    assert serve_modes(info("pmix", ["x"])) == {"pmix"}
    assert serve_modes(info("auto", ["/bin/sh"])) == {"pmi1", "pmix"}
    # No --mpi (rank 0 sends auto:<mpi_default>): a program that names no MPI gets the instance's default.
    assert serve_modes(info("auto:pmi1", ["/bin/sh"])) == {"pmi1"}
    assert serve_modes(info("auto:pmix", ["/bin/sh"])) == {"pmix"}


def test_no_mpi_given_serves_what_the_program_links(tmp_path: Path) -> None:
    mpicc = shutil.which("mpicc.openmpi")
    if mpicc is None:
        skip_unless_ready("Debian's Open MPI (apt openmpi-bin libopenmpi-dev) is not installed")
    (tmp_path / "m.c").write_text("#include <mpi.h>\nint main(void){MPI_Init(0,0);return MPI_Finalize();}\n")
    subprocess.run([mpicc, "-o", str(tmp_path / "m"), str(tmp_path / "m.c")], check=True, timeout=120)
    jobinfo = messages.JobInfo([str(tmp_path / "m")], {}, 2, [[0, 2]], os.getuid(), os.getgid(), mpi="auto:pmi1")
    assert serve_modes(jobinfo) == {"pmix"}


def test_fence_data_past_the_jobs_room_is_refused() -> None:
    sent: list[tuple[str, int, dict]] = []
    jobs = PMIxJobs(1, lambda kind, rank, body: sent.append((kind, rank, body)))
    jobs._jobs[5] = _Job("mc.5", JobLayout(((0, 1), (1, 1))), "/nonexistent")
    jobs._by_nspace["mc.5"] = 5
    answers: list[tuple[int, bytes]] = []
    room = JOB_PUT_BYTES // 2  # this node runs one of the job's two ranks
    jobs._fence("mc.5", b"x" * (room + 1), lambda status, data: answers.append((status, data)))
    assert answers == [(libpmix.ERR_BAD_PARAM, b"")] and sent == []
    jobs._fence("mc.5", b"x" * room, lambda status, data: answers.append((status, data)))
    assert [(kind, rank, body["seq"]) for kind, rank, body in sent] == [("pmi-put", 0, 1)]


def test_group_requests_a_worker_refuses_or_sends_to_rank_0() -> None:
    sent: list[tuple[str, int, dict]] = []
    jobs = PMIxJobs(1, lambda kind, rank, body: sent.append((kind, rank, body)))
    jobs._jobs[5] = _Job("mc.5", JobLayout(((0, 2), (1, 2))), "/nonexistent")  # ranks 0-1 on worker 0, 2-3 here
    jobs._by_nspace["mc.5"] = 5
    answers: list[tuple[int, int | None, bytes]] = []

    def ask(procs: list[tuple[str, int]], ctxid: bool = True, data: bytes = b"ep", op: str = "construct") -> None:
        jobs._group(GroupRequest(op, "g", procs, ctxid, data, 0),
                    lambda status, cid, blob: answers.append((status, cid, blob)))

    ask([("mc.5", 2), ("mc.6", 0)])  # two jobs: no collective spans them
    ask([("mc.5", 2), ("mc.5", 4)])  # no rank 4 in a job of 4
    ask([("mc.5", 2), ("mc.5", 0)], data=b"x" * (JOB_PUT_BYTES // 2 + 1))  # past this node's room
    assert answers == [(libpmix.ERR_NOT_SUPPORTED, None, b""), (libpmix.ERR_BAD_PARAM, None, b""),
                       (libpmix.ERR_BAD_PARAM, None, b"")] and sent == []
    answers.clear()
    ask([("mc.5", 2), ("mc.5", 3)], ctxid=False)  # all members here and no id asked: done at once
    assert answers == [(0, None, b"ep")] and sent == []
    ask([("mc.5", 0), ("mc.5", 3)])
    ask([("mc.5", libpmix.RANK_WILDCARD)], op="destruct", ctxid=False, data=b"")
    assert [(kind, rank, body["seq"], body["nodes"], body["op"]) for kind, rank, body in sent] == [
        ("pmix-group", 0, 0, [0, 1], "construct"), ("pmix-group", 0, 1, [0, 1], "destruct")]
    jobs.group_done(messages.PmixGroupDone(5, "g", 0, 0, 7, b"both"))
    jobs.group_done(messages.PmixGroupDone(5, "g", 0, 0, 8, b"again"))  # a repeat finds nobody waiting
    assert answers[1:] == [(0, 7, b"both")]


def test_groups_are_served_from_openpmix_4_2_4_on() -> None:
    # Older servers answer a group without its membership, which Open MPI 5's PMIx client misreads (docs/mpi.md).
    assert not serves_groups("OpenPMIx 4.2.2rc2 (PMIx Standard: 4.2")
    assert serves_groups("OpenPMIx 4.2.4") and serves_groups("OpenPMIx 5.0.11rc1 (PMIx Standard: 5.1)")
    assert not serves_groups("?")
