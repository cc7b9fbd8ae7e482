"""A STAND-IN for CoreDNS on the real-node tier (Kubernetes 1.20 from Debian ships no cluster DNS).

Why: ranks dial their parents at HOSTNAME.SUBDOMAIN.NS.svc.DOMAIN, the in-cluster operator logs in at
`kubernetes.default.svc` and reads rank 0's status by name, and the kubelet writes only a pod's own name into its
/etc/hosts.  The kubelet points every pod's resolv.conf at `clusterDNS` with `options ndots:5`, so each lookup
first tries its search-suffixed forms: those must fail at once, or every connect costs seconds.

What it serves, from Services and Endpoints polled off the real API server (a table swapped whole):
- A/AAAA for HOSTNAME.SVC.NS.svc.DOMAIN, for every Endpoints address that carries a hostname, in `addresses[]`
  and `notReadyAddresses[]` alike (ranks resolve each other before any of them is ready);
- A/AAAA for SVC.NS.svc.DOMAIN: the ClusterIP(s), or for a headless Service its ready addresses, plus the
  not-ready ones when it sets publishNotReadyAddresses;
- an authoritative NXDOMAIN for any other name under DOMAIN, NOERROR with no answer for a name that exists but
  has no record of the type asked (AAAA of an IPv4 pod), and SERVFAIL until the first table has loaded;
- every other name is forwarded to the host's resolver (first `nameserver` of /etc/resolv.conf), SERVFAIL if
  that fails within FORWARD_TIMEOUT.
Answers live TTL seconds, so a re-created pod's new address is seen at once.

What it does not serve: SRV, PTR, CNAME (ExternalName Services), pod A records (`a-b-c-d.NS.pod`), wildcards,
or the `hostname`-less pod names CoreDNS derives from the IP.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socket
import socketserver
import ssl
import struct
import threading
import urllib.request
from pathlib import Path
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, SOA, A, DNSError, DNSRecord
from dnslib.server import DNSHandler, DNSLogger

log = logging.getLogger(__name__)

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Table = dict[str, frozenset[IP]]
TTL = 2
FORWARD_TIMEOUT = 2.0
API_TIMEOUT = 2.0
TCP_IDLE_TIMEOUT = 5.0


def _dicts(obj: Any, key: str) -> list[dict[str, Any]]:
    """obj[key] if it is a list, keeping only its objects: partial or odd objects give nothing, not an error."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _ip(text: Any) -> IP | None:
    if not isinstance(text, str):  # ip_address(7) would be 0.0.0.7
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _key(obj: Any) -> tuple[str, str] | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    if isinstance(name, str) and isinstance(namespace, str) and name and namespace:
        return name.lower(), namespace.lower()
    return None


def build_table(services: list[Any], endpoints: list[Any], domain: str) -> Table:
    """Every name the cluster domain holds -> its addresses.  Parents of a name (`NS.svc.DOMAIN`) are in it with no
    address, so that they answer NOERROR: an NXDOMAIN there would deny every name below."""
    table: dict[str, set[IP]] = {}
    headless: dict[tuple[str, str], bool] = {}  # -> publishNotReadyAddresses
    for service in services:
        key, spec = _key(service), service.get("spec") if isinstance(service, dict) else None
        if key is None or not isinstance(spec, dict):
            continue
        cluster_ips = spec.get("clusterIPs") if isinstance(spec.get("clusterIPs"), list) else [spec.get("clusterIP")]
        if "None" in cluster_ips:
            headless[key] = spec.get("publishNotReadyAddresses") is True
            continue
        ips = {ip for ip in map(_ip, cluster_ips) if ip is not None}
        if ips:
            table.setdefault(f"{key[0]}.{key[1]}.svc.{domain}", set()).update(ips)
    for obj in endpoints:
        key = _key(obj)
        if key is None:
            continue
        service_name = f"{key[0]}.{key[1]}.svc.{domain}"
        for subset in _dicts(obj, "subsets"):
            for field in ("addresses", "notReadyAddresses"):
                for address in _dicts(subset, field):
                    ip, hostname = _ip(address.get("ip")), address.get("hostname")
                    if ip is None:
                        continue
                    if isinstance(hostname, str) and hostname:
                        table.setdefault(f"{hostname.lower()}.{service_name}", set()).add(ip)
                    if key in headless and (field == "addresses" or headless[key]):
                        table.setdefault(service_name, set()).add(ip)
    for name in list(table):
        labels = name.split(".")
        for start in range(1, len(labels) - domain.count(".")):
            table.setdefault(".".join(labels[start:]), set())
    return {name: frozenset(ips) for name, ips in table.items()}


def host_resolver(path: Path = Path("/etc/resolv.conf")) -> tuple[str, int] | None:
    """The first nameserver of the host's resolv.conf, where names outside the cluster go."""
    try:
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver" and _ip(fields[1]) is not None:
                return fields[1], 53
    except OSError as error:
        log.warning("cluster DNS: cannot read %s (%s): names outside the cluster get SERVFAIL", path, error)
    return None


class _Handler(DNSHandler):
    udplen = 512  # a longer UDP answer goes out truncated (TC), and the client asks again over TCP

    def setup(self) -> None:
        if isinstance(self.request, socket.socket):  # TCP: a client that sends nothing must not hold a thread
            self.request.settimeout(TCP_IDLE_TIMEOUT)


class _Server(socketserver.ThreadingMixIn):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], resolver: ClusterDNS) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.resolver = resolver
        self.logger = DNSLogger("error", prefix=False, logf=log.warning)
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("cluster DNS: request from %s failed", client_address, exc_info=True)


class _UDPServer(_Server, socketserver.UDPServer):
    allow_reuse_address = False  # SO_REUSEADDR on UDP would share the port with another server silently


class _TCPServer(_Server, socketserver.TCPServer):
    allow_reuse_address = True  # a restart must not wait out the TIME_WAIT of the last TCP queries


class ClusterDNS:
    """Serves the cluster domain on UDP and TCP address:port from the API server at server_url (CA and bearer
    token given); see the module's docstring.  start() binds before it returns; stop() is bounded."""

    def __init__(self, server_url: str, ca_path: Path, token: str, address: str, port: int = 53,
                 domain: str = "cluster.local", poll_interval: float = 0.3,
                 upstream: tuple[str, int] | None = None) -> None:
        self.server_url, self.token, self.address, self.port = server_url.rstrip("/"), token, address, port
        self.domain = domain.lower().strip(".")
        self.poll_interval = poll_interval
        self.upstream = upstream
        self._tls = ssl.create_default_context(cafile=str(ca_path))
        self._table: Table | None = None  # None until the first poll succeeds
        self._failing = False  # the last poll failed (its error is logged once per outage)
        self._stopping = threading.Event()
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.upstream = self.upstream or host_resolver()
        try:
            self._servers.append(_UDPServer((self.address, self.port), self))
            self.port = self._servers[0].server_address[1]  # port 0: TCP takes UDP's
            self._servers.append(_TCPServer((self.address, self.port), self))
        except OSError as error:
            self._close()
            raise RuntimeError(f"cluster DNS cannot bind {self.address}:{self.port}: {error.strerror}") from error
        self._refresh()
        self._threads = [threading.Thread(target=s.serve_forever, args=(0.2,), name="cluster-dns-serve", daemon=True)
                         for s in self._servers]
        self._threads.append(threading.Thread(target=self._poll, name="cluster-dns-poll", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for server in self._servers:
            server.shutdown()
        for thread in self._threads:
            thread.join(timeout=API_TIMEOUT * 3)
        self._close()

    def _close(self) -> None:
        for server in self._servers:
            server.server_close()
        self._servers.clear()

    def _get(self, path: str) -> list[Any]:
        request = urllib.request.Request(self.server_url + path, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json"})
        with urllib.request.urlopen(request, context=self._tls, timeout=API_TIMEOUT) as response:
            items = json.load(response).get("items")
        if not isinstance(items, list):
            raise ValueError(f"GET {path}: no items list")
        return items

    def _refresh(self) -> None:
        """One poll.  Any error keeps the last table."""
        try:
            self._table = build_table(self._get("/api/v1/services"), self._get("/api/v1/endpoints"), self.domain)
        except Exception as error:  # the thread must outlive any one bad poll: log it, keep the last table
            if not self._failing:
                log.warning("cluster DNS: cannot read Services/Endpoints from %s: %s", self.server_url, error)
            self._failing = True
        else:
            self._failing = False

    def _poll(self) -> None:
        while not self._stopping.wait(self.poll_interval):
            self._refresh()

    def lookup(self, name: str, qtype: str = "A") -> list[str] | None:
        """The addresses a query for name (any case, with or without the final dot) gets: None if the table has
        no such name (NXDOMAIN for names in the domain), [] if it has no record of that type."""
        ips = (self._table or {}).get(name.lower().rstrip("."))
        if ips is None:
            return None
        version = {"A": 4, "AAAA": 6}.get(qtype)
        return sorted(str(ip) for ip in ips if ip.version == version)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        """dnslib's resolver interface: the reply to one query."""
        name = str(request.q.qname).lower().rstrip(".")
        if name != self.domain and not name.endswith("." + self.domain):
            return self._forward(request, tcp=handler.protocol == "tcp")
        reply = request.reply()
        if self._table is None:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        qtype = QTYPE.get(request.q.qtype)
        found = self.lookup(name, qtype)
        for ip in found or []:
            record = A(ip) if qtype == "A" else AAAA(ip)
            reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=record, ttl=TTL))
        if not found:  # the SOA lets resolvers cache the negative answer, for TTL seconds only
            soa = SOA(f"ns.dns.{self.domain}", f"hostmaster.{self.domain}", (1, TTL, TTL, TTL, TTL))
            reply.add_auth(RR(self.domain, QTYPE.SOA, rdata=soa, ttl=TTL))
        if found is None:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply

    def _forward(self, request: DNSRecord, tcp: bool) -> DNSRecord:
        if self.upstream is not None:
            host, port = self.upstream
            try:
                answer = request.send(host, port, tcp=tcp, timeout=FORWARD_TIMEOUT, ipv6=":" in host)
                return DNSRecord.parse(answer)
            except (OSError, DNSError, struct.error) as error:
                log.debug("cluster DNS: forwarding %s to %s:%s failed: %s", request.q.qname, host, port, error)
        reply = request.reply()
        reply.header.rcode = RCODE.SERVFAIL
        reply.header.aa = 0
        return reply
