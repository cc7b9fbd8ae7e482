"""Application images without minicluster, built here from Debian's archive (no registry): what a user brings.

* `app-mpi`: Debian bookworm minbase with Debian's MPICH (4.0.2) and Open MPI (4.1.4, with its own libpmix2) and a
  C ring program for each (`/usr/local/bin/mpi-ring.mpich`, `mpi-ring.openmpi`), compiled with the host's
  `mpicc.mpich`/`mpicc.openmpi` of the same Debian versions and checked to resolve every library inside the image;
  USER 1000:1000, its own user `app` with a home.
* `app-old`: Debian bullseye minbase (glibc 2.31, older than the runtime's 2.36), nothing added; USER root.
* `app-static`: `FROM scratch` with only Debian's busybox-static (/bin/busybox and its applet links): no libc, no
  loader, no /etc/passwd; USER root.
* `app-nomnt`: app-static with /mnt a plain file, so nothing can be mounted at /mnt/minicluster: an image that
  cannot start the injected runtime (the container runtime's mount fails).

Each is a root filesystem directory cached under CACHE/appimages/NAME-KEY/ (rootfs/, config.json: USER,
ENTRYPOINT, CMD, ENV, WORKDIR as an image config says them), built once under a file lock and keyed by its recipe
(its RECIPES entry, LAYOUT_VERSION, the mirror, the host tools' versions).  Debian minbase roots
are shared with other tiers at CACHE/rootfs/SUITE-minbase (lock SUITE-minbase.lock; complete once debootstrap
removed its /debootstrap directory), and copied, never changed.  Standard library only: .ci/realnode.sh runs
this file to get the roots it commits with buildah.

    python3 tests/e2e/appimages.py NAME...   # build (or find) them; prints {name: {image, root, key, config}}
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("MC_E2E_CACHE", "/var/cache/minicluster"))
LAYOUT_VERSION = 1  # bump when a build step below changes what it makes
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The program of examples/05-bring-your-own-image: the test builds what the example tells users to build.
RING_C = (Path(__file__).resolve().parents[2] / "examples" / "05-bring-your-own-image" / "ring.c").read_text()


@dataclass(frozen=True)
class AppImage:
    """A built application image: its root and what its config says (the interface of image.Image that the
    emulated node reads)."""
    name: str
    root: Path  # the root filesystem: the container's lower layer
    entrypoint: list[str]
    cmd: list[str]
    user: tuple[int, int]
    workdir: str
    env: dict[str, str]

    checkout = False  # the project's checkout is not in an application image

    @property
    def lower(self) -> str:
        return str(self.root)

    @property
    def setup(self) -> dict[str, Any]:
        """Nothing for the pod's init to replay: the image has its own users and directories."""
        return {"passwd": None, "group": None, "dirs": []}

    @property
    def home(self) -> str:
        """HOME as container runtimes set it: the user's passwd entry, else /."""
        try:
            for line in (self.root / "etc" / "passwd").read_text().splitlines():
                fields = line.split(":")
                if len(fields) > 5 and fields[2] == str(self.user[0]):
                    return fields[5]
        except OSError:
            pass
        return "/"


# --- recipes -------------------------------------------------------------------------------------------------

def _tool_version(package: str) -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return done.stdout.strip()


def _mirror() -> str:
    """The Debian archive this machine's apt uses (its bookworm entry; bullseye is in the same archive)."""
    done = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE) $(ORIGIN)",
                           "Created-By: Packages"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        uri, release, origin = [*line.split(), "", "", ""][:3]
        if release == "bookworm" and origin == "Debian":
            return uri
    raise RuntimeError("no Debian bookworm mirror in /etc/apt/sources.list*")


def reference(name: str) -> str:
    """The image name MiniClusters give for `name`: a registry no one serves (the images are only ever local), a
    tag that is not `latest` (so a real kubelet's default pull policy is IfNotPresent)."""
    return f"minicluster.test/{name}:{LAYOUT_VERSION}"


RECIPES: dict[str, dict[str, Any]] = {
    "app-mpi": {"suite": "bookworm", "include": ["mpich", "openmpi-bin"], "program": RING_C,
                "mpicc": {"mpi-ring.mpich": ["mpicc.mpich", "libmpich-dev"],
                          "mpi-ring.openmpi": ["mpicc.openmpi", "libopenmpi-dev"]},
                "user": "1000:1000", "passwd": "app:x:1000:1000::/home/app:/bin/sh", "group": "app:x:1000:",
                "cmd": ["/usr/local/bin/mpi-ring.openmpi"]},
    "app-old": {"suite": "bullseye", "include": [], "user": "0:0", "cmd": ["/bin/bash"]},
    "app-static": {"busybox": "busybox-static", "user": "0:0", "cmd": ["/bin/sh"]},
    "app-nomnt": {"busybox": "busybox-static", "user": "0:0", "cmd": ["/bin/sh"], "mnt_is_a_file": True},
}


def unavailable(name: str) -> str | None:
    """Why `name` cannot be built here, or None."""
    recipe = RECIPES[name]
    tools = ["apt-get", "dpkg-deb"] if "busybox" in recipe else ["debootstrap", "chroot"]
    tools += [compiler for compiler, _ in recipe.get("mpicc", {}).values()]
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"building {name} needs {', '.join(missing)}"
    if os.geteuid() != 0:
        return f"building {name} needs root (debootstrap, chroot, file owners)"
    return None


def key_of(name: str) -> str:
    recipe = RECIPES[name]
    inputs = [LAYOUT_VERSION, name, recipe]  # the recipe holds the program's source
    if "suite" in recipe:
        inputs.append(_mirror())
    if "busybox" in recipe:
        inputs.append(_tool_version(recipe["busybox"]) or _candidate(recipe["busybox"]))
    inputs += [_tool_version(package) for _, package in recipe.get("mpicc", {}).values()]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def _candidate(package: str) -> str:
    done = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True)
    return next((line.split()[1] for line in done.stdout.splitlines() if "Candidate:" in line), "")


# --- building ------------------------------------------------------------------------------------------------

@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(name: str) -> AppImage:
    """The cached image `name`, built once (debootstrap takes a minute or two) under its lock."""
    directory = CACHE / "appimages" / f"{name}-{key_of(name)}"
    with locked(directory.with_suffix(".lock")):
        if not (directory / "ready").exists():
            shutil.rmtree(directory, ignore_errors=True)
            (directory / "rootfs").mkdir(parents=True)
            config = _build(name, RECIPES[name], directory / "rootfs")
            (directory / "config.json").write_text(json.dumps(config, indent=1))
            (directory / "ready").touch()
    config = json.loads((directory / "config.json").read_text())
    uid, _, gid = config["User"].partition(":")
    return AppImage(name, directory / "rootfs", config["Entrypoint"], config["Cmd"], (int(uid), int(gid or uid)),
                    config["WorkingDir"], dict(e.split("=", 1) for e in config["Env"]))


def _build(name: str, recipe: dict[str, Any], root: Path) -> dict[str, Any]:
    if "busybox" in recipe:
        _busybox_root(recipe["busybox"], root, recipe.get("mnt_is_a_file", False))
    elif recipe["include"]:
        _debootstrap(recipe["suite"], recipe["include"], root)
    else:
        base = minbase(recipe["suite"])
        _run(["cp", "-a", "--reflink=auto", f"{base}/.", str(root)])
    if "passwd" in recipe:
        _add_user(root, recipe["passwd"], recipe["group"])
    for program, (compiler, _) in recipe.get("mpicc", {}).items():
        _compile_mpi(recipe["program"], compiler, root / "usr/local/bin" / program)
    return {"User": recipe["user"], "Entrypoint": [], "Cmd": recipe["cmd"], "WorkingDir": "/",
            "Env": [f"PATH={PATH}"]}


def minbase(suite: str) -> Path:
    """The shared Debian minbase root of `suite` (CACHE/rootfs/SUITE-minbase), made once; never changed after."""
    root = CACHE / "rootfs" / f"{suite}-minbase"
    with locked(root.with_name(root.name + ".lock")):
        if not (root / "etc" / "os-release").exists() or (root / "debootstrap").exists():
            shutil.rmtree(root, ignore_errors=True)
            _debootstrap(suite, [], root)
    return root


def _debootstrap(suite: str, include: list[str], root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    argv = ["debootstrap", "--variant=minbase", *([f"--include={','.join(include)}"] if include else []),
            suite, str(root), _mirror()]
    _run(argv, timeout=1200)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (root / junk).glob("*"):
            if path.is_file():
                path.unlink()


def _busybox_root(package: str, root: Path, mnt_is_a_file: bool) -> None:
    """Only /bin/busybox (static) and a link per applet, as `busybox --install` would make them."""
    with tempfile.TemporaryDirectory() as tmp:
        _run(["apt-get", "download", package], cwd=tmp)
        [deb] = Path(tmp).glob("*.deb")
        _run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"])
        (root / "bin").mkdir()
        shutil.copy2(f"{tmp}/x/bin/busybox", root / "bin" / "busybox")
    applets = subprocess.run([str(root / "bin" / "busybox"), "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        link = root / applet
        if applet != "bin/busybox" and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("/bin/busybox")
    for directory, mode in (("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("etc", 0o755)):
        (root / directory).mkdir(exist_ok=True)
        (root / directory).chmod(mode)
    if mnt_is_a_file:
        (root / "mnt").write_text("not a directory: nothing can be mounted under /mnt\n")


def _add_user(root: Path, passwd: str, group: str) -> None:
    with open(root / "etc" / "passwd", "a") as f:
        f.write(passwd + "\n")
    with open(root / "etc" / "group", "a") as f:
        f.write(group + "\n")
    fields = passwd.split(":")
    home = root / fields[5].lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, int(fields[2]), int(fields[3]))


def _compile_mpi(source: str, compiler: str, target: Path) -> None:
    """The ring, compiled with the host's MPI wrapper (the same Debian version as the image's, in the key), then
    checked to resolve every library from the image itself."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ring.c").write_text(source)
        _run([compiler, "-O2", "-o", str(target), f"{tmp}/ring.c"])
    root = target.parents[3]  # ROOT/usr/local/bin/PROGRAM
    linked = _run(["chroot", str(root), "ldd", f"/{target.relative_to(root)}"])
    if "not found" in linked:
        raise RuntimeError(f"{target.name} does not resolve inside the image:\n{linked}")


def _run(argv: list[str], cwd: str | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"building an application image: {' '.join(argv[:4])} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main(names: list[str], report: Callable[[str], None] = print) -> None:
    built = {}
    for name in names:
        image = ensure(name)
        built[name] = {"image": reference(name), "root": str(image.root), "key": image.root.parent.name,
                       "config": json.loads((image.root.parent / "config.json").read_text())}
    report(json.dumps(built))


if __name__ == "__main__":
    main(sys.argv[1:] or list(RECIPES))
