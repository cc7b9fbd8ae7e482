"""mc runtime: the injected runtime's own commands (docs/operator.md#the-injected-runtime).

`install DEST` copies the view at RUNTIME_ROOT to DEST: the init container's command, run by the view's own python,
so that a runtime image needs nothing else (no cp, no shell).  `info` prints the view's manifest.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from minicluster.cli.argparser import Parser
from minicluster.runtime import RUNTIME_ROOT

HELP = f"the injected runtime at {RUNTIME_ROOT}: install DEST (copy it there) | info (print its manifest)"


def main(argv: list[str]) -> int:
    parser = Parser(prog="mc runtime", description=HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    install = sub.add_parser("install", help=f"copy {RUNTIME_ROOT} to DEST (new or empty), readable by any uid")
    install.add_argument("dest", metavar="DEST")
    sub.add_parser("info", help=f"print {RUNTIME_ROOT}/manifest.json")
    args = parser.parse_args(argv)
    root = Path(RUNTIME_ROOT)
    manifest = _manifest(root)
    if args.command == "info":
        print(json.dumps(manifest, indent=2))
        return 0
    started = time.monotonic()
    files, size = copy_view(root, Path(args.dest))
    print(f"mc runtime install: {files} files, {size / 1e6:.1f} MB from {root} to {args.dest} "
          f"in {time.monotonic() - started:.1f} s")
    return 0


def _manifest(root: Path) -> dict:
    try:
        manifest: dict = json.loads((root / "manifest.json").read_text())
    except FileNotFoundError:
        raise OSError(f"no runtime at {root} (its manifest.json is missing)") from None
    return manifest


def copy_view(root: Path, dest: Path) -> tuple[int, int]:
    """Copy the tree at `root` into `dest`, which must be new or empty; directories and executables open to all,
    other files readable by all.  Returns the number of files and their bytes."""
    if dest.is_dir() and any(dest.iterdir()):
        raise OSError(f"{dest} is not empty: install into a new or empty directory")
    dest.mkdir(parents=True, exist_ok=True)
    files = size = 0
    for top, dirs, names in os.walk(root):
        target = dest / os.path.relpath(top, root)
        for name in dirs:
            (target / name).mkdir(mode=0o755)
            os.chmod(target / name, 0o755)  # whatever this process's umask
        for name in names:
            source = os.path.join(top, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target / name)
                continue
            shutil.copyfile(source, target / name)
            executable = os.stat(source).st_mode & 0o111
            os.chmod(target / name, 0o755 if executable else 0o644)
            files += 1
            size += os.path.getsize(target / name)
    return files, size
