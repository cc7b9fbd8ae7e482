"""The instance's CURVE certificate (protocol.md §2.2): create, load, and the ZAP check."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator


class CertificateError(RuntimeError):
    pass


@dataclass(frozen=True)
class Certificate:
    public: bytes
    secret: bytes


def create(directory: str | os.PathLike[str], name: str = "curve") -> Path:
    """Write a fresh key pair; returns the path of the secret certificate file (mode 0600)."""
    Path(directory).mkdir(parents=True, exist_ok=True, mode=0o700)
    _, secret_file = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret_file, 0o600)
    return Path(secret_file)


def load(path: str | os.PathLike[str]) -> Certificate:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CertificateError(f"CURVE certificate {path} does not exist") from None
    # Group access is allowed because Kubernetes Secret volumes with an fsGroup are group-readable.
    if mode & stat.S_IRWXO:
        raise CertificateError(f"CURVE certificate {path} is accessible to others; chmod 600 it")
    public, secret = zmq.auth.load_certificate(str(path))
    if not secret:
        raise CertificateError(f"{path} holds no secret key")
    return Certificate(public=public, secret=secret)


class _InstanceKeyOnly:
    """ZAP credentials provider: a peer must present the instance's own public key."""

    def __init__(self, public: bytes) -> None:
        self._public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self._public


def start_authenticator(context: zmq.asyncio.Context, cert: Certificate) -> AsyncioAuthenticator:
    auth = AsyncioAuthenticator(context)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_InstanceKeyOnly(cert.public))
    return auth


def make_server(sock: zmq.Socket, cert: Certificate) -> None:
    sock.curve_secretkey = cert.secret
    sock.curve_publickey = cert.public
    sock.curve_server = True


def make_client(sock: zmq.Socket, cert: Certificate) -> None:
    sock.curve_secretkey = cert.secret
    sock.curve_publickey = cert.public
    sock.curve_serverkey = cert.public
