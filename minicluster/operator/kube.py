"""A small asynchronous Kubernetes API client for the operator's own objects.

It authenticates with the same `kopf.ConnectionInfo` that kopf logs in with,
so there is exactly one source of credentials (in-cluster service account,
kubeconfig, or whatever a test hands in).  Only the verbs the operator needs
exist here: get, create, merge-patch, plus a path builder for its kinds.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import kopf

from minicluster.operator.spec import API_VERSION, PLURAL

Login = Callable[[], Awaitable[kopf.ConnectionInfo]]

# kind -> (API prefix, plural); the operator only ever touches these.
_KINDS: dict[str, tuple[str, str]] = {
    "Secret": ("/api/v1", "secrets"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "Job": ("/apis/batch/v1", "jobs"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "MiniCluster": (f"/apis/{API_VERSION}", PLURAL),
}


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any] | str) -> None:
        self.status = status
        self.body = body
        message = body.get("message", "") if isinstance(body, dict) else body
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        super().__init__(f"HTTP {status}: {message}")

    @property
    def message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else self.body


def path_of(kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KINDS[kind]
    base = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


class Kube:
    def __init__(self, login: Login) -> None:
        self._login = login
        self._session: aiohttp.ClientSession | None = None
        self._conn: kopf.ConnectionInfo | None = None
        # Handlers run concurrently; they must share one session, not race to make two.
        self._lock = asyncio.Lock()
        self._closed = False

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, patch, "application/merge-patch+json")

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        session: aiohttp.ClientSession | None = None
        limit = aiohttp.ClientTimeout(total=timeout) if timeout else None
        for attempt in range(2):
            session, conn = await self._ensure_session(stale=session if attempt else None)
            headers = {"Content-Type": content_type, **conn.as_http_headers()}
            url = conn.server.rstrip("/") + path
            async with session.request(method, url, json=body, headers=headers, timeout=limit) as resp:
                # A rotated service-account token shows up as 401: log in again once.
                if resp.status == 401 and attempt == 0:
                    continue
                data = await _read(resp)
                if resp.status >= 400:
                    raise ApiError(resp.status, data)
                return data if isinstance(data, dict) else {}
        raise AssertionError("unreachable")

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            await self._drop()

    async def _drop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _ensure_session(
        self, stale: aiohttp.ClientSession | None,
    ) -> tuple[aiohttp.ClientSession, kopf.ConnectionInfo]:
        """The shared session; a new one (fresh login) if `stale` is still current."""
        async with self._lock:
            if self._closed:
                # A late handler during shutdown must not open a session nobody closes.
                raise RuntimeError("the Kubernetes client is closed")
            if self._session is None or self._session is stale:
                await self._drop()
                self._conn = await self._login()
                connector = aiohttp.TCPConnector(ssl=self._conn.as_ssl_context())
                self._session = aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=30),
                )
            assert self._conn is not None
            return self._session, self._conn


async def _read(resp: aiohttp.ClientResponse) -> Any:
    if resp.content_type == "application/json":
        return await resp.json()
    return await resp.text()
