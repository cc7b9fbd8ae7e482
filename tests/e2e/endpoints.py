"""The emulated node's HTTPS endpoint, which the real API server calls:

* `/exec/NS/POD/CONTAINER?command=...&output=1&error=1` — the kubelet's exec API.  The API server proxies
  `kubectl exec` (and any client's pods/exec) here; this speaks the websocket channel protocol
  (v4.channel.k8s.io: stdin 0, stdout 1, stderr 2, status 3) and runs the command in the container's
  namespaces, as its user, with its environment.  kubectl 1.20 itself would speak SPDY instead, which is not
  served; the Python client (and `kubectl mc`) use websockets.
* `/validate` — Pod Security "restricted" as a validating admission webhook (1.20 has no PodSecurity
  admission), for namespaces labelled `pod-security.kubernetes.io/enforce: restricted`.
"""
from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.e2e import kubelet, podsecurity

STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
FindContainer = Callable[[str, str], "kubelet.Container | None"]


def app(find: FindContainer) -> web.Application:
    application = web.Application()
    application.router.add_get("/exec/{namespace}/{pod}/{container}", _exec_handler(find))
    application.router.add_post("/exec/{namespace}/{pod}/{container}", _exec_handler(find))
    application.router.add_post("/validate", validate)
    return application


async def serve(find: FindContainer, cert: Path, key: Path) -> tuple[web.AppRunner, int]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(app(find), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _exec_handler(find: FindContainer) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        c = find(request.match_info["namespace"], request.match_info["pod"])
        if c is None or c.pid1 is None or c.exit_code is not None:
            return web.Response(status=404, text="container not running")
        argv = request.query.getall("command", [])
        with_stdin = (request.query.get("input") or request.query.get("stdin")) in ("1", "true")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        proc = await asyncio.create_subprocess_exec(
            *kubelet.exec_argv(c, argv), stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        pumps = [asyncio.ensure_future(_pump(proc.stdout, STDOUT, ws)),
                 asyncio.ensure_future(_pump(proc.stderr, STDERR, ws))]
        feeder = asyncio.ensure_future(_feed(ws, proc)) if with_stdin else None
        await asyncio.gather(*pumps)
        code = await proc.wait()
        if feeder is not None:
            feeder.cancel()
        await ws.send_bytes(bytes([STATUS]) + json.dumps(_status(code)).encode())
        await ws.close()
        return ws
    return handle


async def _pump(stream: asyncio.StreamReader | None, channel: int, ws: web.WebSocketResponse) -> None:
    assert stream is not None
    while chunk := await stream.read(65536):
        await ws.send_bytes(bytes([channel]) + chunk)


async def _feed(ws: web.WebSocketResponse, proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == bytes([STDIN]):
            proc.stdin.write(msg.data[1:])
            await proc.stdin.drain()


def _status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


async def validate(request: web.Request) -> web.Response:
    review = await request.json()
    req = review["request"]
    pod = req.get("object") or {}
    violations = podsecurity.restricted_violations(pod.get("spec") or {})
    response: dict[str, Any] = {"uid": req["uid"], "allowed": not violations}
    if violations:
        name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
        response["status"] = {"code": 403, "reason": "Forbidden", "message": podsecurity.message(name, violations)}
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


def webhook_configuration(port: int, ca_pem: bytes, run_id: str) -> dict[str, Any]:
    import base64

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"e2e-podsecurity-{run_id}"},
        "webhooks": [{
            "name": "podsecurity.e2e.minicluster.dev",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {podsecurity.ENFORCE_LABEL: "restricted"}},
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }],
    }
