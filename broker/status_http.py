"""The broker's HTTP status endpoint for the operator (docs/operator.md#status): GET /status and /metrics.

Read-only and unauthenticated by design: it reveals counts, never job contents, and lets the operator keep
Kubernetes credentials out of the broker pod, where users run arbitrary code.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def metrics_text(status: dict[str, Any]) -> str:
    lines = [
        "# TYPE minicluster_ranks gauge",
        *(f'minicluster_ranks{{state="{k}"}} {v}' for k, v in status["ranks"].items()),
        "# TYPE minicluster_jobs gauge",
        *(f'minicluster_jobs{{state="{k}"}} {v}' for k, v in status["jobs"].items()),
        "# TYPE minicluster_ready gauge",
        f"minicluster_ready {int(status['ready'])}",
        *(line for name, value in status.get("counters", {}).items()
          for line in (f"# TYPE minicluster_{name}_total counter", f"minicluster_{name}_total {value}")),
        *_sharing_gauges(status),
    ]
    return "\n".join(lines) + "\n"


# (metric, help) of the per-queue and per-user gauges; each is labelled by queue or by user and uid.
_GAUGES = (("pending", "jobs waiting (array elements count one each)"), ("running", "jobs running"),
           ("cores", "cores held by running jobs"), ("gpus", "GPUs held by running jobs"))


def _sharing_gauges(status: dict[str, Any]) -> list[str]:
    lines = []
    queues = status.get("queues") or {}
    for key, what in _GAUGES:
        lines += [f"# HELP minicluster_queue_{key} {what}", f"# TYPE minicluster_queue_{key} gauge"]
        lines += [f'minicluster_queue_{key}{{queue="{_label(q)}"}} {v[key]}' for q, v in queues.items()]
    lines.append("# TYPE minicluster_queue_open gauge")
    lines += [f'minicluster_queue_open{{queue="{_label(q)}",switch="{switch}"}} {int(v[switch])}'
              for q, v in queues.items() for switch in ("enabled", "started")]
    users = status.get("users") or {}
    for key, what in _GAUGES:
        lines += [f"# HELP minicluster_user_{key} {what}", f"# TYPE minicluster_user_{key} gauge"]
        lines += [f'minicluster_user_{key}{{user="{_label(v.get("name", uid))}",uid="{uid}"}} {v[key]}'
                  for uid, v in users.items()]
    return lines


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class StatusServer:
    """`hosts`: the addresses to listen on; ["*"] means every interface, IPv4 and IPv6 alike."""

    def __init__(self, port: int, snapshot: Callable[[], dict[str, Any]], hosts: list[str]) -> None:
        self.port = port
        self.snapshot = snapshot
        self.hosts = hosts
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        if self.hosts != ["*"]:
            self._server = await asyncio.start_server(self._serve, host=self.hosts, port=self.port)
            return
        try:
            # host=None: one socket per address family the host has (0.0.0.0 and ::).
            self._server = await asyncio.start_server(self._serve, host=None, port=self.port)
        except OSError as exc:
            log.warning("cannot listen on every address family (%s); IPv4 only", exc)
            self._server = await asyncio.start_server(self._serve, host="0.0.0.0", port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method != "GET":
                code, ctype, body = "405 Method Not Allowed", "text/plain", "GET only\n"
            elif path == "/status":
                code, ctype, body = "200 OK", "application/json", json.dumps(self.snapshot())
            elif path == "/metrics":
                code, ctype, body = "200 OK", "text/plain; version=0.0.4", metrics_text(self.snapshot())
            else:
                code, ctype, body = "404 Not Found", "text/plain", "try /status or /metrics\n"
            data = body.encode()
            writer.write(f"HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()
