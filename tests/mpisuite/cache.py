"""mpi4py's own test suite (test/ of the sdist of the version pyproject pins) and an mpi4py built against Debian's
MPICH, fetched and built once into /var/cache/minicluster/mpi4py-suite (outside the checkout, like the other
tiers' caches), under a file lock so that concurrent sessions build it once."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

VERSION = "4.1.2"  # pyproject's pin: the suite must match the mpi4py it tests
CACHE = Path(os.environ.get("MC_MPI4PY_SUITE_CACHE", "/var/cache/minicluster/mpi4py-suite"))
SDIST = f"mpi4py-{VERSION}.tar.gz"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def suite_dir() -> Path:
    """The extracted sdist (its test/ is the suite); downloaded from PyPI the first time, or the test is skipped
    with pip's reason when PyPI cannot be reached."""
    tree = CACHE / f"mpi4py-{VERSION}"
    with _locked():
        if (tree / "test" / "main.py").exists():
            return tree
        if not (CACHE / SDIST).exists():
            got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                                  "-d", str(CACHE), f"mpi4py=={VERSION}"], capture_output=True, text=True,
                                 timeout=300)
            if got.returncode != 0:
                last = (got.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.skip(f"cannot download mpi4py {VERSION}'s sdist from PyPI: {last}")
        with tarfile.open(CACHE / SDIST) as sdist:
            sdist.extractall(CACHE, filter="data")
    return tree


def debian_mpich_python(mpicc: str) -> Path:
    """A venv's python whose mpi4py (built from the sdist by pip, with Cython and setuptools from PyPI) links
    Debian's MPICH through `mpicc`: the venv's own mpi4py is the wheel built for PyPI's MPICH."""
    prefix = CACHE / "debian-mpich"
    python = prefix / "bin" / "python"
    stamp = prefix / "built-with"
    sdist = suite_dir().parent / SDIST
    with _locked():
        if stamp.exists() and stamp.read_text() == f"{VERSION} {mpicc}\n":
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(prefix)], check=True, timeout=120)
        got = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-binary", "mpi4py", str(sdist)],
                             env={**os.environ, "MPICC": mpicc}, capture_output=True, text=True, timeout=1200)
        if got.returncode != 0:
            pytest.fail(f"building mpi4py {VERSION} with {mpicc} failed:\n{got.stderr[-3000:]}")
        stamp.write_text(f"{VERSION} {mpicc}\n")
    return python
