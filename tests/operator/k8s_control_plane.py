"""A throwaway control plane on loopback: etcd, kube-apiserver and
kube-controller-manager (no scheduler, no kubelet: pods never run).

Binaries come from MC_K8S_BIN or the cache that .ci/kubernetes.sh fills.
Certificates and tokens are made here with `cryptography`; authentication
is by static tokens (admin) and service-account tokens (the operator), and
authorization is RBAC only, as in a real cluster.
"""
from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import re
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.host import skip_unless_ready

DEFAULT_BIN = "/var/cache/minicluster/k8s-v1.20.2/bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
ADMIN_TOKEN = "admin-token-for-tests"
# The `kubernetes` Service's names, which in-cluster clients use (kopf: https://kubernetes.default.svc).
KUBERNETES_SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                            "kubernetes.default.svc.cluster.local")
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first of SERVICE_CIDR: pods behind a kube-proxy dial it


def find_binaries() -> Path | None:
    path = Path(os.environ.get("MC_K8S_BIN", DEFAULT_BIN))
    return path if all(os.access(path / b, os.X_OK) for b in BINARIES) else None


def binaries_or_skip() -> Path:
    """The binaries' directory; without them the test is skipped with how to get them."""
    path = find_binaries()
    skip_unless_ready(None if path else
                      "no kube-apiserver/etcd/kube-controller-manager: run .ci/kubernetes.sh or set MC_K8S_BIN")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _cert(subject: str, key: rsa.RSAPrivateKey, issuer: x509.Certificate | None,
          issuer_key: rsa.RSAPrivateKey, ca: bool, addresses: tuple[str, ...] = (),
          names: tuple[str, ...] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            *(x509.DNSName(n) for n in ("localhost", *names)),
            *(x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(("127.0.0.1", *addresses))),
        ]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


PLURALS = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings", "MiniCluster": "miniclusters",
           "CustomResourceDefinition": "customresourcedefinitions",
           "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
           "MutatingWebhookConfiguration": "mutatingwebhookconfigurations", "Deployment": "deployments"}


def collection_path(obj: dict) -> str:
    """The API path to create `obj` at (the kinds the tests install)."""
    group_version = obj["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    ns = obj["metadata"].get("namespace")
    plural = PLURALS[obj["kind"]]
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


_REQUESTS = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def request_counts(cluster: Cluster) -> Counter[tuple[str, str]]:
    """The API server's own count of the requests it served (apiserver_request_total, every client's), by
    (verb, resource[/subresource]). Long-running WATCHes are counted when they end."""
    context = ssl.create_default_context(cafile=str(cluster.ca_path))
    request = urllib.request.Request(f"{cluster.server}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, context=context, timeout=30) as resp:
        text = resp.read().decode()
    counts: Counter[tuple[str, str]] = Counter()
    for match in _REQUESTS.finditer(text):
        labels = dict(_LABEL.findall(match["labels"]))
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[(labels.get("verb", ""), resource)] += int(float(match["value"]))
    return counts


async def crd_established(kube: Any, name: str = "miniclusters.minicluster.dev") -> bool:
    """Whether the API server serves the CRD `name` yet: its Established condition (a create right after the CRD's
    own would otherwise get a 404)."""
    crd = await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


async def operator_token(kube: Any, namespace: str = "minicluster-system") -> str | None:
    """The token kube-controller-manager minted for the operator's ServiceAccount, once it exists (1.20 keeps
    service-account tokens in Secrets)."""
    sa = await kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/minicluster-operator")
    for ref in (sa or {}).get("secrets") or []:
        secret = await kube.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
        if secret and "token" in secret.get("data", {}):
            return base64.b64decode(secret["data"]["token"]).decode()
    return None


def serving_certificate(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """(CA, certificate, key) files for an HTTPS server on 127.0.0.1 that the API server calls (a webhook, a
    kubelet), signed by a CA of its own."""
    ca_key = _key()
    ca = _cert(f"{name}-ca", ca_key, None, ca_key, ca=True)
    key = _key()
    cert = _cert(name, key, ca, ca_key, ca=False)
    paths = (directory / f"{name}-ca.crt", directory / f"{name}.crt", directory / f"{name}.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    return paths


@dataclass
class Cluster:
    workdir: Path
    bin_dir: Path
    # The one address the API server binds and advertises (the `kubernetes` Service's endpoint): loopback, or
    # an address pods can reach (tests/e2e: the pod bridge's, port 443 as the Service's).  0: a free port.
    address: str = "127.0.0.1"
    port: int = 0
    apiserver_args: tuple[str, ...] = ()  # more flags, e.g. the real node's kubelet address type
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def ca_path(self) -> Path:
        return self.workdir / "ca.crt"

    def start(self) -> None:
        self._write_credentials()
        etcd_port = free_port()
        self.port = self.port or free_port()
        self._spawn("etcd", [
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
        ])
        w = self.workdir
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={self.port}", "--insecure-port=0",
            f"--tls-cert-file={w / 'server.crt'}", f"--tls-private-key-file={w / 'server.key'}",
            f"--client-ca-file={self.ca_path}",
            f"--token-auth-file={w / 'tokens.csv'}",
            f"--service-account-key-file={w / 'sa.key'}",
            f"--service-account-signing-key-file={w / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--api-audiences=https://kubernetes.default.svc",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *self.apiserver_args,
        ])
        self._wait_healthy()
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={self._admin_kubeconfig()}",
            "--leader-elect=false", "--port=0", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={w / 'sa.key'}",
            f"--root-ca-file={self.ca_path}",
            "--controllers=*",
            "--use-service-account-credentials=false",
        ])

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()

    def logs(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-4000:]

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:  # the child keeps its own copy
            self.processes.append(subprocess.Popen([str(self.bin_dir / name), *args],
                                                   stdout=log, stderr=subprocess.STDOUT))

    def _wait_healthy(self, timeout: float = 60) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        request = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                break
            try:
                with urllib.request.urlopen(request, context=context, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver did not become ready:\n{self.logs('kube-apiserver')}")

    def _write_credentials(self) -> None:
        ca_key = _key()
        ca = _cert("minicluster-test-ca", ca_key, None, ca_key, ca=True)
        server_key = _key()
        server = _cert("kube-apiserver", server_key, ca, ca_key, ca=False,
                       addresses=(self.address, KUBERNETES_SERVICE_IP), names=KUBERNETES_SERVICE_NAMES)
        w = self.workdir
        (w / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        (w / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
        (w / "server.key").write_bytes(_pem_key(server_key))
        (w / "sa.key").write_bytes(_pem_key(_key()))
        (w / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')

    def admin_kubeconfig(self) -> Path:
        return self._admin_kubeconfig()

    def _admin_kubeconfig(self) -> Path:
        path = self.workdir / "admin.kubeconfig"
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "{self.server}", certificate-authority: "{self.ca_path}"}}
users:
- name: admin
  user: {{token: "{ADMIN_TOKEN}"}}
contexts:
- name: test
  context: {{cluster: test, user: admin}}
current-context: test
""")
        return path
