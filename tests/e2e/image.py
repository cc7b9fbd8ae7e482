"""The pods' "image": what images/runtime/Dockerfile builds, as an install UID 10001 can run.

A pod's root filesystem is an overlay: this host's / as the read-only lower layer, a private tmpfs on top.  On it
the pod's init replays the Dockerfile's own steps (the user `mc`, UID 10001, with its home; /var/lib/minicluster
owned by it).  The Python environment is a venv cached outside the checkout, as .ci/apiserver.sh caches the API
server: Debian's python3.11 with the project's dependencies and the Dockerfile's MPICH + mpi4py, every file
readable by all.  The project itself is the checkout under test, mounted read-only at /opt/minicluster, so the
cache only changes with the dependencies.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("MC_E2E_CACHE", "/var/cache/minicluster"))
PYTHON = "/usr/bin/python3.11"
SRC_MOUNT = "/opt/minicluster"
NAME = "ghcr.io/minicluster/runtime:0.1.0"  # the image name the examples and docs use
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class Image:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def env(self) -> dict[str, str]:
        """The image's ENV (the python base image's, with the venv first on PATH)."""
        return {"PATH": f"{self.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG": "C.UTF-8"}


def available() -> str | None:
    """Why the image cannot be built here, or None."""
    if not os.access(PYTHON, os.X_OK):
        return f"{PYTHON} (Debian's python3.11, runnable by any user) is missing"
    return None


def requirements(repo: Path) -> list[str]:
    """The Dockerfile's pip installs: the project's dependencies plus its MPI pins, each at the version this
    test run uses (reproducible, and served from the local pip cache)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    dockerfile = (repo / "images" / "runtime" / "Dockerfile").read_text()
    pins = [r for line in re.findall(r"pip install --no-cache-dir ([^&\n]+)", dockerfile)
            for r in line.split() if "==" in r]
    names = [re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0] for dep in project["dependencies"]]
    pinned = []
    for name in names:
        try:
            pinned.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pinned.append(name)
    return sorted(set(pinned) | set(pins))


def scripts(repo: Path) -> dict[str, str]:
    return dict(tomllib.loads((repo / "pyproject.toml").read_text())["project"]["scripts"])


def ensure(repo: Path) -> Image:
    """The cached image for this checkout's dependencies, built once (about a minute) under a lock."""
    reqs, entry_points = requirements(repo), scripts(repo)
    key = hashlib.sha256(json.dumps([reqs, entry_points, PYTHON, LAYOUT_VERSION]).encode()).hexdigest()[:12]
    image = Image(CACHE / f"e2e-image-{key}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"e2e-image-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (image.root / "ready").exists():
            _build(image, reqs, entry_points)
    return image


def _build(image: Image, reqs: list[str], entry_points: dict[str, str]) -> None:
    shutil.rmtree(image.root, ignore_errors=True)
    image.root.mkdir(parents=True)
    _run([PYTHON, "-m", "venv", str(image.venv)])
    _run([str(image.venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *reqs])
    [site] = list((image.venv / "lib").glob("python3*/site-packages"))
    (site / "minicluster-checkout.pth").write_text(SRC_MOUNT + "\n")
    for name, target in entry_points.items():
        module, func = target.split(":")
        path = image.venv / "bin" / name
        path.write_text(f"#!{image.venv}/bin/python\nimport sys\nfrom {module} import {func}\n"
                        f"sys.exit({func}())\n")
        path.chmod(0o755)
    _run(["chmod", "-R", "a+rX", str(image.root)])
    (image.root / "ready").touch()


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"building the e2e image: {' '.join(argv[:3])} failed:\n{done.stderr[-3000:]}")
