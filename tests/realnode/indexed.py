"""Stand-in for the Indexed Jobs that Kubernetes 1.20 lacks, for the real-node tier (a real kubelet).

The 1.20 API server drops `completionMode: Indexed`, `successPolicy` and `podFailurePolicy` from the Jobs the
operator renders, so its Job controller makes plain pods: no index, and every rank exits "no rank".  A real
kubelet starts a pod as it was created and its spec cannot change afterwards, so the index is given at creation,
by a mutating admission webhook (1.20 has them), as a 1.33 Job controller names its pods:
* the lowest free index (tests/e2e/jobs.py: a sibling that is not Failed holds its index, a terminating one too)
  as the annotation and label `batch.kubernetes.io/job-completion-index`, `spec.hostname` JOB-INDEX (the
  template's subdomain kept), `JOB_COMPLETION_INDEX` on every container and init container (from the label,
  as with 1.28+'s PodIndexLabel), and the generated name JOB-INDEX-xxxxx;
* a replacement created while its predecessor still terminates (1.20's Job controller does not wait) takes
  the predecessor's index but is held: its schedulerName is one no scheduler serves, and JobJudge binds it to
  the node once the predecessor is gone.  So a replacement starts only once its predecessor is gone, without
  the denials that would put 1.20's Job controller into its backoff (10 s, doubling to 6 minutes); a create
  is denied only when every index is held by a live pod;
* an index given is held until the API server lists its pod (which carries ADMISSION_KEY to say so) or
  RESERVATION_SECONDS pass (the create failed after admission), so two quick creates never share an index.
`JobJudge` gives the verdicts 1.20 cannot (successPolicy, FailJob) with the same rules as the emulated node.
The app also serves Pod Security "restricted" (tests/e2e/endpoints.validate) at /validate, since 1.20 has no
PodSecurity admission.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from minicluster.operator.kube import Kube
from minicluster.operator.spec import INDEX_KEY, NAME_LABEL
from tests.e2e import endpoints
from tests.e2e.jobs import TERMINAL, JobRules, Obj, by_job, has_room, index_of, lowest_free, owner, phase, pod_path

log = logging.getLogger("realnode.indexed")
INDEX_ENV = "JOB_COMPLETION_INDEX"
ADMISSION_KEY = "realnode.minicluster.dev/admission"  # the admission request that gave the pod its index
RESERVATION_SECONDS = 10.0
HELD_SCHEDULER = "realnode-held-until-predecessor-gone"  # no scheduler serves it: JobJudge binds such pods
MAX_GENERATED_PREFIX = 58  # a generated name adds 5 characters to at most 58 (63 in all)


class Indexer:
    """The mutating webhook's decisions.  One lock orders the decisions, so each one sees the API server's pods
    as of after the one before, plus what was given since and is not listed yet."""

    def __init__(self, rules: JobRules) -> None:
        self.rules = rules
        self._lock = asyncio.Lock()
        self._given: dict[str, tuple[str, int | None, float]] = {}  # admission uid -> (Job uid, index, expiry)

    async def review(self, request: Mapping[str, Any]) -> Obj:
        """The AdmissionReview response for `request`: a pod of a MiniCluster's Job gets its index (JSONPatch),
        or is denied while none is free; anything else passes unchanged."""
        allow: Obj = {"uid": request["uid"], "allowed": True}
        pod = request.get("object") or {}
        ref = owner(pod, "Job") if request.get("operation") == "CREATE" and pod.get("metadata") else None
        if ref is None:
            return allow
        namespace = request["namespace"]
        job = await self.rules.kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{ref['name']}")
        if job is None or job["metadata"]["uid"] != ref["uid"]:
            return allow
        intended = await self.rules.intended(job)
        if intended is None:
            return allow
        where = f"Job {namespace}/{ref['name']}"
        if self.rules.is_finished(job):
            return _deny(allow, f"{where} has finished: it starts no more pods")
        async with self._lock:
            siblings = await self._siblings(namespace, ref["uid"])
            reserved = [index for job_uid, index, _ in self._given.values() if job_uid == ref["uid"]]
            # A predecessor still terminating: the new pod takes its index but is held (HELD_SCHEDULER) until it
            # is gone.  A denial instead would put 1.20's Job controller into its backoff, minutes after a few.
            leaving = [p for p in siblings if p["metadata"].get("deletionTimestamp") and phase(p) not in TERMINAL]
            held = False
            if intended["spec"].get("completionMode") == "Indexed":
                index = lowest_free(intended, siblings, [i for i in reserved if i is not None])
                if index is None:
                    index = lowest_free(intended, [p for p in siblings if p not in leaving],
                                        [i for i in reserved if i is not None])
                    held = True
                if index is None:
                    return _deny(allow, f"no free completion index for {where}: each of its "
                                        f"{intended['spec']['completions']} is held by a pod not yet gone")
            else:
                index = None
                if not has_room(intended, siblings, len(reserved)):
                    if not has_room(intended, [p for p in siblings if p not in leaving], len(reserved)):
                        return _deny(allow, f"{where} has {intended['spec'].get('parallelism', 1)} pods not yet gone")
                    held = True
            if not request.get("dryRun"):
                self._given[request["uid"]] = (ref["uid"], index, time.monotonic() + RESERVATION_SECONDS)
        patch = _patch(pod, ref["name"], index, request["uid"])
        if held:
            patch.append({"op": "add", "path": "/spec/schedulerName", "value": HELD_SCHEDULER})
        return {**allow, "patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}

    async def _siblings(self, namespace: str, job_uid: str) -> list[Obj]:
        """The Job's pods as the API server lists them now; forgets the indexes they show as given."""
        pods = (await self.rules.kube.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]
        siblings = by_job(pods).get(job_uid, [])
        listed = {(p["metadata"].get("annotations") or {}).get(ADMISSION_KEY) for p in siblings}
        moment = time.monotonic()
        for token in [t for t, (_, _, expiry) in self._given.items() if t in listed or expiry < moment]:
            del self._given[token]
        return siblings


def _deny(allow: Obj, message: str) -> Obj:
    log.info("denied: %s", message)
    return {**allow, "allowed": False,
            "status": {"code": 403, "reason": "Forbidden", "message": f"Indexed Job stand-in: {message}"}}


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _patch(pod: Mapping[str, Any], job_name: str, index: int | None, admission: str) -> list[Obj]:
    """JSONPatch operations giving `pod` its index (None: only the admission mark)."""
    meta, spec = pod["metadata"], pod["spec"]
    ops: list[Obj] = []

    def put(field: str, key: str, value: str) -> None:
        if field not in meta and not any(op["path"] == f"/metadata/{field}" for op in ops):
            ops.append({"op": "add", "path": f"/metadata/{field}", "value": {}})
        ops.append({"op": "add", "path": f"/metadata/{field}/{_pointer(key)}", "value": value})

    put("annotations", ADMISSION_KEY, admission)
    if index is None:
        return ops
    put("annotations", INDEX_KEY, str(index))
    put("labels", INDEX_KEY, str(index))
    if not meta.get("name") and meta.get("generateName"):
        prefix = f"{job_name}-{index}-"[:MAX_GENERATED_PREFIX]
        ops.append({"op": "replace", "path": "/metadata/generateName", "value": prefix})
    if not spec.get("hostname"):
        ops.append({"op": "add", "path": "/spec/hostname", "value": f"{job_name}-{index}"})
    variable = {"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_KEY}']"}}}
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            env = container.get("env")
            if env is None:
                ops.append({"op": "add", "path": f"/spec/{kind}/{i}/env", "value": [variable]})
            elif not any(e.get("name") == INDEX_ENV for e in env):
                ops.append({"op": "add", "path": f"/spec/{kind}/{i}/env/-", "value": variable})
    return ops


class JobJudge:
    """Every `period` seconds, every Job's verdict (successPolicy, FailJob) from its pods, as the emulated node
    gives it (tests/e2e/jobs.py); the Job's other pods are then deleted, gracefully.  With `node`, it also binds
    the pods the webhook held there once their predecessors are gone."""

    def __init__(self, kube: Kube, period: float = 0.3, node: str | None = None) -> None:
        self.rules = JobRules(kube)
        self.period = period
        self.node = node

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.judge_all()
            except Exception:  # one failed round must not end the judge; the next one retries
                log.exception("judging the Jobs failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period)

    async def judge_all(self) -> None:
        pods = by_job((await self.rules.kube.get("/api/v1/pods"))["items"])
        for job in (await self.rules.kube.get("/apis/batch/v1/jobs"))["items"]:
            siblings = pods.get(job["metadata"]["uid"], [])
            await self.rules.judge(job, siblings)
            if self.node is not None:
                await self._release(siblings)

    async def _release(self, siblings: list[Obj]) -> None:
        for pod in siblings:
            spec = pod["spec"]
            if spec.get("schedulerName") != HELD_SCHEDULER or spec.get("nodeName") or phase(pod) in TERMINAL:
                continue
            others = [p for p in siblings if p is not pod and phase(p) not in TERMINAL]
            if index_of(pod) is None:  # NonIndexed: held while any predecessor is still terminating
                before = [p for p in others if p["metadata"].get("deletionTimestamp")]
            else:
                before = [p for p in others if index_of(p) == index_of(pod)]
            if not before:
                binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                           "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
                await self.rules.kube.create(f"{pod_path(pod)}/binding", binding)


def app(indexer: Indexer) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        response = await indexer.review(review["request"])
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    application = web.Application()
    application.router.add_post("/mutate", mutate)
    application.router.add_post("/validate", endpoints.validate)
    return application


async def serve(kube: Kube, cert: Path, key: Path, host: str = "127.0.0.1",
                judge: JobJudge | None = None) -> tuple[web.AppRunner, int]:
    """Serve /mutate and /validate over TLS on `host` (an address the API server reaches), a free port.  With
    `judge`, the webhook shares its verdicts: no pod is admitted for a Job it has judged, even while 1.20's Job
    controller has written its own status back over the verdict."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    # No keep-alive: a connection the API server left open would outlive the server's loop (tests end theirs).
    runner = web.AppRunner(app(Indexer(judge.rules if judge else JobRules(kube))), access_log=None,
                           keepalive_timeout=3600)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def webhook_configuration(url_or_port: str | int, ca_pem: bytes, run_id: str) -> Obj:
    """The MutatingWebhookConfiguration for `serve()`'s /mutate: a port on 127.0.0.1, or the server's base URL
    (https://HOST:PORT).  Only pods of a MiniCluster (its name label) are sent, so no system pod ever depends on
    it; failurePolicy Fail, since a pod without its index can only fail.  (Pod Security: endpoints'
    webhook_configuration with the same port.)"""
    base = f"https://127.0.0.1:{url_or_port}" if isinstance(url_or_port, int) else url_or_port.rstrip("/")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": f"realnode-indexed-job-{run_id}"},
        "webhooks": [{
            "name": "indexed-job.realnode.minicluster.dev",
            "clientConfig": {"url": f"{base}/mutate", "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "objectSelector": {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]},
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "reinvocationPolicy": "Never",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
        }],
    }
