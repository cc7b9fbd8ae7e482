"""A guest of a root instance never acts with root's privileges (issue 10, item 1; issue 24, item 1): nothing on
the guest's PATH runs as root, the guest's output files and working directory are opened as the guest, and no
process with root's ids ever runs with the job's environment: libraries the guest plants through LD_PRELOAD,
LD_AUDIT, GCONV_PATH and LD_LIBRARY_PATH, built here with the C compiler, load only into the guest's own task,
whether a helper or the loop spawns it. The guest is a real second uid (a forked child of the root test)."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from minicluster.client import Client
from minicluster.testing import LocalCluster
from worker.asuser import acting_as
from worker.helpers import LARGEST_ORDER
from tests.host import need
from tests.integration.conftest import job, output_of, wait_for
from tests.integration.test_access import GUEST, NOGROUP, as_user, shared  # noqa: F401 (fixture)

pytestmark = pytest.mark.needs(root=True)  # switching uids


@pytest.fixture
def rootdir() -> Iterator[Path]:
    """A directory only root may write in, with a file only root may write."""
    with tempfile.TemporaryDirectory(prefix="mc-rootonly-") as d:
        os.chmod(d, 0o755)
        (Path(d) / "root.log").write_text("root's\n")
        os.chmod(Path(d) / "root.log", 0o644)
        yield Path(d)


@pytest.fixture
def guestdir() -> Iterator[Path]:
    """A directory the guest owns."""
    with tempfile.TemporaryDirectory(prefix="mc-guest-") as d:
        os.chown(d, GUEST, NOGROUP)
        os.chmod(d, 0o755)
        yield Path(d)


def guest_submit(uri: str, spec: dict) -> int:
    answer = as_user(GUEST, NOGROUP, lambda: Client(uri).submit(spec))
    assert "ok" in answer, answer
    return answer["ok"]


@pytest.mark.smoke
def test_a_setpriv_planted_on_the_guests_path_is_not_run(shared, guestdir: Path) -> None:  # noqa: F811
    planted = guestdir / "setpriv"
    marker = guestdir / "ran-as"
    planted.write_text(f"#!/bin/sh\nid -u > {marker}\nshift 4\nexec \"$@\"\n")
    os.chmod(planted, 0o755)
    os.chown(planted, GUEST, NOGROUP)
    spec = job(["id", "-u"], env={"PATH": f"{guestdir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    job_id = guest_submit(shared.uri, spec)
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 0
        assert output_of(owner, job_id)[0].strip() == str(GUEST).encode()
    assert not marker.exists()


def test_guest_cannot_create_or_append_to_roots_files(shared, rootdir: Path) -> None:  # noqa: F811
    created = guest_submit(shared.uri, job(["echo", "planted"], output=str(rootdir / "new-{id}.log")))
    appended = guest_submit(shared.uri, job(["echo", "planted"], output=str(rootdir / "root.log")))
    with shared.client() as owner:
        for job_id in (created, appended):
            assert wait_for(owner, job_id)["status"] == 126
            (task,) = owner.task_results(job_id)
            assert "Permission denied" in task[6]
    assert not list(rootdir.glob("new-*"))
    assert (rootdir / "root.log").read_text() == "root's\n"


def test_guest_output_file_is_the_guests(shared, guestdir: Path) -> None:  # noqa: F811
    job_id = guest_submit(shared.uri, job(["id", "-u"], output=str(guestdir / "{id}.out")))
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 0
    out = guestdir / f"{job_id}.out"
    assert out.read_text().strip() == str(GUEST)
    assert (out.stat().st_uid, out.stat().st_gid) == (GUEST, NOGROUP)


def test_guest_cannot_work_in_a_directory_closed_to_it(shared, rootdir: Path) -> None:  # noqa: F811
    closed = rootdir / "closed"
    closed.mkdir(mode=0o700)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    (closed / "inside").mkdir()
    job_id = guest_submit(shared.uri, job(["pwd"], cwd=str(closed)))
    inside = guest_submit(shared.uri, job(["pwd"], cwd=str(closed / "inside")))
    absent = guest_submit(shared.uri, job(["pwd"], cwd=str(closed / "absent")))
    with shared.client() as owner:
        assert wait_for(owner, job_id)["status"] == 126
        (task,) = owner.task_results(job_id)
        assert task[6].startswith("cwd") and "Permission denied" in task[6]
        # What is inside a directory the guest may not search, and what is not, look alike to the guest.
        errors = []
        for probe in (inside, absent):
            assert wait_for(owner, probe)["status"] == 126
            errors.append(owner.task_results(probe)[0][6].split(": ", 1)[1])
        assert errors[0] == errors[1]


def fs_ids() -> tuple[str, str]:
    """This thread's file-system uid and gid (the fourth of the Uid: and Gid: lines)."""
    lines = dict(line.split(":", 1) for line in Path("/proc/thread-self/status").read_text().splitlines())
    return lines["Uid"].split()[3], lines["Gid"].split()[3]


def test_acting_as_checks_opens_as_the_user_and_gives_the_ids_back(rootdir: Path) -> None:
    with acting_as(GUEST, NOGROUP):
        assert fs_ids() == (str(GUEST), str(NOGROUP))
        with pytest.raises(PermissionError):
            os.open(rootdir / "root.log", os.O_WRONLY | os.O_APPEND)
    assert fs_ids() == ("0", "0")
    os.close(os.open(rootdir / "root.log", os.O_WRONLY | os.O_APPEND))


# --- the job's environment never reaches a process with root's privileges (issue 24, item 1) -------------------

# Each library records, in its own file, the real and effective uid of every process that loads it.
RECORDER = r'''
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static void record(const char *kind) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d", RECORD_DIR, kind, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dprintf(fd, "%d %d\n", (int)getuid(), (int)geteuid());
        close(fd);
    }
}
__attribute__((constructor)) static void loaded(void) { record(KIND); }
'''
AUDIT = "unsigned int la_version(unsigned int version) { record(\"audit-la_version\"); return version; }\n"
GCONV = ("int gconv_init(void *step) { return 1; }\n"  # __GCONV_NOCONV: the conversion is refused, after the load
         "int gconv(void *step) { return 1; }\nvoid gconv_end(void *step) {}\n")
GCONV_MODULES = "module INTERNAL MCPROBE// mcprobe 1\nmodule MCPROBE// INTERNAL mcprobe 1\n"
PROBE_MAIN = "void mcprobe_linked(void);\nint main(void) { mcprobe_linked(); return 0; }\n"
# A library setpriv (util-linux), which root used to run with the job's environment, loads.
LIBCAP_NG = "/lib/x86_64-linux-gnu/libcap-ng.so.0"


def build(cc: str, out: Path, source: str, kind: str, records: Path, *flags: str) -> None:
    src = out.with_suffix(".c")
    src.write_text(RECORDER + source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src), f'-DRECORD_DIR="{records}"',
                    f'-DKIND="{kind}"', *flags], check=True, timeout=60, capture_output=True)


def stubs_of(library: str) -> str:
    """Empty functions named as every function `library` exports: a stand-in the loader accepts for it."""
    listing = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True,
                             timeout=30).stdout
    names = {line.split()[2] for line in listing.splitlines() if len(line.split()) == 3 and line.split()[1] == "T"}
    return "".join(f"int {name}(void) {{ return 0; }}\n" for name in sorted(names))


@pytest.fixture(scope="module")
def planted() -> Iterator[tuple[Path, dict[str, str]]]:
    """The guest's own libraries, built here, and the environment that makes every process of its job load them:
    LD_PRELOAD, LD_AUDIT, GCONV_PATH, and on LD_LIBRARY_PATH a library the task's program links and a stand-in
    for one setpriv links.  Yields the directory their records go to, and that environment."""
    need("cc")  # builds the preload libraries
    cc = shutil.which("cc")
    assert cc is not None
    with tempfile.TemporaryDirectory(prefix="mc-planted-") as d:
        top = Path(d)
        os.chmod(top, 0o755)
        records, libs = top / "records", top / "libs"
        records.mkdir()
        libs.mkdir()
        os.chown(records, GUEST, NOGROUP)
        build(cc, libs / "preload.so", "", "preload", records)
        build(cc, libs / "audit.so", AUDIT, "audit", records)
        build(cc, libs / "mcprobe.so", GCONV, "gconv", records)
        (libs / "gconv-modules").write_text(GCONV_MODULES)
        build(cc, libs / "libmcprobe.so", "void mcprobe_linked(void) {}\n", "library-path", records)
        (libs / "probe.c").write_text(PROBE_MAIN)
        subprocess.run([cc, "-o", str(libs / "probe"), str(libs / "probe.c"), f"-L{libs}", "-lmcprobe"], check=True,
                       timeout=60, capture_output=True)
        if os.path.exists(LIBCAP_NG) and shutil.which("nm"):
            build(cc, libs / "libcap-ng.so.0", stubs_of(LIBCAP_NG), "library-path-setpriv", records,
                  "-Wl,-soname,libcap-ng.so.0")
        for path in (libs, *libs.iterdir()):
            os.chmod(path, 0o755)
        env = {"PATH": f"{libs}:/usr/sbin:/usr/bin:/sbin:/bin", "LD_PRELOAD": str(libs / "preload.so"),
               "LD_AUDIT": str(libs / "audit.so"), "GCONV_PATH": str(libs), "LD_LIBRARY_PATH": str(libs)}
        yield records, env


@pytest.fixture(scope="module")
def with_helpers() -> Iterator[LocalCluster]:
    state = tempfile.mkdtemp(prefix="mc-guest-helpers-")
    os.chmod(state, 0o711)
    cluster = LocalCluster(state, size=1, access_group="nogroup", spawn_helpers=1).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(state, ignore_errors=True)


def loads(records: Path) -> dict[str, set[tuple[int, int]]]:
    """kind -> the (uid, euid) of each process that loaded that library."""
    seen: dict[str, set[tuple[int, int]]] = {}
    for path in records.iterdir():
        uid, euid = map(int, path.read_text().split())
        seen.setdefault(path.name.rsplit(".", 1)[0], set()).add((uid, euid))
    return seen


# The guest's task: the program that links the probe library, a conversion through the planted gconv module,
# the dynamic loader's variables as the task sees them, its ids and its signal state.
TASK = ("probe; iconv -f MCPROBE -t UTF-8 </dev/null 2>/dev/null; echo \"$LD_PRELOAD|$LD_AUDIT|$LD_LIBRARY_PATH\";"
        " id -u; id -G; grep -E '^Sig(Blk|Ign)' /proc/self/status; tr '\\0' ' ' </proc/$PPID/cmdline")


# How a guest's task is spawned: by the helper a worker without helpers starts for it, by a configured helper, and
# on the worker's loop, where an order too large for a helper's channel goes (worker/helpers.py, LARGEST_ORDER).
ROUTES = {"helper-for-guests": ("shared", {}), "configured-helper": ("with_helpers", {}),
          "loop": ("shared", {f"LARGE{i}": "x" * (LARGEST_ORDER // 2) for i in range(3)})}


@pytest.mark.parametrize("route", ROUTES)
def test_a_guests_environment_never_runs_code_as_root(request: pytest.FixtureRequest, route: str,
                                                     planted: tuple[Path, dict[str, str]]) -> None:
    fixture, extra = ROUTES[route]
    cluster: LocalCluster = request.getfixturevalue(fixture)
    records, env = planted
    for stale in records.iterdir():
        stale.unlink()
    job_id = guest_submit(cluster.uri, job(["sh", "-c", TASK], env={**env, **extra}))
    with cluster.client() as owner:
        status = wait_for(owner, job_id)["status"]
        results = owner.task_results(job_id)
        out = output_of(owner, job_id).get(0, b"").decode().splitlines()
    seen = loads(records)
    as_root = {kind: ids for kind, ids in seen.items() if any(0 in pair for pair in ids)}
    assert not as_root, f"the guest's libraries ran with root's ids: {as_root}"
    assert status == 0, [row[6] for row in results]
    # The guest's own task loaded every one of them, as the guest, and sees its variables as it set them.
    assert {"preload", "audit", "audit-la_version", "gconv", "library-path"} <= set(seen), seen
    assert all(ids == {(GUEST, GUEST)} for ids in seen.values()), seen
    assert out[0] == f"{env['LD_PRELOAD']}|{env['LD_AUDIT']}|{env['LD_LIBRARY_PATH']}"
    # Its uid, and its gid with the groups NSS gives the uid: none, for it has no passwd entry (a user with one is
    # test_a_guests_task_has_the_users_groups's); every signal at its
    # default and none blocked, as the worker's posix_spawn gives its own tasks (glibc's posix_spawn, and so a
    # spawn helper, ignores its two internal signals, 32 and 33, which no valid_signals() names).
    assert out[1:3] == [str(GUEST), str(NOGROUP)]
    masks = dict(line.split(":\t") for line in out[3:5])
    valid = sum(1 << (sig - 1) for sig in signal.valid_signals())
    assert (int(masks["SigBlk"], 16), int(masks["SigIgn"], 16) & valid) == (0, 0), masks
    assert ("worker.spawnhelper" in out[5]) == (route != "loop"), out[5]  # the route taken: the task's parent


@pytest.mark.parametrize("route", ROUTES)
def test_a_guests_mpi_task_gets_its_pmi_socket(request: pytest.FixtureRequest, route: str) -> None:
    """The fds a guest's task is passed reach it at the numbers its environment names (PMI_FD), whichever way it
    is spawned (a helper receives them at other numbers)."""
    fixture, extra = ROUTES[route]
    cluster: LocalCluster = request.getfixturevalue(fixture)
    init = 'echo "cmd=init pmi_version=1 pmi_subversion=1" >&$PMI_FD; read -r reply <&$PMI_FD; echo "$reply"'
    job_id = guest_submit(cluster.uri, job(["bash", "-c", init], mpi="pmi1", env={"PATH": "/usr/bin:/bin", **extra}))
    with cluster.client() as owner:
        assert wait_for(owner, job_id)["status"] == 0, [row[6] for row in owner.task_results(job_id)]
        assert output_of(owner, job_id)[0].startswith(b"cmd=response_to_init"), output_of(owner, job_id)


@pytest.mark.parametrize("route", ROUTES)
def test_a_guests_command_is_looked_up_and_refused_as_the_guest(request: pytest.FixtureRequest, route: str,
                                                                guestdir: Path) -> None:
    """What a guest cannot run ends with 127 or 126 and the reason, as the owner's tasks do: looked up on the
    task's PATH by the guest's own process, so a program only root may execute is refused."""
    fixture, extra = ROUTES[route]
    cluster: LocalCluster = request.getfixturevalue(fixture)
    roots = guestdir / "roots-only"
    roots.write_text("#!/bin/sh\necho ran\n")
    os.chmod(roots, 0o744)  # root may execute it, the guest may only read it
    env = {"PATH": f"{guestdir}:/usr/bin:/bin", **extra}
    jobs = {guest_submit(cluster.uri, job([argv0], env=env)): expected for argv0, expected in [
        ("no-such-command-xyz", (127, "no-such-command-xyz: command not found")),
        ("roots-only", (126, "roots-only: permission denied")),
        (str(roots), (126, f"{roots}: permission denied"))]}
    with cluster.client() as owner:
        for job_id, expected in jobs.items():
            assert wait_for(owner, job_id)["status"] == expected[0]
            (task,) = owner.task_results(job_id)
            assert task[6] == expected[1]


@pytest.fixture
def member() -> Iterator[tuple[int, int]]:
    """A real user (useradd) with a group of its own and, as a supplementary group, the instance's access group:
    its (uid, gid).  Removed after the test."""
    need("useradd", "userdel", "groupdel")
    name = f"mc-member-{os.getpid()}"
    subprocess.run(["useradd", "-M", "-U", "-G", "nogroup", "-s", "/usr/sbin/nologin", name], check=True,
                   timeout=30, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], timeout=30, capture_output=True)
        subprocess.run(["groupdel", name], timeout=30, capture_output=True)  # where userdel left it


# Connects to the instance's socket (MC_URI), as a job that submits jobs does first, then prints its groups.
CONNECT = ("perl -MIO::Socket::UNIX -e '(my $p = $ENV{MC_URI}) =~ s{^unix://}{};"
           " IO::Socket::UNIX->new(Peer => $p) or die \"connect: $!\\n\"; print \"connected\\n\"' && id -G"
           " && touch made-by-task")


@pytest.mark.parametrize("route", ROUTES)
def test_a_guests_task_has_the_users_groups(request: pytest.FixtureRequest, route: str, member: tuple[int, int],
                                            rootdir: Path) -> None:
    """A guest's task gets the supplementary groups NSS gives its user, as Slurm and Flux give a job (initgroups):
    a member of the access group reaches the instance's socket from its task (a job that submits jobs), and a
    directory shared with a group it is in is open to its cwd, its output file and its task."""
    fixture, extra = ROUTES[route]
    cluster: LocalCluster = request.getfixturevalue(fixture)
    uid, gid = member
    project = rootdir / "project"
    project.mkdir()
    os.chown(project, 0, NOGROUP)
    os.chmod(project, 0o770)
    spec = job(["sh", "-c", CONNECT], cwd=str(project), output=str(project / "{id}.out"),
               env={"PATH": "/usr/bin:/bin", **extra})
    answer = as_user(uid, gid, lambda: Client(cluster.uri).submit(spec), groups=[NOGROUP])
    assert "ok" in answer, answer
    with cluster.client() as owner:
        status = wait_for(owner, answer["ok"])["status"]
        (task,) = owner.task_results(answer["ok"])
    assert status == 0, task[6] or (project / f"{answer['ok']}.out").read_text()
    out = (project / f"{answer['ok']}.out").read_text().splitlines()
    assert out[0] == "connected"
    assert sorted(map(int, out[1].split())) == sorted({gid, NOGROUP})
    assert (project / "made-by-task").stat().st_uid == uid
