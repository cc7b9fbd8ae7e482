"""What only a real node can show: kubectl's own exec (SPDY, which tier (d)'s node does not serve), the container
runtime's seccomp profile around the spawn path, and the images as built from images/*/Dockerfile."""
from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable, Iterator

import pytest

from minicluster.operator.kube import Kube
from tests.e2e import install
from tests.e2e.conftest import ADMIN_TOKEN, _login, make_namespace, minicluster
from tests.e2e.test_pods import MC_API, create, exec_in, pods, running_pod, wait_condition
from tests.realnode.conftest import RealEnv

pytestmark = [pytest.mark.realnode, pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def demo(e2e: RealEnv) -> Iterator[str]:
    async def call(step: Callable[[Kube], Awaitable[str]]) -> str:
        admin = Kube(_login(e2e.cluster, ADMIN_TOKEN))
        try:
            return await step(admin)
        finally:
            await admin.close()

    async def up(admin: Kube) -> str:
        ns = await make_namespace(admin, e2e.namespace("real"))
        await create(admin, minicluster(e2e, "demo", ns, resources={"requests": {"cpu": "100m"}}))
        await wait_condition(admin, ns, "demo", "Ready")
        return ns
    ns = asyncio.run(call(up))
    yield ns
    asyncio.run(call(lambda admin: admin.request("DELETE", f"{MC_API}/namespaces/{ns}/miniclusters/demo")))


def kubectl(e2e: RealEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(e2e.node.bin_dir / "kubectl"), f"--kubeconfig={e2e.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=120)


async def test_kubectl_exec_of_kubectl_1_20_runs_mc_run(e2e: RealEnv, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    done = await asyncio.to_thread(kubectl, e2e, "exec", "-n", demo, broker["metadata"]["name"], "--",
                                   "mc", "run", "-N", "3", "hostname")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["demo-0", "demo-1", "demo-2"]


async def test_tasks_spawn_with_their_cwd_under_the_runtime_default_seccomp_profile(
        e2e: RealEnv, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    code, out, err = await exec_in(e2e, demo, broker, "grep", "-E", "^(Seccomp|NoNewPrivs|CapEff):", "/proc/1/status")
    assert code == 0, err
    status = dict(line.split(":\t") for line in out.splitlines())
    assert status == {"Seccomp": "2", "NoNewPrivs": "1", "CapEff": "0000000000000000"}, status  # filter mode
    # A task with a cwd of its own, on every rank: the spawn path's private-cwd step is refused unshare here.
    code, out, err = await exec_in(e2e, demo, broker, "sh", "-c", "cd /tmp && mc run -N 3 pwd")
    assert (code, out.split()) == (0, ["/tmp"] * 3), err
    for pod in await pods(admin, demo, "demo"):
        if pod["status"].get("phase") == "Running":
            log = await asyncio.to_thread(e2e.node.logs, demo, pod["metadata"]["name"])
            assert "unshare" not in log and "WARNING" not in log, log[-2000:]


async def test_the_images_run_as_their_dockerfiles_say(e2e: RealEnv, admin: Kube, demo: str) -> None:
    broker = await running_pod(admin, demo, "demo", 0)
    code, out, err = await exec_in(e2e, demo, broker, "sh", "-c", "mc --version; python -c 'import mpi4py.MPI'")
    assert code == 0 and out.startswith("mc (minicluster) "), (out, err)
    operator = await install.operator_pod(admin)
    assert operator is not None
    [status] = operator["status"]["containerStatuses"]
    assert status["image"] == "ghcr.io/minicluster/operator:0.1.0" and status["imageID"].startswith("sha256:")
    assert status["ready"] and status["restartCount"] == 0  # its liveness probe answers on a real kubelet
