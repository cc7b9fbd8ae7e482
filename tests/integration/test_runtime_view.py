"""The injected runtime (images/runtime/mkview.py; docs/operator.md#the-injected-runtime) runs in roots that share
nothing with the host that built it: a static-only root with no libc at all (busybox-static), a root whose only
libc is musl's, and an older glibc (Debian bullseye, glibc 2.31; the view is built on bookworm's 2.36).

Each run is a chroot in a private mount namespace (the view bind-mounted read-only at RUNTIME_ROOT, /proc mounted),
so every mount ends with the process.  The image's environment is hostile on purpose: LD_LIBRARY_PATH names the
root's libraries, PYTHONPATH and PYTHONHOME point elsewhere, HOME does not exist; the view's python must still load
only the view's libraries and modules, as root and as an unprivileged uid.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from minicluster.runtime import RUNTIME_ROOT
from tests.e2e import appimages
from tests.host import skip_unless_ready

REPO = Path(__file__).resolve().parents[2]
BUSYBOX = Path("/bin/busybox")
MUSL = Path("/lib/x86_64-linux-musl/libc.so")  # Debian's musl: the library is its own loader
NOBODY = 65534
DEBIAN_PYTHON = "/usr/bin/python3.11"
PMIX_HOME = Path("/usr/lib/x86_64-linux-gnu/pmix2")  # what mkview bundles when it is there
HOSTILE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent/home",
               "LD_LIBRARY_PATH": "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib:/usr/lib",
               "PYTHONPATH": "/tmp/not-the-view", "PYTHONHOME": "/usr"}
PYTHON = f"{RUNTIME_ROOT}/python/bin/python3.11"
# What the runtime imports, and what the process has mapped (ELF files and others) outside the view.
PROBE = """
import ctypes, glob, json, msgpack, networkx, os, pwd, socket, sqlite3, ssl, sys, zmq
for lookup in (lambda: pwd.getpwuid(0), lambda: socket.getaddrinfo("localhost", 8050)):  # through the root's NSS
    try:
        lookup()
    except (KeyError, OSError):
        pass
pmix = json.load(open(sys.argv[1] + "/manifest.json")).get("pmix")
if pmix:  # the PMIx server's library and its plugins, as the worker loads them
    version = ctypes.CDLL(f"{sys.argv[1]}/{pmix['library']}").PMIx_Get_version
    version.restype = ctypes.c_char_p
    plugins = glob.glob(f"{sys.argv[1]}/{pmix['prefix']}/lib/pmix/*.so")
    pmix = [version().decode()] + [ctypes.CDLL(p) and p for p in plugins]
mapped = {line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if len(line.split()) == 6}
def elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\\x7fELF"
    except OSError:
        return False
outside = sorted(p for p in mapped if p.startswith("/") and not p.startswith(sys.argv[1] + "/"))
print(json.dumps({"path": sys.path, "curve": zmq.has("curve"), "uid": os.getuid(), "prefix": sys.prefix,
                  "libraries": [p for p in outside if elf(p)], "other_files": outside, "pmix": pmix,
                  "home_exists": os.path.exists(os.environ.get("HOME", "/"))}))
"""

pytestmark = [pytest.mark.slow, pytest.mark.needs("patchelf", "unshare", "chroot", "mount", root=True),
              pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=["venv", "debian"])
def view(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The view of this checkout built once per module by each layout of CPython: this venv's interpreter (an
    upstream layout: pyenv's, or python:3.11-slim's in CI), and Debian's /usr/bin/python3.11 (stdlib in
    /usr/lib/python3.11, its own site.py with dist-packages) given this venv's packages on PYTHONPATH."""
    python, env = sys.executable, dict(os.environ)
    if request.param == "debian":
        python = DEBIAN_PYTHON
        if not os.path.exists(f"/usr/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site.py"):
            skip_unless_ready(f"needs Debian's python3.{sys.version_info[1]} at {DEBIAN_PYTHON}")
        env["PYTHONPATH"] = next(p for p in sys.path if p.endswith("-packages"))
    dest = tmp_path_factory.mktemp("runtime") / "view"
    subprocess.run([python, str(REPO / "images/runtime/mkview.py"), "--dest", str(dest), "--source", str(REPO)],
                   check=True, timeout=240, capture_output=True, env=env)
    return dest


def is_static(path: Path) -> bool:
    """Whether an x86_64 ELF executable has no program interpreter (PT_INTERP), i.e. needs no libc."""
    data = path.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def static_root(path: Path, musl: bool = False) -> Path:
    """A root with busybox-static as its only program (and, with `musl`, musl's loader as its only library)."""
    if not BUSYBOX.exists() or not is_static(BUSYBOX.resolve()):
        skip_unless_ready("needs Debian's busybox-static at /bin/busybox (apt-get install busybox-static)")
    if musl and not MUSL.exists():
        skip_unless_ready(f"needs Debian's musl at {MUSL} (apt-get install musl)")
    for name in ("bin", "proc", "tmp", "lib", os.path.dirname(RUNTIME_ROOT).lstrip("/")):
        (path / name).mkdir(parents=True, exist_ok=True)
    shutil.copy(BUSYBOX.resolve(), path / "bin/busybox")
    (path / "bin/sh").symlink_to("busybox")
    if musl:
        shutil.copy(MUSL, path / "lib/ld-musl-x86_64.so.1")
    os.chmod(path / "tmp", 0o1777)
    return path


def bullseye_root() -> Path:
    """Debian bullseye (minbase), shared with the e2e tier's application images and made once (tests/e2e)."""
    if reason := appimages.unavailable("app-old"):
        skip_unless_ready(reason)
    try:
        return appimages.minbase("bullseye")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        skip_unless_ready(f"debootstrap bullseye failed: {str(exc)[-300:]}")
        raise


def run_in(root: Path, view: Path, *argv: str, uid: int = 0) -> subprocess.CompletedProcess[str]:
    """`argv` chrooted in `root` with the view mounted read-only at RUNTIME_ROOT, as `uid` (its own gid, no
    supplementary groups), in the hostile environment; the mounts live in a private namespace that dies with it."""
    parent = root / os.path.dirname(RUNTIME_ROOT).lstrip("/")  # a tmpfs on it: the root itself is never changed
    script = ('mount -t tmpfs -o mode=0755 tmpfs "$2" && mkdir "$2/$3" && mount --bind "$1" "$2/$3" '
              '&& mount -o remount,bind,ro "$2/$3" && mount -t proc proc "$4/proc" '
              '&& root="$4" user="$5" && shift 5 && exec chroot --userspec="$user" --groups="" "$root" "$@"')
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
                           str(view), str(parent), os.path.basename(RUNTIME_ROOT), str(root), f"{uid}:{uid}",
                           *argv],
                          capture_output=True, text=True, env=HOSTILE_ENV, timeout=60, cwd="/")


def probe(root: Path, view: Path, uid: int) -> dict:
    done = run_in(root, view, PYTHON, "-I", "-c", PROBE, RUNTIME_ROOT, uid=uid)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(params=["static", "musl", pytest.param("bullseye", marks=pytest.mark.timeout(1300))])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "bullseye":
        return bullseye_root()
    return static_root(tmp_path / "root", musl=request.param == "musl")


@pytest.mark.parametrize("uid", [0, NOBODY], ids=["root", "nobody"])
def test_view_runs_alone_in_a_foreign_root(root: Path, view: Path, uid: int) -> None:
    version = run_in(root, view, f"{RUNTIME_ROOT}/bin/mc", "--version", uid=uid)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("mc (minicluster) ")
    found = probe(root, view, uid)
    assert found["uid"] == uid and not found["home_exists"]
    assert found["curve"]
    assert found["prefix"] == f"{RUNTIME_ROOT}/python"
    assert found["path"] and all(p.startswith(RUNTIME_ROOT + "/") for p in found["path"]), found["path"]
    assert found["libraries"] == [], found["libraries"]
    if PMIX_HOME.is_dir():  # Debian's libpmix2 on the build host: the view brings it, and it loads here
        assert found["pmix"][0].startswith("OpenPMIx ") and len(found["pmix"]) > 1, found["pmix"]


def test_view_is_complete_and_open_to_all(view: Path) -> None:
    manifest = json.loads((view / "manifest.json").read_text())
    assert manifest["python"].startswith("3.11.") and manifest["glibc"]
    assert manifest["files"] == sum(1 for p in view.rglob("*") if p.is_file())
    scripts = sorted(p.name for p in (view / "bin").iterdir())
    assert "mc" in scripts and "mc-submit" in scripts and not [s for s in scripts if s.startswith("python")]
    for name in scripts:
        assert (view / "bin" / name).read_text().startswith(f"#!{PYTHON} -I\n")
    for path in [view, *view.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & 0o444 == 0o444 and (not path.is_dir() or mode & 0o111 == 0o111), path
    assert (view / "lib/ld-linux-x86-64.so.2").is_file() and (view / "lib/libc.so.6").is_file()


def test_runtime_install_copies_the_view_with_its_own_python(view: Path, tmp_path: Path) -> None:
    """`mc runtime install` in a root with no cp and no libc (the init container of a runtime image with nothing
    else), as an unprivileged uid; a second install into the now non-empty directory is refused in one line."""
    root = static_root(tmp_path / "root")
    (root / "copy").mkdir(mode=0o777)
    os.chmod(root / "copy", 0o777)
    done = run_in(root, view, f"{RUNTIME_ROOT}/bin/mc", "runtime", "install", "/copy/view", uid=NOBODY)
    assert done.returncode == 0, done.stderr
    assert "files" in done.stdout and " s\n" in done.stdout
    copied = root / "copy/view"
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*")) == \
        sorted(str(p.relative_to(view)) for p in view.rglob("*"))
    for path in view.rglob("*"):
        twin = copied / path.relative_to(view)
        assert twin.stat().st_mode & 0o777 == path.stat().st_mode & 0o777, path
    again = run_in(root, view, f"{RUNTIME_ROOT}/bin/mc", "runtime", "install", "/copy/view", uid=NOBODY)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == ["mc runtime: error: /copy/view is not empty: install into a new "
                                                  "or empty directory"]
    info = run_in(root, view, f"{RUNTIME_ROOT}/bin/mc", "runtime", "info", uid=NOBODY)
    assert json.loads(info.stdout) == json.loads((view / "manifest.json").read_text())
