"""The runtime run from its view (images/runtime/mkview.py) keeps to itself: `mc start` from RUNTIME_ROOT, as a pod
runs `mc boot`, gives the batch command and its tasks the image's environment with only RUNTIME_ROOT/bin added, last
on PATH (so `mc run` works and shadows nothing), and serves PMIx from the view's own libpmix and plugins to an Open
MPI program of the "image" (this host's Debian Open MPI, its libpmix in /usr/lib).

Each run is in a private mount namespace: a tmpfs on /mnt with the view bind-mounted read-only at RUNTIME_ROOT,
gone with the process.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minicluster.runtime import RUNTIME_ROOT
from tests.host import skip_unless_ready
from tests.integration.mpi_programs import C_HELLO

REPO = Path(__file__).resolve().parents[2]
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # containerd's default

pytestmark = [pytest.mark.slow, pytest.mark.needs("patchelf", "unshare", "mount", root=True),
              pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("runtime") / "view"
    subprocess.run([sys.executable, str(REPO / "images/runtime/mkview.py"), "--dest", str(dest), "--source",
                    str(REPO)], check=True, timeout=240, capture_output=True)
    if not (dest / "lib/pmix/lib/libpmix.so.2").exists():
        skip_unless_ready("the view has no PMIx: Debian's libpmix2 is not installed where mkview looks")
    return dest


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mpicc = shutil.which("mpicc.openmpi")
    if mpicc is None:
        skip_unless_ready("Debian's Open MPI (apt openmpi-bin libopenmpi-dev) is not installed")
    workdir = tmp_path_factory.mktemp("image-app")
    (workdir / "hello.c").write_text(C_HELLO)
    subprocess.run([mpicc, "-O2", "-o", str(workdir / "hello"), str(workdir / "hello.c")], check=True)
    return workdir / "hello"


def in_view(view: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    mount = (f'mount -t tmpfs mc-test /mnt && mkdir {RUNTIME_ROOT} && mount --bind "$0" {RUNTIME_ROOT} && '
             f'mount -o remount,bind,ro {RUNTIME_ROOT} && exec "$@"')
    # A PID namespace of its own too: its /proc then shows this instance's processes only, not the host's others.
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                           "sh", "-c", mount, str(view), *argv],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_batch_command_and_its_tasks_get_only_the_views_bin_and_mpi_meets_the_views_pmix(
        view: Path, hello: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    batch = (f"env > {out}/batch; "
             f"mc run -N 2 -n 2 sh -c 'env > {out}/task-$MC_TASK_RANK' && "
             # As `kubectl exec POD -- /mnt/minicluster/bin/mc run ...` submits: the image's environment alone.
             f"env -i PATH={IMAGE_PATH} LD_LIBRARY_PATH=/opt/app/lib MC_URI=$MC_URI "
             f"{RUNTIME_ROOT}/bin/mc run sh -c 'env > {out}/exec' && "
             f"mc run -N 2 -n 4 --mpi pmix {hello} > {out}/mpi && "
             # What the runtime's processes (the only ones in this PID namespace) have mapped of any PMIx.
             f"cat /proc/[0-9]*/maps | grep -o '/[^ ]*pmix[^ ]*' | sort -u > {out}/maps")
    env = {"PATH": IMAGE_PATH, "HOME": str(tmp_path), "LD_LIBRARY_PATH": "/opt/app/lib"}
    done = in_view(view, [f"{RUNTIME_ROOT}/bin/mc", "start", "--size", "2", "--", "sh", "-c", batch], env)
    assert done.returncode == 0, done.stderr
    for name in ("batch", "task-0", "task-1", "exec"):
        seen = dict(line.split("=", 1) for line in (out / name).read_text().splitlines() if "=" in line)
        assert seen["PATH"] == f"{IMAGE_PATH}:{RUNTIME_ROOT}/bin", name
        assert seen["LD_LIBRARY_PATH"] == "/opt/app/lib", name
        leaked = {k: v for k, v in seen.items() if RUNTIME_ROOT in v and k != "PATH"}
        assert leaked == {} and not any(k.startswith(("PYTHON", "PMIX_PKG")) for k in seen), name
    ranks = [json.loads(line) for line in (out / "mpi").read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and {(r["size"], r["sum"]) for r in ranks} == {(4, 6)}
    maps = (out / "maps").read_text().split()
    assert f"{RUNTIME_ROOT}/lib/pmix/lib/libpmix.so.2" in maps
    assert any(m.startswith(f"{RUNTIME_ROOT}/lib/pmix/lib/pmix/pmix_mca_") for m in maps)
    assert [m for m in maps if not m.startswith(RUNTIME_ROOT + "/")] == []  # nothing of the image's PMIx
