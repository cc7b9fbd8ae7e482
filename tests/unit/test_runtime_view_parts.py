"""The injected runtime's parts that need no root and no patchelf: mkview's requirement markers and scripts, and
`mc runtime install`'s copy (tests/integration/test_runtime_view.py runs the built tree in foreign roots)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from minicluster.cli.runtime import copy_view

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mkview() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkview", REPO / "images/runtime/mkview.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("marker", "holds"), [
    ('extra == "test"', False),  # no extra is ever installed into the view
    ('implementation_name == "pypy"', False),
    ('python_version < "3.9"', False),
    ('python_version > "3.9"', True),  # compared as versions: as strings "3.11" < "3.9"
    (f'python_full_version == "{sys.version.split()[0]}"', True),
    ('sys_platform == "linux" and (python_version < "3.8" or os_name == "posix")', True),
    ("platform_machine in 'x86_64 aarch64'", os.uname().machine in ("x86_64", "aarch64")),
    ('os_name not in "nt"', True),
])
def test_requirement_markers(mkview: ModuleType, marker: str, holds: bool) -> None:
    assert mkview._marker_holds(marker) is holds


def test_a_marker_it_cannot_read_is_an_error(mkview: ModuleType) -> None:
    with pytest.raises(mkview.ViewError, match="cannot evaluate"):
        mkview._marker_holds('python_version < "3.9"; __import__("os")')


def test_scripts_are_the_projects_commands(mkview: ModuleType) -> None:
    made = mkview.scripts(REPO)
    assert set(made) == {"mc", "kubectl-mc", "mc-submit"}
    assert made["mc"] == "import sys\nfrom minicluster.cli.main import main\nsys.exit(main())\n"
    assert "from minicluster.cli.submit import main" in made["mc-submit"]
    assert not made["mc-submit"].startswith("#!")  # the view writes its own interpreter line


def test_a_non_empty_destination_is_refused(mkview: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "left").write_text("")
    with pytest.raises(mkview.ViewError, match="is not empty"):
        mkview.build(tmp_path, "/mnt/minicluster", REPO)


def test_install_copies_open_to_all_and_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    root = tmp_path / "view"
    (root / "bin").mkdir(parents=True, mode=0o700)
    (root / "bin/mc").write_text("#!/x\n")
    (root / "bin/mc").chmod(0o700)
    (root / "manifest.json").write_text("{}")
    (root / "manifest.json").chmod(0o600)
    (root / "bin/link").symlink_to("mc")
    old = os.umask(0o077)  # a strict umask: the modes come from install, not from it
    try:
        assert copy_view(root, tmp_path / "copy") == (2, 7)
    finally:
        os.umask(old)
    copied = tmp_path / "copy"
    assert (copied / "bin").stat().st_mode & 0o777 == 0o755
    assert (copied / "bin/mc").stat().st_mode & 0o777 == 0o755
    assert (copied / "manifest.json").stat().st_mode & 0o777 == 0o644
    assert os.readlink(copied / "bin/link") == "mc"
    with pytest.raises(OSError, match="is not empty"):
        copy_view(root, copied)
