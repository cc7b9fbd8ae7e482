"""The pod fields (docs/operator.md#pod-fields) in the pods an emulated node really runs: commands.init as root in
an init container, pre and post around each rank, workingDir, the /dev/shm size and the pods' own labels; and
init refused where Pod Security "restricted" is enforced."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from minicluster.operator.kube import Kube
from tests.e2e.conftest import ADMIN_TOKEN, Env, _login, make_namespace, minicluster
from tests.e2e.test_pods import INDEX, create, pods, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]

# init writes its uid to a volume the rank shares; pre and post leave a line in the rank's log; the batch command
# reads what init and pre left and where it runs.
FIELDS: dict[str, Any] = {
    "volumes": [{"name": "shared", "emptyDir": {}}],
    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    "workingDir": "/shared",
    "commands": {"init": ["sh", "-c", "id -u > /shared/init-uid"],
                 "pre": ["sh", "-c", "echo pre rank=$MC_RANK > pre-$MC_RANK"],
                 "post": ["sh", "-c", "echo post rank=$MC_RANK status=$MC_EXIT_STATUS"]},
    "command": ["sh", "-c", "echo init uid=$(cat init-uid); cat pre-0; echo cwd=$(pwd); df -k /dev/shm"],
}


@dataclass
class Ran:
    """The batch MiniCluster of FIELDS, run to its end once for this module's tests."""
    pods: list[dict[str, Any]]
    log: list[str]  # rank 0's


@pytest.fixture(scope="module")
def ran(e2e: Env) -> Ran:
    async def run() -> Ran:
        admin = Kube(_login(e2e.cluster, ADMIN_TOKEN))
        try:
            ns = await make_namespace(admin, e2e.namespace("fields"), restricted=False)  # init runs as root
            await create(admin, minicluster(e2e, "fields", ns, size=2, **FIELDS,
                                            pod={"labels": {"team": "physics"}, "shmSize": "64Mi"}))
            await wait_condition(admin, ns, "fields", "Succeeded", timeout=180)
            everyone = await pods(admin, ns, "fields")
            broker = next(p for p in everyone if (p["metadata"].get("annotations") or {}).get(INDEX) == "0")
            return Ran(everyone, e2e.on_node(lambda: e2e.node.logs(ns, broker["metadata"]["name"])).splitlines())
        finally:
            await admin.close()
    return asyncio.run(run())


def test_init_pre_post_and_the_pods_own_fields_run(ran: Ran) -> None:
    assert ran.pods and all(p["metadata"]["labels"]["team"] == "physics" for p in ran.pods)
    tail = "\n".join(ran.log[-40:])
    assert "init uid=0" in ran.log and "pre rank=0" in ran.log and "cwd=/shared" in ran.log, tail
    # post after the batch command and the broker's end, with its status.
    assert ran.log.index("post rank=0 status=0") > ran.log.index("cwd=/shared"), tail


def test_dev_shm_is_the_size_asked(ran: Ran) -> None:
    # df's 1K-blocks of /dev/shm: the 64Mi of spec.pod.shmSize. (Not on the real node's 1.20 kubelet, which sizes a
    # memory-backed emptyDir only with SizeMemoryBackedVolumes, alpha there.)
    assert any(line.split()[:1] in (["tmpfs"], ["shm"], ["none"]) and line.split()[1] == "65536"
               for line in ran.log), "\n".join(ran.log[-40:])


async def test_init_is_refused_where_restricted_is_enforced(e2e: Env, admin: Kube) -> None:
    ns = await make_namespace(admin, e2e.namespace("rootinit"))  # enforces Pod Security "restricted"
    await create(admin, minicluster(e2e, "rootinit", ns, size=2, commands={"init": ["true"]}))
    refused = await wait_condition(admin, ns, "rootinit", "Ready", "False", reason="FailedCreate")
    assert 'violates PodSecurity "restricted:latest"' in refused["message"], refused
