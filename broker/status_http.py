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
        *_cores_gauges(status.get("cores") or {}),
        *_fairshare_gauges(status.get("fairshare") or {}),
        *_journal_metrics(status.get("journal") or {}),
    ]
    return "\n".join(lines) + "\n"


def _cores_gauges(cores: dict[str, Any]) -> list[str]:
    """One series per rank (fine up to a few thousand ranks) and per topology group."""
    lines = ["# HELP minicluster_rank_cores cores the rank has", "# TYPE minicluster_rank_cores gauge"]
    lines += [f'minicluster_rank_cores{{rank="{rank}"}} {total}' for rank, total, _ in cores.get("ranks", ())]
    lines += ["# HELP minicluster_rank_cores_busy cores held by jobs", "# TYPE minicluster_rank_cores_busy gauge"]
    lines += [f'minicluster_rank_cores_busy{{rank="{rank}"}} {busy}' for rank, _, busy in cores.get("ranks", ())]
    domains = cores.get("domains", ())
    for metric, index, what in (("cores", 2, "cores below the group"), ("cores_busy", 3, "of those, held by jobs")):
        lines += [f"# HELP minicluster_topology_{metric} {what}", f"# TYPE minicluster_topology_{metric} gauge"]
        lines += [f'minicluster_topology_{metric}{{level="{_label(d[0])}",domain="{_label(d[1])}"}} {d[index]}'
                  for d in domains]
    return lines


def _fairshare_gauges(fairshare: dict[str, Any]) -> list[str]:
    lines = ["# HELP minicluster_fairshare_bank_usage_core_seconds decayed usage of the bank's subtree",
             "# TYPE minicluster_fairshare_bank_usage_core_seconds gauge"]
    banks = fairshare.get("banks", ())
    lines += [f'minicluster_fairshare_bank_usage_core_seconds{{bank="{_label(b)}"}} {usage!r}'
              for b, usage, _ in banks]
    lines += ["# HELP minicluster_fairshare_bank_shares_ratio the bank's share of the whole machine",
              "# TYPE minicluster_fairshare_bank_shares_ratio gauge"]
    lines += [f'minicluster_fairshare_bank_shares_ratio{{bank="{_label(b)}"}} {share!r}' for b, _, share in banks]
    users = [(f'bank="{_label(b)}",user="{_label(name)}",uid="{uid}"', usage, factor)
             for b, uid, name, usage, factor in fairshare.get("users", ())]
    lines += ["# HELP minicluster_fairshare_usage_core_seconds decayed usage of the user in the bank",
              "# TYPE minicluster_fairshare_usage_core_seconds gauge"]
    lines += [f"minicluster_fairshare_usage_core_seconds{{{labels}}} {usage!r}" for labels, usage, _ in users]
    lines += ["# HELP minicluster_fairshare_factor Fair Tree factor, 0 to 1 (1: served least)",
              "# TYPE minicluster_fairshare_factor gauge"]
    lines += [f"minicluster_fairshare_factor{{{labels}}} {factor!r}" for labels, _, factor in users]
    return lines


def _journal_metrics(journal: dict[str, Any]) -> list[str]:
    if not journal:
        return []
    return ["# HELP minicluster_journal_stalled 1 while journal commits are being retried (the disk is full, ...)",
            "# TYPE minicluster_journal_stalled gauge", f"minicluster_journal_stalled {int(journal['stalled'])}",
            *journal["commit_seconds"].lines("minicluster_journal_commit_duration_seconds",
                                             "time from a commit's first attempt until it is durable")]


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

    def __init__(self, port: int, snapshot: Callable[[], dict[str, Any]], hosts: list[str],
                 metrics: Callable[[], dict[str, Any]] | None = None) -> None:
        self.port = port
        self.snapshot = snapshot
        # /metrics: the status plus what only Prometheus reads (Broker.metrics_snapshot).
        self.metrics = metrics or snapshot
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
                code, ctype, body = "200 OK", "text/plain; version=0.0.4", metrics_text(self.metrics())
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
