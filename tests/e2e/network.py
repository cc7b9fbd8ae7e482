"""The pod network of the emulated node: one bridge, one network namespace per pod behind a veth pair.

The bridge carries an IPv4 /24 and an IPv6 /64 (unique to the test run); each pod gets an address of one family
only, so an IPv6-only namespace is exactly that: its pods have no IPv4 address but loopback, and their DNS names
(hosts entries) resolve to IPv6 only.  A "dual" pod (the operator's namespace) has one of each, IPv4 first.
The host side of the bridge is how the API server reaches pod IPs (its pod proxy), as a node's IP does, and its
IPv4 address is where the API server listens, for the pods.  Every name carries the run id: other test runs
share this machine.
"""
from __future__ import annotations

import ipaddress
import subprocess
import threading
from dataclasses import dataclass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class PodNet:
    netns: str
    address: str
    family: str
    addresses: tuple[str, ...] = ()  # every address, the primary `address` first

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


class Bridge:
    def __init__(self, run_id: str, seed: int) -> None:
        self.run_id = run_id
        self.name = f"mceb{run_id}"
        # 10.64.0.0/10 is rarely routed anywhere; the seed picks one /24 in it, the ULA /64 likewise.
        self.v4 = ipaddress.ip_network(f"10.{64 + seed % 64}.{(seed >> 6) % 256}.0/24")
        self.v6 = ipaddress.ip_network(f"fd{seed % 256:02x}:{(seed >> 8) % 65536:04x}:{run_id[:4]}::/64")
        self._next = 2
        self._lock = threading.Lock()
        self.pods: list[str] = []

    def gateway(self, family: str) -> str:
        return str(next((self.v4 if family == "ipv4" else self.v6).hosts()))

    def up(self) -> None:
        routes = ip("route", "show").stdout
        if str(self.v4) in routes:
            raise RuntimeError(f"{self.v4} is already routed here; rerun to pick another subnet")
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.gateway('ipv4')}/24", "dev", self.name)
        ip("-6", "addr", "add", f"{self.gateway('ipv6')}/64", "dev", self.name, "nodad")
        ip("link", "set", self.name, "up")

    def down(self) -> None:
        for netns in list(self.pods):
            ip("netns", "del", netns, check=False)
        ip("link", "del", self.name, check=False)

    def attach(self, family: str) -> PodNet:
        with self._lock:
            n = self._next
            self._next += 1
        netns = f"mce-{self.run_id}-{n}"
        host, peer = f"mce{self.run_id}h{n}", f"mce{self.run_id}p{n}"
        families = ("ipv4", "ipv6") if family == "dual" else (family,)
        addresses = tuple(str((self.v4 if f == "ipv4" else self.v6).network_address + n) for f in families)
        ip("netns", "add", netns)
        self.pods.append(netns)
        ip("link", "add", host, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", netns)
        ip("link", "set", host, "master", self.name, "up")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "link", "set", peer, "name", "eth0")
        for f, address in zip(families, addresses, strict=True):
            if f == "ipv4":
                ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            else:
                ip("-n", netns, "-6", "addr", "add", f"{address}/64", "dev", "eth0", "nodad")
        ip("-n", netns, "link", "set", "eth0", "up")
        return PodNet(netns, addresses[0], family, addresses)

    def detach(self, pod: PodNet) -> None:
        ip("netns", "del", pod.netns, check=False)
        if pod.netns in self.pods:
            self.pods.remove(pod.netns)
