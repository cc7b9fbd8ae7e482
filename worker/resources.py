"""Resource discovery for one worker node.

The worker reports a `NodeResources` to the broker when it joins, and the
scheduler hands out exactly these core and GPU ids to tasks.  What is
discovered is what this process may actually use (its CPU affinity mask, its
cgroup memory limit, the GPUs it can see), not what the host has, plus where
it sits: the socket each GPU hangs off (its PCI device's local CPUs) and the
memory of each socket (its NUMA nodes), from /sys where present.  Tests and
benchmarks replace the hardware with an override spec such as
``cores=64,gpus=4,memory=8192,sockets=2`` (GPUs and memory then split evenly
over the sockets, in id order).
"""
from __future__ import annotations

import glob
import os
import re
import socket
from dataclasses import dataclass, field

SYS_CPU = "/sys/devices/system/cpu"
SYS_NODE = "/sys/devices/system/node"
SYS_PCI = "/sys/bus/pci/devices"
PROC_NVIDIA = "/proc/driver/nvidia/gpus"
CGROUP_FS = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
PROC_MEMINFO = "/proc/meminfo"

_OVERRIDE_KEYS = ("cores", "gpus", "memory", "sockets")
_PROP_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_PROP_VALUE = re.compile(r"[^\s=,]*")
_NVIDIA_DEV = re.compile(r"nvidia(\d+)")


@dataclass(frozen=True)
class NodeResources:
    hostname: str
    sockets: dict[int, tuple[int, ...]]  # socket id -> usable core ids
    gpus: tuple[int, ...]
    memory_mb: int
    properties: dict[str, str] = field(default_factory=dict)
    gpu_sockets: dict[int, tuple[int, ...]] = field(default_factory=dict)  # empty: unknown
    memory_sockets: dict[int, int] = field(default_factory=dict)  # empty: unknown
    # False when the cores stand for a CPU quota's share of a larger mask: tasks are then not bound to core ids
    # (every pod on a node would otherwise crowd onto the same first cores).  Local to the worker, not on the wire.
    pinned: bool = True

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted(c for cs in self.sockets.values() for c in cs))

    def to_wire(self) -> dict:
        # msgpack's unpacker rejects int map keys by default, so sockets
        # travel as [id, cores] pairs.
        return {
            "hostname": self.hostname,
            "sockets": [[s, list(cs)] for s, cs in sorted(self.sockets.items())],
            "gpus": list(self.gpus),
            "memory_mb": self.memory_mb,
            "properties": dict(self.properties),
            "gpu_sockets": [[s, list(gs)] for s, gs in sorted(self.gpu_sockets.items())],
            "memory_sockets": [[s, mb] for s, mb in sorted(self.memory_sockets.items())],
        }

    @classmethod
    def from_wire(cls, d: dict) -> NodeResources:
        try:
            return cls(
                hostname=str(d["hostname"]),
                sockets={int(s): tuple(int(c) for c in cs) for s, cs in d["sockets"]},
                gpus=tuple(int(g) for g in d["gpus"]),
                memory_mb=int(d["memory_mb"]),
                properties={str(k): str(v) for k, v in d.get("properties", {}).items()},
                gpu_sockets={int(s): tuple(int(g) for g in gs) for s, gs in d.get("gpu_sockets", ())},
                memory_sockets={int(s): int(mb) for s, mb in d.get("memory_sockets", ())},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed NodeResources message: {e!r}") from None


def parse_properties(spec: str) -> dict[str, str]:
    """Parse ``"zone=a,gpu=h100,spot"`` into ``{"zone": "a", "gpu": "h100", "spot": ""}``."""
    props: dict[str, str] = {}
    if not spec.strip():
        return props
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"properties {spec!r}: empty item (stray comma?)")
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not _PROP_KEY.fullmatch(key):
            raise ValueError(f"properties {spec!r}: bad property name {key!r}")
        if sep and not _PROP_VALUE.fullmatch(value):
            raise ValueError(f"properties {spec!r}: bad value {value!r} for {key!r}")
        if key in props:
            raise ValueError(f"properties {spec!r}: {key!r} given twice")
        props[key] = value
    return props


def parse_override(spec: str) -> dict[str, int]:
    """Parse ``"cores=64,gpus=4,memory=8192,sockets=2"`` (any subset)."""
    out: dict[str, int] = {}
    if not spec.strip():
        return out
    for item in spec.split(","):
        key, sep, value = (p.strip() for p in item.partition("="))
        if key not in _OVERRIDE_KEYS:
            raise ValueError(
                f"resources override {spec!r}: unknown key {key!r}"
                f" (expected {', '.join(_OVERRIDE_KEYS)})")
        if not sep or not value.isdigit():
            raise ValueError(f"resources override {spec!r}: {key} needs a non-negative integer")
        if key in out:
            raise ValueError(f"resources override {spec!r}: {key} given twice")
        out[key] = int(value)
    for key in ("cores", "sockets", "memory"):
        if out.get(key) == 0:
            raise ValueError(f"resources override {spec!r}: {key} must be at least 1")
    return out


def discover(resources_override: str = "", properties: str = "") -> NodeResources:
    """What this worker process may use, with the override spec taking precedence."""
    override = parse_override(resources_override)
    props = parse_properties(properties)
    pinned = True
    if "cores" in override:
        cores = tuple(range(override["cores"]))
        sockets = _split_sockets(cores, override.get("sockets", 1), resources_override)
    elif "sockets" in override:
        cores = tuple(sorted(os.sched_getaffinity(0)))
        sockets = _split_sockets(cores, override["sockets"], resources_override)
    else:
        mask = sorted(os.sched_getaffinity(0))
        limit = discover_cpu_limit()
        if limit is not None and limit < len(mask):
            # A CPU quota, not a cpuset: any cores may run our tasks, but only this many at a time.
            sockets, pinned = discover_sockets(set(mask[:limit])), False
        else:
            sockets = discover_sockets(set(mask))
    if "gpus" in override:
        gpus = tuple(range(override["gpus"]))
        gpu_sockets = split_evenly(gpus, sorted(sockets))
    else:
        gpus = discover_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
        gpu_sockets = discover_gpu_sockets(gpus, sockets)
    if "memory" in override:
        memory = override["memory"]
        memory_sockets = split_memory(memory, dict.fromkeys(sockets, 1))
    else:
        memory = discover_memory_mb()
        memory_sockets = split_memory(memory, discover_numa_memory(sockets))
    return NodeResources(socket.gethostname(), sockets, gpus, memory, props, gpu_sockets,
                         memory_sockets, pinned)


def split_evenly(gpus: tuple[int, ...], socket_ids: list[int]) -> dict[int, tuple[int, ...]]:
    """Deal GPU ids out over the sockets in order: the first 1/n on the first socket, ..."""
    out: dict[int, list[int]] = {}
    for i, g in enumerate(sorted(gpus)):
        out.setdefault(socket_ids[i * len(socket_ids) // len(gpus)], []).append(g)
    return {s: tuple(gs) for s, gs in out.items()}


def split_memory(total_mb: int, weights: dict[int, int]) -> dict[int, int]:
    """total_mb over the sockets in proportion to weights (NUMA sizes); {} if unknown."""
    whole = sum(weights.values())
    if not weights or whole <= 0:
        return {}
    out = {s: total_mb * w // whole for s, w in sorted(weights.items())}
    first = min(out)
    out[first] += total_mb - sum(out.values())
    return out


def _cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _socket_of_cpus(cpus: list[int], sockets: dict[int, tuple[int, ...]],
                    sys_cpu: str) -> int | None:
    """The socket of the first of cpus that we know (ours, else by physical package)."""
    ours = {c: s for s, cs in sockets.items() for c in cs}
    for cpu in cpus:
        if cpu in ours:
            return ours[cpu]
    for cpu in cpus:
        try:
            with open(f"{sys_cpu}/cpu{cpu}/topology/physical_package_id") as f:
                sock = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if sock in sockets:
            return sock
    return None


def discover_gpu_sockets(gpus: tuple[int, ...], sockets: dict[int, tuple[int, ...]],
                         proc_nvidia: str = PROC_NVIDIA, sys_pci: str = SYS_PCI,
                         sys_cpu: str = SYS_CPU) -> dict[int, tuple[int, ...]]:
    """GPU id -> socket from the NVIDIA driver's minor numbers and the PCI devices' local CPUs.

    Only when every GPU is placed; otherwise {} (the broker then deals them out evenly).
    """
    if not gpus:
        return {}
    placed: dict[int, int] = {}
    for info in glob.glob(f"{proc_nvidia}/*/information"):
        pci = os.path.basename(os.path.dirname(info)).lower()
        try:
            with open(info) as f:
                minor = next((int(line.split(":", 1)[1]) for line in f
                              if line.startswith("Device Minor:")), None)
            with open(f"{sys_pci}/{pci}/local_cpulist") as f:
                cpus = _cpulist(f.read())
        except (OSError, ValueError):
            continue
        sock = _socket_of_cpus(cpus, sockets, sys_cpu)
        if minor in gpus and sock is not None:
            placed[minor] = sock
    if set(placed) != set(gpus):
        return {}
    out: dict[int, list[int]] = {}
    for g in sorted(gpus):
        out.setdefault(placed[g], []).append(g)
    return {s: tuple(gs) for s, gs in out.items()}


def discover_numa_memory(sockets: dict[int, tuple[int, ...]], sys_node: str = SYS_NODE,
                         sys_cpu: str = SYS_CPU) -> dict[int, int]:
    """Memory (kB) of the NUMA nodes of each socket; {} when /sys has no NUMA nodes for them."""
    out: dict[int, int] = {}
    for path in glob.glob(f"{sys_node}/node[0-9]*"):
        try:
            with open(f"{path}/cpulist") as f:
                cpus = _cpulist(f.read())
            with open(f"{path}/meminfo") as f:
                kb = next(int(line.split()[3]) for line in f if "MemTotal:" in line)
        except (OSError, ValueError, StopIteration, IndexError):
            continue
        sock = _socket_of_cpus(cpus, sockets, sys_cpu)
        if sock is not None:
            out[sock] = out.get(sock, 0) + kb
    return out


def _split_sockets(cores: tuple[int, ...], n: int, spec: str) -> dict[int, tuple[int, ...]]:
    if len(cores) % n:
        raise ValueError(f"resources override {spec!r}: {len(cores)} cores do not split"
                         f" evenly over {n} sockets")
    per = len(cores) // n
    return {s: cores[s * per:(s + 1) * per] for s in range(n)}


def discover_sockets(cores: set[int], sys_cpu: str = SYS_CPU) -> dict[int, tuple[int, ...]]:
    """Group the given core ids by physical package; unknown topology counts as socket 0."""
    by_socket: dict[int, list[int]] = {}
    for core in sorted(cores):
        path = f"{sys_cpu}/cpu{core}/topology/physical_package_id"
        try:
            with open(path) as f:
                sock = int(f.read().strip())
        except (OSError, ValueError):
            sock = 0
        # Some virtual machines report -1 for every core.
        by_socket.setdefault(max(sock, 0), []).append(core)
    return {s: tuple(cs) for s, cs in sorted(by_socket.items())}


def discover_gpus(cuda_visible: str | None, dev_glob: str = "/dev/nvidia*") -> tuple[int, ...]:
    """GPU indices from CUDA_VISIBLE_DEVICES if set, else from /dev/nvidiaN."""
    if cuda_visible is None:
        found = (_NVIDIA_DEV.fullmatch(os.path.basename(p)) for p in glob.glob(dev_glob))
        return tuple(sorted(int(m.group(1)) for m in found if m))
    items = [s.strip() for s in cuda_visible.split(",") if s.strip()]
    if not all(re.fullmatch(r"-?\d+", s) for s in items):
        # UUIDs (GPU-..., MIG-...) name devices we cannot map to /dev ids;
        # CUDA numbers them in list order, so do the same.
        return tuple(range(len(items)))
    gpus: list[int] = []
    for s in items:
        if int(s) < 0:
            break  # CUDA ignores everything from the first invalid index on
        if int(s) in gpus:
            raise ValueError(f"CUDA_VISIBLE_DEVICES={cuda_visible!r}: GPU {s} listed twice")
        gpus.append(int(s))
    return tuple(gpus)


def discover_memory_mb(meminfo: str = PROC_MEMINFO, proc_cgroup: str = PROC_CGROUP,
                       cgroup_fs: str = CGROUP_FS) -> int:
    """MemTotal, lowered to the tightest cgroup (v2 or v1) memory limit on our path."""
    total = _meminfo_total_bytes(meminfo)
    v2_dirs, v1_dirs = _cgroup_dirs(proc_cgroup, cgroup_fs, "memory")
    limits = [lim for lim in (*(_read_int(d, "memory.max") for d in v2_dirs),
                              *(_read_int(d, "memory.limit_in_bytes") for d in v1_dirs)) if lim and lim > 0]
    return min([total, *limits]) // (1024 * 1024)


def discover_cpu_limit(proc_cgroup: str = PROC_CGROUP, cgroup_fs: str = CGROUP_FS) -> int | None:
    """Whole cores allowed by the tightest CPU quota on our cgroup path (v2 `cpu.max`, v1 CFS quota), rounded
    down and at least 1; None without a quota.  A pod's `limits.cpu` arrives this way, not as an affinity mask."""
    v2_dirs, v1_dirs = _cgroup_dirs(proc_cgroup, cgroup_fs, "cpu")
    quotas = [q for q in (*(_cpu_max(d) for d in v2_dirs), *(_cfs_quota(d) for d in v1_dirs)) if q is not None]
    return max(1, int(min(quotas) + 1e-9)) if quotas else None


def _meminfo_total_bytes(meminfo: str) -> int:
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo}: no MemTotal line")


def _cgroup_dirs(proc_cgroup: str, cgroup_fs: str, v1_controller: str) -> tuple[list[str], list[str]]:
    """The cgroup directories on our path, ours first then each ancestor: (v2 ones, v1 `v1_controller` ones)."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return [], []
    v2: list[str] = []
    v1: list[str] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2_root = cgroup_fs
            if not os.path.exists(os.path.join(cgroup_fs, "cgroup.controllers")):
                v2_root = os.path.join(cgroup_fs, "unified")  # hybrid hierarchy
            v2 += _up_the_tree(v2_root, path)
        elif v1_controller in controllers.split(","):
            v1 += _up_the_tree(os.path.join(cgroup_fs, v1_controller), path)
    return v2, v1


def _up_the_tree(root: str, path: str) -> list[str]:
    # Ancestors' limits apply too, and inside a container without a cgroup
    # namespace our own path may not exist under the mount at all.
    parts = [p for p in path.split("/") if p]
    return [os.path.join(root, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read(directory: str, filename: str) -> str | None:
    try:
        with open(os.path.join(directory, filename)) as f:
            return f.read().strip()
    except OSError:
        return None


def _read_int(directory: str, filename: str) -> int | None:
    text = _read(directory, filename)
    return int(text) if text and text.lstrip("-").isdigit() else None  # "max" means no limit


def _cpu_max(directory: str) -> float | None:
    fields = (_read(directory, "cpu.max") or "").split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit() or int(fields[1]) == 0:
        return None  # absent, or "max PERIOD": no quota
    return int(fields[0]) / int(fields[1])


def _cfs_quota(directory: str) -> float | None:
    quota = _read_int(directory, "cpu.cfs_quota_us")
    period = _read_int(directory, "cpu.cfs_period_us")
    if quota is None or quota <= 0 or not period:
        return None  # -1: no quota
    return quota / period
