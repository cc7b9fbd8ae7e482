"""The cluster-DNS stand-in (tests/realnode/dns.py) against a real kube-apiserver 1.20 + controller manager, queried
over real UDP and TCP.  No pods run here (no kubelet), so the Endpoints are written directly, as the Endpoints
controller would for a headless Service with publishNotReadyAddresses."""
from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from tests.operator.k8s_control_plane import ADMIN_TOKEN, Cluster, binaries_or_skip, free_port
from tests.realnode.dns import ClusterDNS, build_table

# The real-node tier's stand-in, tested in that tier's step (`pytest -m realnode`), against the API server alone.
pytestmark = [pytest.mark.realnode, pytest.mark.apiserver, pytest.mark.slow]

NS = "dns-test"
DEMO = f"demo.{NS}.svc.cluster.local"


def api(cluster: Cluster, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(cluster.server + path, method=method, data=data,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                              "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=str(cluster.ca_path))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)


def demo_endpoints(ready_ip: str) -> dict[str, Any]:
    return {"metadata": {"name": "demo", "namespace": NS}, "subsets": [{
        "addresses": [{"ip": ready_ip, "hostname": "demo-0"}],
        "notReadyAddresses": [{"ip": "10.244.0.6", "hostname": "demo-1"}, {"ip": "10.244.0.7"},
                              {"ip": "fd00::8", "hostname": "demo-2"}],
        "ports": [{"name": "overlay", "port": 8050}]}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    control_plane = Cluster(tmp_path_factory.mktemp("k8s"), binaries_or_skip())
    control_plane.start()
    api(control_plane, "POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    services = f"/api/v1/namespaces/{NS}/services"
    port = [{"port": 8050}]
    api(control_plane, "POST", services, {"metadata": {"name": "demo"}, "spec": {
        "clusterIP": "None", "publishNotReadyAddresses": True, "ports": port}})
    api(control_plane, "POST", services, {"metadata": {"name": "web"}, "spec": {"ports": port}})
    # Partial objects: an ExternalName Service (no clusterIP), Endpoints with no subsets, an address with no name.
    api(control_plane, "POST", services, {"metadata": {"name": "ext"}, "spec": {
        "type": "ExternalName", "externalName": "example.org"}})
    endpoints = f"/api/v1/namespaces/{NS}/endpoints"
    api(control_plane, "POST", endpoints, {"metadata": {"name": "empty"}})
    api(control_plane, "POST", endpoints, {"metadata": {"name": "bare"}, "subsets": [
        {"addresses": [{"ip": "10.244.0.9"}], "ports": port}]})
    api(control_plane, "POST", endpoints, demo_endpoints("10.244.0.5"))
    api(control_plane, "POST", services, {"metadata": {"name": "big"}, "spec": {"clusterIP": "None", "ports": port}})
    api(control_plane, "POST", endpoints, {"metadata": {"name": "big"}, "subsets": [
        {"addresses": [{"ip": f"10.244.1.{i}"} for i in range(1, 41)], "ports": port}]})
    yield control_plane
    control_plane.stop()


def until(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: last {result!r}")
        time.sleep(0.1)
    return result


@pytest.fixture(scope="module")
def dns(cluster: Cluster) -> Iterator[ClusterDNS]:
    server = ClusterDNS(cluster.server, cluster.ca_path, ADMIN_TOKEN, "127.0.0.1", free_port())
    server.start()
    until(lambda: server.lookup(f"demo-0.{DEMO}"))
    yield server
    server.stop()


def ask(server: ClusterDNS, name: str, qtype: str = "A", tcp: bool = False) -> DNSRecord:
    query = DNSRecord.question(name, qtype)
    reply = DNSRecord.parse(query.send(server.address, server.port, tcp=tcp, timeout=5))
    assert reply.header.id == query.header.id
    return reply


def addresses(reply: DNSRecord) -> list[str]:
    assert reply.header.rcode == RCODE.NOERROR, RCODE.get(reply.header.rcode)
    return sorted(str(rr.rdata) for rr in reply.rr)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_pods_and_services_resolve(cluster: Cluster, dns: ClusterDNS, tcp: bool) -> None:
    assert addresses(ask(dns, f"demo-0.{DEMO}", tcp=tcp)) == ["10.244.0.5"]
    assert addresses(ask(dns, f"demo-1.{DEMO}", tcp=tcp)) == ["10.244.0.6"]  # not ready: published all the same
    assert addresses(ask(dns, f"demo-2.{DEMO}", "AAAA", tcp=tcp)) == ["fd00::8"]
    # The headless Service: every address, the nameless one too; the IPv6 one only under AAAA.
    assert addresses(ask(dns, DEMO, tcp=tcp)) == ["10.244.0.5", "10.244.0.6", "10.244.0.7"]
    web = api(cluster, "GET", f"/api/v1/namespaces/{NS}/services/web")["spec"]["clusterIP"]
    kubernetes = api(cluster, "GET", "/api/v1/namespaces/default/services/kubernetes")["spec"]["clusterIP"]
    assert addresses(ask(dns, f"web.{NS}.svc.cluster.local", tcp=tcp)) == [web]
    assert addresses(ask(dns, "kubernetes.default.svc.cluster.local", tcp=tcp)) == [kubernetes]
    reply = ask(dns, f"demo-0.{DEMO}", tcp=tcp)
    assert reply.header.aa and all(0 < rr.ttl <= 5 for rr in reply.rr)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_other_cluster_names_fail_at_once(dns: ClusterDNS, tcp: bool) -> None:
    for name in ("x.y.svc.cluster.local", f"demo-1.{DEMO}.{NS}.svc.cluster.local",  # ndots:5 search forms
                 f"demo-1.{DEMO}.svc.cluster.local", f"demo-9.{DEMO}", f"ext.{NS}.svc.cluster.local"):
        reply = ask(dns, name, tcp=tcp)
        assert reply.header.rcode == RCODE.NXDOMAIN, name
        assert reply.header.aa and not reply.rr and reply.auth[0].rtype == QTYPE.SOA, name
    # A name that exists without a record of the type asked: NOERROR and no answer, so the resolver stops there.
    for name, qtype in ((f"demo-0.{DEMO}", "AAAA"), (f"demo-2.{DEMO}", "A"), (f"demo-0.{DEMO}", "SRV"),
                        (f"{NS}.svc.cluster.local", "A"), ("cluster.local", "A")):
        assert addresses(ask(dns, name, qtype, tcp=tcp)) == [], (name, qtype)


def test_an_answer_too_long_for_udp_is_truncated_and_whole_over_tcp(dns: ClusterDNS) -> None:
    name = f"big.{NS}.svc.cluster.local"
    until(lambda: dns.lookup(name))
    truncated = ask(dns, name)
    assert truncated.header.tc and not truncated.rr  # 40 A records do not fit in 512 bytes
    assert addresses(ask(dns, name, tcp=True)) == sorted(f"10.244.1.{i}" for i in range(1, 41))


def test_names_match_in_any_case_with_or_without_the_final_dot(dns: ClusterDNS) -> None:
    reply = ask(dns, f"DEMO-0.Demo.{NS.upper()}.svc.Cluster.Local.")
    assert addresses(reply) == ["10.244.0.5"]
    assert str(reply.rr[0].rname) == f"DEMO-0.Demo.{NS.upper()}.svc.Cluster.Local."  # the question's spelling
    assert dns.lookup(f"demo-0.{DEMO}") == dns.lookup(f"Demo-0.{DEMO}.") == ["10.244.0.5"]
    assert dns.lookup(f"nope.{DEMO}") is None


def test_a_new_endpoint_address_is_served_and_a_removed_name_goes(cluster: Cluster, dns: ClusterDNS) -> None:
    path = f"/api/v1/namespaces/{NS}/endpoints/demo"
    try:
        api(cluster, "PUT", path, demo_endpoints("10.244.0.55"))
        until(lambda: addresses(ask(dns, f"demo-0.{DEMO}")) == ["10.244.0.55"])
        api(cluster, "DELETE", path)
        until(lambda: ask(dns, f"demo-0.{DEMO}").header.rcode == RCODE.NXDOMAIN)
    finally:
        api(cluster, "POST", f"/api/v1/namespaces/{NS}/endpoints", demo_endpoints("10.244.0.5"))
        until(lambda: dns.lookup(f"demo-0.{DEMO}") == ["10.244.0.5"])


def test_malformed_objects_are_skipped() -> None:
    services = [None, 5, {"metadata": None}, {"metadata": {"name": "a"}, "spec": {}}, {"spec": "x"},
                {"metadata": {"name": "b", "namespace": "n"}, "spec": {"clusterIP": "bogus"}},
                {"metadata": {"name": "c", "namespace": "n"}, "spec": {"clusterIPs": ["10.96.0.9", 7]}}]
    endpoints = [{"metadata": {"name": "h", "namespace": "n"}, "subsets": [
        None, {"addresses": "x"}, {"notReadyAddresses": [None, {"ip": "nope", "hostname": "p"},
                                                         {"ip": "10.244.0.3", "hostname": 3},
                                                         {"ip": "10.244.0.4", "hostname": "q"}]}]},
                 {"metadata": {"name": "h"}, "subsets": [{"addresses": [{"ip": "10.0.0.1", "hostname": "r"}]}]}]
    table = build_table(services, endpoints, "cluster.local")
    assert {name: sorted(map(str, ips)) for name, ips in table.items() if ips} == {
        "c.n.svc.cluster.local": ["10.96.0.9"], "q.h.n.svc.cluster.local": ["10.244.0.4"]}


def test_outside_names_are_forwarded_or_fail_at_once(cluster: Cluster, dns: ClusterDNS) -> None:
    """A second server with another domain forwards cluster.local to the first; one whose upstream is a closed
    port answers SERVFAIL."""
    for upstream, expected in (((dns.address, dns.port), RCODE.NOERROR), (("127.0.0.1", free_port()), RCODE.SERVFAIL)):
        other = ClusterDNS(cluster.server, cluster.ca_path, ADMIN_TOKEN, "127.0.0.1", 0, domain="example.test",
                           upstream=upstream)
        other.start()
        try:
            for tcp in (False, True):
                reply = ask(other, f"demo-1.{DEMO}", tcp=tcp)
                assert reply.header.rcode == expected, (upstream, tcp)
                assert [str(rr.rdata) for rr in reply.rr] == (["10.244.0.6"] if expected == RCODE.NOERROR else [])
        finally:
            other.stop()


def test_no_table_yet_is_servfail_and_stop_releases_the_port(cluster: Cluster, dns: ClusterDNS) -> None:
    with pytest.raises(RuntimeError, match=re.escape(f"cluster DNS cannot bind 127.0.0.1:{dns.port}")):
        ClusterDNS(cluster.server, cluster.ca_path, ADMIN_TOKEN, "127.0.0.1", dns.port).start()
    port = free_port()
    unreachable = ClusterDNS(f"https://127.0.0.1:{free_port()}", cluster.ca_path, ADMIN_TOKEN, "127.0.0.1", port)
    unreachable.start()
    try:
        for tcp in (False, True):
            assert ask(unreachable, f"demo-0.{DEMO}", tcp=tcp).header.rcode == RCODE.SERVFAIL
    finally:
        unreachable.stop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", port))  # no SO_REUSEADDR: any socket left on the port would refuse this
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp_socket:
        tcp_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAIT, not a listener
        tcp_socket.bind(("127.0.0.1", port))
        tcp_socket.listen()
