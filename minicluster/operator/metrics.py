"""Prometheus metrics of the operator, served as text on /metrics.

Three series are enough to alert on: reconciles, errors, and MiniClusters by
phase.  The exposition format is a few lines of text, so this avoids a
dependency on a metrics library.
"""
from __future__ import annotations

from collections import Counter

from aiohttp import web

PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed", "Invalid", "Unsupported")
# The handlers (handlers.py), shown from the start: a series that appears only at the first error makes
# rate() and the dashboard's error panel read "no data" instead of 0.
HANDLERS = ("reconcile", "status")


class Metrics:
    def __init__(self) -> None:
        self.reconciles: Counter[str] = Counter(dict.fromkeys(HANDLERS, 0))
        self.errors: Counter[str] = Counter(dict.fromkeys(HANDLERS, 0))
        self._phases: dict[tuple[str, str], str] = {}

    def reconciled(self, handler: str) -> None:
        self.reconciles[handler] += 1

    def failed(self, handler: str) -> None:
        self.errors[handler] += 1

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        self._phases[namespace, name] = phase

    def forget(self, namespace: str, name: str) -> None:
        self._phases.pop((namespace, name), None)

    def render(self) -> str:
        by_phase = Counter(self._phases.values())
        lines = [
            "# HELP minicluster_operator_reconciles_total Handler invocations.",
            "# TYPE minicluster_operator_reconciles_total counter",
            *(f'minicluster_operator_reconciles_total{{handler="{h}"}} {n}'
              for h, n in sorted(self.reconciles.items())),
            "# HELP minicluster_operator_errors_total Handler invocations that failed.",
            "# TYPE minicluster_operator_errors_total counter",
            *(f'minicluster_operator_errors_total{{handler="{h}"}} {n}'
              for h, n in sorted(self.errors.items())),
            "# HELP minicluster_operator_miniclusters MiniClusters seen by this operator, by phase.",
            "# TYPE minicluster_operator_miniclusters gauge",
            *(f'minicluster_operator_miniclusters{{phase="{p}"}} {by_phase.get(p, 0)}' for p in PHASES),
        ]
        return "\n".join(lines) + "\n"


async def serve(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Start the /metrics endpoint; the caller cleans up the returned runner."""
    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
