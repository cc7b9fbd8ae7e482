"""Assemble and run the operator: login, dependencies, handlers, metrics.

`operate()` is the embeddable coroutine (tests pass their own login, status
fetcher and registry); `run()` is the blocking entry point for `mc operator`
and `python -m minicluster.operator`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import kopf

from minicluster.operator import handlers, metrics
from minicluster.operator.kube import Kube, Login
from minicluster.operator.spec import GROUP
from minicluster.operator.status import HttpStatusFetcher, ProxyStatusFetcher, StatusFetcher, broker_url

BROKER_ACCESS = ("auto", "dns", "proxy")
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def service_account_login(directory: Path = SERVICE_ACCOUNT_DIR,
                          environ: Mapping[str, str] = os.environ) -> kopf.ConnectionInfo | None:
    """The pod's service account, at the address the kubelet puts in every container's environment
    (KUBERNETES_SERVICE_HOST/PORT), as client-go's in-cluster config does.  kopf's own login dials
    `kubernetes.default.svc`, which needs cluster DNS just to reach the API server."""
    token_path = directory / "token"
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not token_path.exists() or not host or not port:
        return None
    namespace = directory / "namespace"
    ca_path = directory / "ca.crt"
    return kopf.ConnectionInfo(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        ca_path=str(ca_path) if ca_path.exists() else None,
        token=token_path.read_text().strip() or None,
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
    )


async def default_login() -> kopf.ConnectionInfo:
    """In-cluster service account first, then the local kubeconfig."""
    settings = kopf.OperatorSettings()
    info = service_account_login() or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no in-cluster service account token and no kubeconfig found")
    return info


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def watched_namespaces(given: str | Collection[str] | None) -> list[str]:
    """The namespaces to watch, from one name, a list, or a comma-separated list (MC_OPERATOR_NAMESPACES);
    empty means every namespace.  Exact names only: kopf's globs would need the cluster-wide namespace list."""
    names = given.split(",") if isinstance(given, str) else list(given or ())
    names = [name.strip() for name in names if name.strip()]
    bad = [name for name in names if not (_NAMESPACE.match(name) and len(name) <= 63)]
    if bad:
        raise ValueError(f"namespace {bad[0]!r} is not a namespace name (lowercase letters, digits and '-')")
    return list(dict.fromkeys(names))


def configure(settings: kopf.OperatorSettings, namespaced: bool = False) -> None:
    # Keep kopf's bookkeeping in our own annotations: the CRD's structural
    # schema would prune kopf's default status fields.
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration",
    )
    settings.posting.level = logging.WARNING
    # On shutdown, let an in-flight status poll finish instead of orphaning it.
    settings.background.instant_exit_timeout = 5.0
    # Restricted to named namespaces, the operator needs no cluster-wide read: kopf would otherwise list and
    # watch Namespaces and CRDs (cluster-scoped). It still discovers its resource once at start-up through the
    # discovery API, which every authenticated user may read; a CRD installed later needs a restart.
    settings.scanning.disabled = namespaced
    # The operator's own pods and Jobs only, filtered by the API server (kopf's `labels=` filters in the client).
    for resource in (("v1", "pods"), ("batch", "jobs")):
        settings.watching.label_selectors[resource] = handlers.OWN_SELECTOR


async def operate(
    namespace: str | Collection[str] | None = None,
    *,
    login: Login = default_login,
    fetch_status: StatusFetcher | None = None,
    registry: kopf.OperatorRegistry | None = None,
    poll_interval: float = 5.0,
    cluster_domain: str = "cluster.local",
    metrics_port: int | None = 8080,
    health_port: int | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    broker_access: str = "auto",
    check_jobs: bool = True,
) -> None:
    namespaces = watched_namespaces(namespace)
    registry = registry if registry is not None else kopf.OperatorRegistry()
    kube = Kube(login)
    # Opens no connection unless used, so it is cheap to make and close always.
    own_fetcher = own_status_fetcher(kube, broker_access, cluster_domain)
    deps = handlers.Deps(
        kube=kube,
        fetch_status=fetch_status or own_fetcher,
        metrics=metrics.Metrics(),
        poll_interval=poll_interval,
        cluster_domain=cluster_domain,
        check_jobs=check_jobs,
    )
    handlers.register(registry, deps)

    @kopf.on.login(registry=registry)
    async def _login(**_: Any) -> kopf.ConnectionInfo:
        return await login()

    @kopf.on.startup(registry=registry)
    def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, namespaced=bool(namespaces))

    server = await metrics.serve(deps.metrics, "0.0.0.0", metrics_port) if metrics_port else None
    try:
        # Standalone: one replica, no peering objects (and no RBAC for them).
        await kopf.operator(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if server is not None:
            await server.cleanup()
        await own_fetcher.close()
        await kube.close()


def own_status_fetcher(kube: Kube, access: str, cluster_domain: str) -> HttpStatusFetcher | ProxyStatusFetcher:
    """How the operator reaches each broker's /status: by the pod's DNS name from inside the cluster, through
    the API server's pod proxy from outside it (where no pod name resolves); "auto" tells them apart by the
    service-account environment every pod has."""
    if access not in BROKER_ACCESS:
        raise ValueError(f"broker access {access!r}: choose one of {', '.join(BROKER_ACCESS)}")
    if access == "auto":
        access = "dns" if os.environ.get("KUBERNETES_SERVICE_HOST") else "proxy"
    if access == "proxy":
        return ProxyStatusFetcher(kube)
    return HttpStatusFetcher(lambda mc: broker_url(mc, cluster_domain))


def run(namespace: str | Collection[str] | None = None) -> None:
    """Run the MiniCluster operator until interrupted.

    `namespace=None` watches MiniClusters in all namespaces (needs the
    ClusterRoleBinding of deploy/); a name, a list or a comma-separated list
    restricts it to those namespaces (deploy/namespaced/: RoleBindings there,
    no cluster-wide rights), else MC_OPERATOR_NAMESPACES does.  The
    metrics port comes from MC_OPERATOR_METRICS_PORT (default 8080, 0 = off),
    the liveness port (/healthz) from MC_OPERATOR_HEALTH_PORT (default off), how
    brokers are reached from MC_OPERATOR_BROKER_ACCESS (auto, dns or proxy).
    MC_OPERATOR_CHECK_JOBS=0 skips the check that the API server kept the Job
    fields a MiniCluster needs: only for a test cluster whose stand-in supplies
    them (docs/operator.md, "Older clusters").
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    port = int(os.environ.get("MC_OPERATOR_METRICS_PORT", "8080"))
    health = int(os.environ.get("MC_OPERATOR_HEALTH_PORT", "0"))
    domain = os.environ.get("MC_CLUSTER_DOMAIN", "cluster.local")
    access = os.environ.get("MC_OPERATOR_BROKER_ACCESS", "auto")
    check_jobs = os.environ.get("MC_OPERATOR_CHECK_JOBS", "1") != "0"
    namespaces = watched_namespaces(namespace or os.environ.get("MC_OPERATOR_NAMESPACES"))
    asyncio.run(operate(namespaces, metrics_port=port or None, health_port=health or None,
                        cluster_domain=domain, broker_access=access, check_jobs=check_jobs))
