"""Where ranks listen (issue 10 item 9, and IPv6): the overlay ROUTERs and the status server bind the address the
config names, not every interface; `listen = "*"` (what pods use) binds all of them, IPv6 included; and ranks
whose endpoints are IPv6 join (ZMQ_IPV6)."""
from __future__ import annotations

import ipaddress
import json
import socket
import urllib.request
from pathlib import Path

from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for


def listening(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on `port`, from /proc/net/tcp{,6}."""
    found = set()
    for table, _width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            # With ZMQ_IPV6 an IPv4 address is bound as its v4-mapped IPv6 form: the same single address.
            found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ranks_listen_only_where_their_endpoints_say(tmp_path) -> None:
    status_port = free_port()
    with LocalCluster(tmp_path, size=2, fanout=1, transport="tcp", status_port=status_port) as cluster:
        for rank in (0, 1):  # rank 1 is interior with fanout 1 (max_size 2): it binds a ROUTER too
            assert listening(cluster.config.port_base + rank) == {"127.0.0.1"}
        assert listening(status_port) == {"127.0.0.1"}


def test_listen_star_binds_every_interface_and_family(tmp_path) -> None:
    status_port = free_port()
    with LocalCluster(tmp_path, size=2, fanout=1, transport="tcp", status_port=status_port, listen="*") as cluster:
        assert listening(cluster.config.port_base) == {"::"}  # one dual-stack socket
        assert listening(status_port) >= {"::"}
        with cluster.client() as c:
            assert wait_for(c, c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none")))["status"] == 0


def test_ipv6_only_endpoints_join_and_serve_status(tmp_path) -> None:
    status_port = free_port()
    with LocalCluster(tmp_path, size=2, fanout=1, transport="tcp", status_port=status_port,
                      endpoint="tcp://[::1]:{port}") as cluster:
        with cluster.client() as c:
            assert wait_for(c, c.submit(job(["true"], nnodes=2, ntasks=2, mpi="none")))["status"] == 0
        assert listening(cluster.config.port_base) == {"::1"} and listening(status_port) == {"::1"}
        with urllib.request.urlopen(f"http://[::1]:{status_port}/status", timeout=5) as reply:
            assert json.load(reply)["ready"] is True
