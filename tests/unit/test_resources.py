"""Resource discovery: override and property specs, real and faked hardware."""
import os
import socket

import msgpack
import pytest

from worker import resources
from worker.resources import (NodeResources, discover, discover_cpu_limit, discover_gpu_sockets, discover_gpus,
                              discover_memory_mb, discover_numa_memory, discover_sockets,
                              parse_override, parse_properties, split_memory)

MiB = 1024 * 1024


def test_override_full_spec_splits_cores_over_sockets():
    r = discover("cores=8,gpus=4,memory=8192,sockets=2")
    assert r.sockets == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert r.cores == tuple(range(8))
    assert r.gpus == (0, 1, 2, 3)
    assert r.memory_mb == 8192


def test_override_subset_keeps_the_rest_discovered(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = discover(" memory = 100 ")
    assert r.memory_mb == 100
    assert r.cores == tuple(sorted(os.sched_getaffinity(0)))
    assert discover("cores=3").sockets == {0: (0, 1, 2)}


def test_override_sockets_alone_regroups_real_cores():
    real = tuple(sorted(os.sched_getaffinity(0)))
    if len(real) % 2:
        pytest.skip("needs an even number of usable cores")
    r = discover("sockets=2")
    assert r.cores == real
    assert len(r.sockets) == 2


@pytest.mark.parametrize("spec, message", [
    ("cores=x", "non-negative integer"),
    ("cores=-1", "non-negative integer"),
    ("cores", "non-negative integer"),
    ("cpus=4", "unknown key 'cpus'"),
    ("cores=4,cores=5", "given twice"),
    ("cores=0", "at least 1"),
    ("memory=0", "at least 1"),
    ("cores=3,sockets=2", "do not split evenly"),
])
def test_bad_override_is_a_clear_value_error(spec, message):
    with pytest.raises(ValueError, match=message):
        discover(spec)


def test_parse_override_empty_and_gpus_zero():
    assert parse_override("") == {}
    assert parse_override("gpus=0") == {"gpus": 0}


def test_discover_reports_affinity_cores_and_host():
    r = discover()
    assert r.cores == tuple(sorted(os.sched_getaffinity(0)))
    assert r.hostname == socket.gethostname()
    assert r.memory_mb > 0


def test_discover_takes_gpus_from_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert discover().gpus == (3, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert discover().gpus == ()


@pytest.mark.parametrize("value, gpus", [
    ("0,2", (0, 2)),
    (" 1 , 0 ", (1, 0)),
    ("", ()),
    ("GPU-5c4a1b7e-aaaa,GPU-0f3e2d1c-bbbb", (0, 1)),
    ("MIG-1234", (0,)),
    ("1,-1,2", (1,)),  # CUDA stops at the first invalid index
])
def test_cuda_visible_devices_parsing(value, gpus):
    assert discover_gpus(value) == gpus


def test_cuda_visible_devices_duplicate_rejected():
    with pytest.raises(ValueError, match="listed twice"):
        discover_gpus("0,0")


def test_gpus_from_dev_nodes(tmp_path):
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert discover_gpus(None, dev_glob=str(tmp_path / "nvidia*")) == (0, 3)
    assert discover_gpus(None, dev_glob=str(tmp_path / "none*")) == ()


def test_sockets_from_sysfs_topology(tmp_path):
    for cpu, pkg in ((0, "0"), (1, "1"), (2, "1"), (5, "-1")):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(pkg + "\n")
    # cpu4 has no topology at all: counted as socket 0
    assert discover_sockets({0, 1, 2, 4, 5}, sys_cpu=str(tmp_path)) == {0: (0, 4, 5), 1: (1, 2)}


def _meminfo(tmp_path, mib):
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       {mib * 1024} kB\nMemFree:        1 kB\n")
    return str(p)


def test_memory_v2_takes_tightest_limit_up_the_tree(tmp_path):
    fs = tmp_path / "cg"
    leaf = fs / "kubepods" / "pod1"
    leaf.mkdir(parents=True)
    (fs / "cgroup.controllers").write_text("memory\n")
    (leaf / "memory.max").write_text("max\n")
    (fs / "kubepods" / "memory.max").write_text(f"{512 * MiB}\n")
    cg = tmp_path / "self_cgroup"
    cg.write_text("0::/kubepods/pod1\n")
    assert discover_memory_mb(_meminfo(tmp_path, 4096), str(cg), str(fs)) == 512


def test_memory_v1_unlimited_falls_back_to_memtotal(tmp_path):
    fs = tmp_path / "cg"
    (fs / "memory").mkdir(parents=True)
    (fs / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    cg = tmp_path / "self_cgroup"
    cg.write_text("4:memory:/not/mounted/here\n1:cpu:/\n0::/\n")
    assert discover_memory_mb(_meminfo(tmp_path, 4096), str(cg), str(fs)) == 4096
    (fs / "memory" / "memory.limit_in_bytes").write_text(f"{300 * MiB}\n")
    assert discover_memory_mb(_meminfo(tmp_path, 4096), str(cg), str(fs)) == 300


def test_memory_without_cgroups(tmp_path):
    missing = str(tmp_path / "nope")
    assert discover_memory_mb(_meminfo(tmp_path, 2048), missing, missing) == 2048


def test_properties_parsing():
    assert parse_properties("zone=a,gpu=h100,spot") == {"zone": "a", "gpu": "h100", "spot": ""}
    assert parse_properties(" rack = r1 , topology.k8s.io/zone=eu-1a ") == {
        "rack": "r1", "topology.k8s.io/zone": "eu-1a"}
    assert parse_properties("") == {}
    assert discover("cores=1", "spot").properties == {"spot": ""}


@pytest.mark.parametrize("spec", ["a=b=c", "a,,b", ",", "=x", "a,a", "bad key=1", "1x=2",
                                  "k=has space"])
def test_bad_properties_rejected(spec):
    with pytest.raises(ValueError, match="properties"):
        parse_properties(spec)


def test_wire_round_trip_through_msgpack():
    r = discover("cores=4,sockets=2,gpus=1,memory=64", "zone=a")
    wire = msgpack.unpackb(msgpack.packb(r.to_wire()))  # default strict_map_key
    assert NodeResources.from_wire(wire) == r


def test_from_wire_rejects_garbage():
    with pytest.raises(ValueError, match="malformed"):
        NodeResources.from_wire({"hostname": "x"})


def test_override_places_gpus_and_memory_evenly_over_sockets():
    r = discover("cores=8,gpus=3,memory=1001,sockets=2")
    assert r.gpu_sockets == {0: (0, 1), 1: (2,)} and r.memory_sockets == {0: 501, 1: 500}
    assert discover("cores=2,gpus=0").gpu_sockets == {}


def _fake_gpu(root, pci, minor, cpus):
    info = root / "proc" / pci
    info.mkdir(parents=True)
    (info / "information").write_text(f"Model: Fake\nIRQ: 1\nDevice Minor: {minor}\n")
    dev = root / "pci" / pci.lower()
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text(cpus + "\n")


def test_gpu_sockets_from_the_driver_and_pci_local_cpus(tmp_path):
    sockets = {0: (0, 1), 1: (2, 3)}
    _fake_gpu(tmp_path, "0000:3B:00.0", 0, "2-3")
    _fake_gpu(tmp_path, "0000:86:00.0", 1, "0,1")
    found = discover_gpu_sockets((0, 1), sockets, proc_nvidia=str(tmp_path / "proc"),
                                 sys_pci=str(tmp_path / "pci"), sys_cpu=str(tmp_path))
    assert found == {1: (0,), 0: (1,)}
    # a GPU the driver does not place: unknown (the broker deals them out evenly)
    assert discover_gpu_sockets((0, 1, 2), sockets, proc_nvidia=str(tmp_path / "proc"),
                                sys_pci=str(tmp_path / "pci"), sys_cpu=str(tmp_path)) == {}


def test_numa_memory_per_socket_and_the_cgroup_share(tmp_path):
    for node, cpus, kb in ((0, "0-1", 4 << 20), (1, "2-3", 12 << 20), (2, "", 1 << 20)):
        d = tmp_path / f"node{node}"
        d.mkdir()
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {node} MemTotal:       {kb} kB\nNode {node} MemFree: 1 kB\n")
    weights = discover_numa_memory({0: (0, 1), 1: (2, 3)}, sys_node=str(tmp_path), sys_cpu=str(tmp_path))
    assert weights == {0: 4 << 20, 1: 12 << 20}  # the CPU-less node is nobody's socket
    assert split_memory(1000, weights) == {0: 250, 1: 750}
    assert split_memory(1001, {0: 1, 1: 1}) == {0: 501, 1: 500} and split_memory(5, {}) == {}


def _cgroup_v2(tmp_path, **files_by_dir):
    fs = tmp_path / "cg"
    (fs / "kubepods" / "pod1").mkdir(parents=True)
    (fs / "cgroup.controllers").write_text("cpu memory\n")
    for rel, text in files_by_dir.items():
        (fs / rel.replace("__", "/")).write_text(text)
    cg = tmp_path / "self_cgroup"
    cg.write_text("0::/kubepods/pod1\n")
    return str(cg), str(fs)


@pytest.mark.parametrize("files, cores", [
    ({}, None),
    ({"kubepods__pod1__cpu.max": "max 100000\n"}, None),
    ({"kubepods__pod1__cpu.max": "200000 100000\n"}, 2),
    # The tightest quota up the tree wins, rounded down, never below one core.
    ({"kubepods__pod1__cpu.max": "400000 100000\n", "kubepods__cpu.max": "350000 100000\n"}, 3),
    ({"kubepods__pod1__cpu.max": "50000 100000\n"}, 1),
    ({"kubepods__pod1__cpu.max": "garbage\n"}, None),
])
def test_cpu_limit_from_cgroup_v2_cpu_max(tmp_path, files, cores):
    assert discover_cpu_limit(*_cgroup_v2(tmp_path, **files)) == cores


def test_cpu_limit_from_cgroup_v1_cfs_quota(tmp_path):
    fs = tmp_path / "cg"
    leaf = fs / "cpu" / "kubepods" / "pod1"
    leaf.mkdir(parents=True)
    cg = tmp_path / "self_cgroup"
    cg.write_text("5:cpu,cpuacct:/kubepods/pod1\n4:memory:/kubepods/pod1\n")
    (leaf / "cpu.cfs_quota_us").write_text("-1\n")
    (leaf / "cpu.cfs_period_us").write_text("100000\n")
    assert discover_cpu_limit(str(cg), str(fs)) is None
    (leaf / "cpu.cfs_quota_us").write_text("150000\n")
    assert discover_cpu_limit(str(cg), str(fs)) == 1
    (leaf / "cpu.cfs_quota_us").write_text("600000\n")
    assert discover_cpu_limit(str(cg), str(fs)) == 6


def test_discover_advertises_the_cpu_quota_unpinned(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(resources, "discover_cpu_limit", lambda: 2)
    found = discover()
    assert len(found.cores) == 2 and found.pinned is False
    monkeypatch.setattr(resources, "discover_cpu_limit", lambda: None)
    found = discover()
    assert len(found.cores) == 64 and found.pinned is True
