"""A container's start, as a runtime's shim does it: new mount, UTS, IPC and PID namespaces (inside the pod's
network namespace); the first child is PID 1 there: it mounts the root filesystem and the volumes, replays the
image's own setup, takes the user and execs the container's command, which stays PID 1.  This process waits and
exits with the container's status (128 + n when signal n ended it, as runtimes report).  Standard library only.

    nsenter --net=NETNS python3 podinit.py SPEC.json
    nsenter -t PID1 -m -u -i -n -p python3 podinit.py --exec SPEC.json ARGV...   # kubectl exec

Both run this host's Python: nothing of the image (no shell, no setpriv, no env) is needed to start or enter it.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x4000000, 0x8000000, 0x20000000
START_ERROR = 128  # what a container runtime reports for a container that could not start
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    def enc(v: str | None) -> bytes | None:
        return v.encode() if v is not None else None

    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} ({fstype}): {os.strerror(err)}")


def bind(source: str, target: str, read_only: bool = False, recursive: bool = False) -> None:
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def root_filesystem(spec: dict) -> str:
    """The image read-only below (the host's / for the project's images, an application image's own root
    directory), a private tmpfs above; then the Dockerfile's own steps, if the image has any to replay."""
    scratch, rootfs = spec["scratch"], spec["rootfs"]
    mount("tmpfs", scratch, "tmpfs", 0, "mode=0755")
    os.mkdir(f"{scratch}/upper")
    os.mkdir(f"{scratch}/work")
    mount("overlay", rootfs, "overlay", 0, f"lowerdir={spec['lower']},upperdir={scratch}/upper,workdir={scratch}/work")
    setup = spec["image"]
    for name in ("passwd", "group"):
        if setup[name]:
            with open(f"{rootfs}/etc/{name}", "a") as f:
                f.write(setup[name] + "\n")
    for path, uid, gid, mode in setup["dirs"]:
        os.makedirs(f"{rootfs}{path}", exist_ok=True)
        os.chown(f"{rootfs}{path}", uid, gid)
        os.chmod(f"{rootfs}{path}", mode)
    for source, target in setup.get("binds", []):  # content the image carries in a directory of its own
        os.makedirs(f"{rootfs}{target}", exist_ok=True)
        bind(source, f"{rootfs}{target}", read_only=True)
    return rootfs


def system_mounts(rootfs: str, spec: dict) -> None:
    for name in ("proc", "sys", "tmp", "run", "dev"):  # a runtime makes them in an image that lacks them
        os.makedirs(f"{rootfs}/{name}", exist_ok=True)
    mount("proc", f"{rootfs}/proc", "proc", MS_NOSUID | MS_NODEV)
    bind("/sys", f"{rootfs}/sys", recursive=True)
    if not spec["read_only_root"]:  # writable either way; with a read-only root they are its read-only dirs
        mount("tmpfs", f"{rootfs}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
        mount("tmpfs", f"{rootfs}/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    mount("tmpfs", f"{rootfs}/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for dev in DEVICES:
        Path(f"{rootfs}/dev/{dev}").touch()
        bind(f"/dev/{dev}", f"{rootfs}/dev/{dev}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{rootfs}/dev/{name}")
    os.mkdir(f"{rootfs}/dev/shm")
    mount("shm", f"{rootfs}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    if spec["checkout"]:  # the project's images run the checkout under test; an application image has none
        os.makedirs(f"{rootfs}{spec['checkout_at']}", exist_ok=True)
        bind(spec["checkout"], f"{rootfs}{spec['checkout_at']}", read_only=True)


def in_root(rootfs: str, path: str, hops: int = 40) -> str:
    """`path` inside the container, as a host path under `rootfs`: symlinks resolved with `rootfs` as / (what
    runtimes do with securejoin), so /var/run -> /run stays in the image instead of reaching the host's /run."""
    done = ""
    parts = [p for p in path.split("/") if p]
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = os.path.dirname(done)
            continue
        candidate = f"{done}/{part}"
        if os.path.islink(f"{rootfs}{candidate}"):
            if hops == 0:
                raise OSError(f"too many symlinks under {path}")
            hops -= 1
            link = os.readlink(f"{rootfs}{candidate}")
            parts = [p for p in link.split("/") if p] + parts
            done = "" if link.startswith("/") else done
            continue
        done = candidate
    return f"{rootfs}{done}"


def volume_mounts(rootfs: str, mounts: list[dict]) -> None:
    for m in mounts:
        target = in_root(rootfs, m["target"])
        if m.get("file"):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            Path(target).touch()
        else:
            os.makedirs(target, exist_ok=True)
        if m["kind"] == "tmpfs":
            size = f",size={m['size']}" if m.get("size") else ""
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0777{size}")
            if m.get("fs_group") is not None:
                os.chown(target, 0, m["fs_group"])
                os.chmod(target, 0o2777)
        else:
            bind(m["source"], target, read_only=m.get("read_only", False))


def become(user: dict, no_new_privs: bool, drop_caps: bool) -> None:
    if drop_caps:
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups(user["groups"])
    os.setgid(user["gid"])
    os.setuid(user["uid"])
    if no_new_privs and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")


def container(spec: dict) -> None:
    """PID 1 of the pod's PID namespace: set up, then become the container's command."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the shim's end is the container's
        for cgroup in spec["cgroups"]:
            Path(cgroup, "cgroup.procs").write_text("0")
        rootfs = root_filesystem(spec)
        system_mounts(rootfs, spec)
        volume_mounts(rootfs, spec["mounts"])
        os.makedirs(f"{rootfs}{spec['cwd']}", exist_ok=True)  # the runtime makes the working directory
        if spec["read_only_root"]:  # readOnlyRootFilesystem: the root mount only; volumes, /dev, /proc stay
            mount(None, rootfs, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        name = spec["hostname"].encode()
        if libc.sethostname(name, len(name)) != 0:
            raise OSError(ctypes.get_errno(), "sethostname")
        os.chroot(rootfs)
        os.chdir(spec["cwd"])
        become(spec["user"], spec["no_new_privs"], spec["drop_caps"])
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as exc:
        print(f"container start failed: {exc}", file=sys.stderr, flush=True)
    os._exit(START_ERROR)


def enter(path: str, argv: list[str]) -> None:
    """`kubectl exec`, run inside the container's namespaces: its root, working directory, user and
    environment, then the command."""
    spec = json.loads(Path(path).read_text())
    try:
        os.chroot(spec["rootfs"])
        os.chdir(spec["cwd"])
        become(spec["user"], spec["no_new_privs"], spec["drop_caps"])
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as exc:
        print(f"exec failed: {exc}", file=sys.stderr, flush=True)
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    if libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID) != 0:
        print(f"unshare: {os.strerror(ctypes.get_errno())}", file=sys.stderr, flush=True)
        os._exit(START_ERROR)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid == 0:
        container(spec)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    if sys.argv[1] == "--exec":
        enter(sys.argv[2], sys.argv[3:])
    main(sys.argv[1])
