"""`mc boot` in an image it knows nothing about (issue 26), through real brokers and workers as processes.

The image names the uid, maybe one with no passwd entry and no HOME it can write (containerd then gives HOME=/):
the ranks still start, and the image's programs get a HOME they can write.  Where the runtime cannot keep its
state it says so in one line and exits CANNOT_START, which the operator's pod failure policy fails at once.
The image's programs get an environment with nothing of the runtime's view in it.
"""
from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from minicluster import exitcodes, runtime
from minicluster.testing import LocalCluster


def _unnamed_uid() -> int:
    """A uid with no passwd entry, as a distroless image's USER 54321 is."""
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


UID = _unnamed_uid()
# The ranks as the image's uid.  The host's python lives under /root (mode 0700): reading and searching it is all
# the ambient CAP_DAC_READ_SEARCH grants; every write is checked as the uid's own.
AS_IMAGE_USER = ("setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=+dac_read_search",
                 "--ambient-caps=+dac_read_search")


def _boot(cluster: LocalCluster, rank: int, env: dict[str, str], command: Sequence[str] = (),
          wrapper: Sequence[str] = ()) -> subprocess.Popen[str]:
    argv = [*wrapper, *runtime.python_argv(), "-m", "minicluster", "boot", "--config", cluster.config_path,
            "--rank", str(rank)]
    if command:
        argv += ["--", *command]
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_all(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    try:
        return [(proc.wait(60), proc.stderr.read() if proc.stderr else "") for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stderr:
                proc.stderr.close()


def _chown_tree(top: Path, uid: int) -> None:
    for root, dirs, files in os.walk(top):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, uid, uid)


@pytest.mark.slow
@pytest.mark.needs("setpriv", root=True)
def test_a_uid_without_passwd_entry_or_writable_home_runs_the_batch_command_and_its_tasks(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=2)
    _chown_tree(tmp_path, UID)
    seen = tmp_path / "seen"
    env = {"PATH": os.environ["PATH"], "HOME": "/", "MC_URI": cluster.uri}
    # The batch command and a task on each rank write into HOME, which the image's uid could not do at /.
    task = 'id -u > "$HOME/rank-$MC_TASK_RANK" && echo "$HOME" >> ' + str(seen)
    command = [*runtime.python_argv(), "-m", "minicluster", "run", "-N", "2", "-n", "2", "sh", "-c", task]
    procs = [_boot(cluster, 0, env, command, AS_IMAGE_USER), _boot(cluster, 1, env, wrapper=AS_IMAGE_USER)]
    (status0, err0), (status1, err1) = _wait_all(procs)
    assert (status0, status1) == (0, 0), err0 + err1
    home = tmp_path / "state" / "home"
    assert f"HOME / is no directory uid {UID} can write: the image's programs get HOME={home}" in err0
    assert seen.read_text().split() == [str(home)] * 2
    assert [(home / f"rank-{r}").read_text() for r in (0, 1)] == [f"{UID}\n"] * 2


@pytest.mark.slow
@pytest.mark.needs("setpriv", root=True)
def test_a_state_dir_the_uid_cannot_write_is_said_in_one_line_with_exit_cannot_start(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=1)  # root's, mode 0755: a read-only place for the uid
    env = {"PATH": os.environ["PATH"], "HOME": "/", "MC_URI": cluster.uri}
    [(status, err)] = _wait_all([_boot(cluster, 0, env, ["true"], AS_IMAGE_USER)])
    assert status == exitcodes.CANNOT_START
    assert err.splitlines() == [f"{exitcodes.CANNOT_START_MESSAGE}uid {UID} cannot write the state dir "
                                f"{tmp_path / 'state'} (Permission denied)"]


@pytest.mark.slow
@pytest.mark.needs("setpriv", "unshare", "mount", root=True)
def test_a_read_only_root_filesystem_leaves_the_state_dir_for_home_and_tmp(tmp_path: Path) -> None:
    # readOnlyRootFilesystem: only the pod's volumes are writable, here the state dir (bind-mounted onto itself,
    # so it stays writable when the root is remounted read-only in this private mount namespace).
    cluster = LocalCluster(tmp_path / "state", size=1)
    _chown_tree(tmp_path, UID)
    seen = tmp_path / "seen"
    env = {"PATH": os.environ["PATH"], "HOME": "/", "MC_URI": cluster.uri}
    # /tmp too where it is a mount of its own (a tmpfs, or the minimal-Debian root's bind mount): not a mount point,
    # it is on the root and already read-only, and the remount fails harmlessly.
    read_only = (f"mount --bind {tmp_path} {tmp_path} && mount -o remount,bind,ro / "
                 f"&& {{ mount -o remount,bind,ro /tmp 2>/dev/null || true; }} && exec \"$@\"")
    wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", read_only, "sh", *AS_IMAGE_USER)
    command = ["sh", "-c", f'touch "$HOME/x" && mktemp > {seen}']
    [(status, err)] = _wait_all([_boot(cluster, 0, env, command, wrapper)])
    assert status == 0, err
    assert Path(seen.read_text().strip()).parent == tmp_path / "state" / "tmp"
    assert f"TMPDIR /tmp is no directory uid {UID} can write" in err


def test_the_batch_command_gets_nothing_of_the_runtimes_view(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", size=1)
    view = runtime.RUNTIME_ROOT
    env = {**os.environ, "MC_URI": cluster.uri, "PMIX_PKGLIBDIR": f"{view}/lib/pmix/lib/pmix",
           "LD_LIBRARY_PATH": f"{view}/lib:/opt/app/lib", "PYTHONPATH": f"{view}/python/lib"}
    out = tmp_path / "env"
    [(status, err)] = _wait_all([_boot(cluster, 0, env, ["sh", "-c", f"env > {out}"])])
    assert status == 0, err
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert seen["LD_LIBRARY_PATH"] == "/opt/app/lib"
    assert "PMIX_PKGLIBDIR" not in seen and "PYTHONPATH" not in seen
    assert not any(view in value for value in seen.values())  # not in the view: no bin/ on PATH either
