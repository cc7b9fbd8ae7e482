"""The pods' "images": what images/runtime/Dockerfile and images/operator/Dockerfile build, as installs their
users (UID 10001) can run.

A pod's root filesystem is an overlay: this host's / as the read-only lower layer, a private tmpfs on top.  On it
the pod's init replays the Dockerfile's own steps (its user, with its home; the directories it creates, with
their owners).  The Python environment is a venv per image cached outside the checkout, as .ci/kubernetes.sh
caches the API server: Debian's python3.11 with what the Dockerfile's pip installs (the project's dependencies
and extras, the runtime's MPICH + mpi4py), every file readable by all.  The project itself is the checkout under
test, mounted read-only at /opt/minicluster, so the cache only changes with the dependencies.  ENTRYPOINT, CMD,
USER and WORKDIR are read from the Dockerfile.  The runtime image also carries the view the Dockerfile builds at
RUNTIME_ROOT (`with_view`: images/runtime/mkview.py run by the venv's Debian python3.11, cached like the venv and
mounted read-only there), which its init container copies into MiniClusters of other images.  Application
images without minicluster are appimages.py's.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minicluster.runtime import RUNTIME_ROOT
from tests.e2e.appimages import AppImage

CACHE = Path(os.environ.get("MC_E2E_CACHE", "/var/cache/minicluster"))
PYTHON = "/usr/bin/python3.11"
SRC_MOUNT = "/opt/minicluster"
NAME = "ghcr.io/minicluster/runtime:0.1.0"  # the image name the examples and docs use
OPERATOR_NAME = "ghcr.io/minicluster/operator:0.1.0"  # deploy/kustomization.yaml's `images:`
LAYOUT_VERSION = 1
MKVIEW = "images/runtime/mkview.py"
VIEW_SOURCES = (MKVIEW, "pyproject.toml", "minicluster", "broker", "worker", "scripts")  # what the view is made of


@dataclass(frozen=True)
class Recipe:
    """One of images/: its name, and the steps the pod's init replays that the Dockerfile does not say plainly."""
    name: str
    directory: str  # images/DIRECTORY/Dockerfile
    extras: tuple[str, ...]  # pip install '.[EXTRAS]'
    passwd: str  # the useradd line's effect
    group: str
    dirs: list[list[Any]] = field(default_factory=list)  # [path, uid, gid, mode] the Dockerfile creates


RUNTIME = Recipe(NAME, "runtime", (), "mc:x:10001:10001::/home/mc:/usr/sbin/nologin", "mc:x:10001:",
                 [["/home/mc", 10001, 10001, 0o755], ["/var/lib/minicluster", 10001, 10001, 0o755]])
# useradd --no-create-home: the home in passwd does not exist; WORKDIR /src is emptied by `rm -rf /src` and made
# again (root's) by the runtime as the working directory.
OPERATOR = Recipe(OPERATOR_NAME, "operator", ("operator",),
                  "mc-operator:x:10001:10001::/home/mc-operator:/usr/sbin/nologin", "mc-operator:x:10001:",
                  [["/src", 0, 0, 0o755]])
RECIPES = (RUNTIME, OPERATOR)


@dataclass(frozen=True)
class Image:
    root: Path
    recipe: Recipe
    entrypoint: list[str]
    cmd: list[str]
    user: tuple[int, int]
    workdir: str
    view: Path | None = None  # the runtime image's injectable tree, at RUNTIME_ROOT in its containers
    lower = "/"  # the host's / is the image's lower layer
    checkout = True  # the checkout under test is mounted at SRC_MOUNT

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def home(self) -> str:
        return self.recipe.passwd.split(":")[5]

    @property
    def env(self) -> dict[str, str]:
        """The image's ENV (the python base image's, with the venv first on PATH)."""
        return {"PATH": f"{self.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG": "C.UTF-8"}

    @property
    def setup(self) -> dict[str, Any]:
        """For the pod's init (podinit.py)."""
        binds = [[str(self.view), RUNTIME_ROOT]] if self.view else []
        return {"passwd": self.recipe.passwd, "group": self.recipe.group, "dirs": self.recipe.dirs, "binds": binds}


AnyImage = Image | AppImage  # what the emulated node runs: the project's images, or an application's


def available() -> str | None:
    """Why the image cannot be built here, or None."""
    if not os.access(PYTHON, os.X_OK):
        return f"{PYTHON} (Debian's python3.11, runnable by any user) is missing"
    return None


def requirements(repo: Path, recipe: Recipe) -> list[str]:
    """The Dockerfile's pip installs: the project's dependencies and extras plus its pins, each at the version
    this test run uses (reproducible, and served from the local pip cache)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    dockerfile = (repo / "images" / recipe.directory / "Dockerfile").read_text()
    pins = [r for line in re.findall(r"pip install --no-cache-dir ([^&\n]+)", dockerfile)
            for r in line.split() if "==" in r]
    deps = [*project["dependencies"], *(d for extra in recipe.extras for d in project["optional-dependencies"][extra])]
    names = [re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0] for dep in deps]
    pinned = []
    for name in names:
        try:
            pinned.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pinned.append(name)
    return sorted(set(pinned) | set(pins))


def scripts(repo: Path) -> dict[str, str]:
    """What pip puts in the venv's bin/, name -> the text after the interpreter line: a wrapper for each entry
    point, and each of setuptools' script-files as it is (mc-submit): the view's bin/ gets the same (mkview)."""
    spec = importlib.util.spec_from_file_location("mkview", repo / "images/runtime/mkview.py")
    assert spec and spec.loader
    mkview = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mkview)
    return mkview.scripts(repo)


def instructions(repo: Path, recipe: Recipe) -> dict[str, Any]:
    """The Dockerfile's last ENTRYPOINT, CMD (exec form), USER and WORKDIR."""
    found: dict[str, Any] = {"ENTRYPOINT": [], "CMD": [], "USER": "0:0", "WORKDIR": "/"}
    for line in (repo / "images" / recipe.directory / "Dockerfile").read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word in ("ENTRYPOINT", "CMD"):
            found[word] = json.loads(rest)
        elif word in ("USER", "WORKDIR"):
            found[word] = rest.strip()
    return found


def ensure(repo: Path, recipe: Recipe) -> Image:
    """The cached image for this checkout's dependencies, built once (about a minute) under a lock."""
    reqs, entry_points = requirements(repo, recipe), scripts(repo)
    key = hashlib.sha256(json.dumps([reqs, entry_points, PYTHON, LAYOUT_VERSION]).encode()).hexdigest()[:12]
    said = instructions(repo, recipe)
    uid, _, gid = said["USER"].partition(":")
    image = Image(CACHE / f"e2e-image-{key}", recipe, said["ENTRYPOINT"], said["CMD"], (int(uid), int(gid or uid)),
                  said["WORKDIR"])
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"e2e-image-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (image.root / "ready").exists():
            _build(image, reqs, entry_points)
    return image


def with_view(repo: Path, image: Image) -> Image:
    """The runtime image with its view, as images/runtime/Dockerfile puts it at RUNTIME_ROOT: made by
    images/runtime/mkview.py, run by the image's own interpreter (Debian's python3.11 in the venv), from the
    checkout; cached under a key of mkview.py, the checkout's package files and the venv, under a lock."""
    mkview = repo / MKVIEW
    if not mkview.exists():
        return image
    digest = hashlib.sha256(image.root.name.encode())
    for path in sorted(p for d in VIEW_SOURCES for p in (repo / d).rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    view = CACHE / f"e2e-view-{digest.hexdigest()[:12]}"
    with open(view.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (view / "manifest.json").exists():
            shutil.rmtree(view, ignore_errors=True)
            _run([str(image.venv / "bin" / "python"), str(mkview), "--dest", str(view), "--prefix", RUNTIME_ROOT,
                  "--source", str(repo)])
    return dataclasses.replace(image, view=view)


def _build(image: Image, reqs: list[str], entry_points: dict[str, str]) -> None:
    shutil.rmtree(image.root, ignore_errors=True)
    image.root.mkdir(parents=True)
    _run([PYTHON, "-m", "venv", str(image.venv)])
    _run([str(image.venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *reqs])
    [site] = list((image.venv / "lib").glob("python3*/site-packages"))
    (site / "minicluster-checkout.pth").write_text(SRC_MOUNT + "\n")
    for name, text in entry_points.items():
        path = image.venv / "bin" / name
        path.write_text(f"#!{image.venv}/bin/python\n{text}")
        path.chmod(0o755)
    _run(["chmod", "-R", "a+rX", str(image.root)])
    (image.root / "ready").touch()


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"building the e2e image: {' '.join(argv[:3])} failed:\n{done.stderr[-3000:]}")
