"""Topology-aware placement on a real cluster: 6 ranks declaring two racks (config `topology = "rack"`,
each rank's `rack` property from MC_PROPERTIES), jobs from the real CLI with --locality/--spread/--resources,
and what `mc jobs -o alloc` and `mc resources --tree` show."""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from minicluster.client import Client, ClientError
from minicluster.model.idset import IdSet
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for

RACKS = {0: "r0", 1: "r0", 2: "r0", 3: "r1", 4: "r1", 5: "r1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("topo"), size=6, fanout=2, resources="cores=2,sockets=2",
                     topology="rack")
    try:
        for rank, rack in RACKS.items():
            c.start_rank(rank, env={"MC_PROPERTIES": f"rack={rack}"})
        c.wait_up()
        yield c
    finally:
        c.stop()


def mc(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mc", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MC_URI": cluster.uri})


def submit(cluster: LocalCluster, *argv: str) -> int:
    out = mc(cluster, "submit", *argv)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def ranks(client: Client, job_id: int) -> set[int]:
    return set(IdSet.parse(client.job(job_id)["ranks"]))


def test_locality_rack_job_runs_on_one_rack_only(cluster: LocalCluster, client: Client) -> None:
    # Rank 2 (rack r0) is busy: first-fit alone would take ranks 0, 1, 3 across both racks.
    blocker = client.submit(job(["sleep", "30"], ntasks=2, nnodes=1, mpi="none", requires=["rack=r0"],
                                policy="high-id"))
    try:
        assert wait_until_running(client, blocker) == {2}
        local = submit(cluster, "-N", "3", "--locality", "rack", "--mpi", "none", "hostname")
        assert wait_for(client, local)["status"] == 0
        assert ranks(client, local) == {3, 4, 5}
        plain = submit(cluster, "-N", "3", "--mpi", "none", "hostname")
        assert wait_for(client, plain)["status"] == 0
        assert ranks(client, plain) == {0, 1, 3}  # what locality prevented
        shown = mc(cluster, "jobs", "-o", "alloc", str(local), str(plain))
        assert shown.returncode == 0, shown.stderr
        rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
        assert "rack=r1[3-5]" in rows[str(local)]
        assert "rack=r0[0-1]" in rows[str(plain)] and "rack=r1[3]" in rows[str(plain)]
    finally:
        client.cancel([blocker])
        wait_for(client, blocker)


def test_spread_and_exclusive_rack_trees(cluster: LocalCluster, client: Client) -> None:
    spread = submit(cluster, "-N", "2", "--spread", "rack", "--mpi", "none", "true")
    assert wait_for(client, spread)["status"] == 0
    placed = ranks(client, spread)
    assert {RACKS[r] for r in placed} == {"r0", "r1"} and len(placed) == 2
    # A whole rack held exclusively: one task, but no other job may use the rack's other nodes meanwhile.
    whole = submit(cluster, "--resources", "rack[1]:x>node[1]>slot[1]>core[1]", "sleep", "30")
    try:
        wait_until_running(client, whole)
        rack = RACKS[min(ranks(client, whole))]
        summary = client.jobs(ids=[whole], alloc=True)[0]
        held = set(IdSet.parse(summary["alloc"][0]["ranks"]))
        assert summary["alloc"][0]["path"] == f"rack={rack}" and held == {r for r in RACKS if RACKS[r] == rack}
        other = submit(cluster, "-n", "6", "--mpi", "none", "true")
        assert wait_for(client, other)["status"] == 0
        assert not ranks(client, other) & held
    finally:
        client.cancel([whole])
        wait_for(client, whole)


def test_socket_tree_binds_a_task_to_one_socket(cluster: LocalCluster, client: Client) -> None:
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    import sys

    job_id = submit(cluster, "--resources", "node[2]>socket[1]>core[1]", "--mpi", "none",
                    sys.executable, "-c", code)
    assert wait_for(client, job_id)["status"] == 0
    assert len(ranks(client, job_id)) == 2


def test_infeasible_trees_are_refused_at_submit_with_the_reason(cluster: LocalCluster, client: Client) -> None:
    out = mc(cluster, "submit", "-N", "4", "--locality", "rack", "true")
    assert out.returncode != 0 and "needs 1 rack that holds 4 nodes" in out.stderr
    out = mc(cluster, "submit", "--resources", "zone[1]>node[1]", "true")
    assert out.returncode != 0 and "no zone level" in out.stderr
    out = mc(cluster, "submit", "--resources", "node[1]>{slot[1]>core[1],socket[1]}", "true")
    assert out.returncode != 0 and "exactly one kind of vertex" in out.stderr
    with pytest.raises(ClientError) as info:
        client.submit(job(["true"], resources="node[1]>slot[1]>core[2]:x>socket[1]"))
    assert info.value.code == "invalid-jobspec"


def test_resources_tree_shows_racks_with_free_and_used(cluster: LocalCluster, client: Client) -> None:
    out = mc(cluster, "resources", "--tree", "--json")
    assert out.returncode == 0, out.stderr
    tree = json.loads(out.stdout)["tree"]
    racks = {c["name"]: c for c in tree["children"]}
    assert set(racks) == {"r0", "r1"} and tree["cores"][2] == 12
    assert [n["rank"] for n in racks["r1"]["children"]] == [3, 4, 5]
    assert all(len(n["children"]) == 2 for n in racks["r0"]["children"])  # two sockets each
    text = mc(cluster, "resources", "--tree").stdout
    assert "rack r0" in text and "node" in text and "cores" in text


def wait_until_running(client: Client, job_id: int, timeout: float = 20.0) -> set[int]:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        summary = client.job(job_id)
        if summary["state"] == "RUN" and summary["ranks"]:
            return set(IdSet.parse(summary["ranks"]))
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not start: {client.job(job_id)}")


def test_a_resource_graph_file_describes_the_machine(tmp_path_factory: pytest.TempPathFactory) -> None:
    """JGF: racks from the file, a rank whose worker lacks the file's cores is drained with the reason."""
    from broker.sched import ResourceGraph, jgf

    site = ResourceGraph((("rack", "rack"),))
    for rank, (rack, cores) in enumerate([("left", 2), ("left", 2), ("right", 4)]):
        site.add_rank(rank, hostname=f"host{rank}", sockets={0: tuple(range(cores))},
                      properties={"rack": rack})
    state = tmp_path_factory.mktemp("jgf")
    path = state / "site.jgf"
    path.write_text(json.dumps(jgf.dump(site)))
    with (LocalCluster(state, size=3, fanout=2, resources="cores=2", resource_graph=str(path)) as c,
          c.client() as client):
        rows = {r["rank"]: r for r in client.resources()}
        assert [rows[r]["path"] for r in range(3)] == ["rack=left", "rack=left", "rack=right"]
        assert rows[2]["state"] == "drained" and "cores 2-3 missing" in rows[2]["reason"]
        job_id = submit(c, "-N", "2", "--locality", "rack", "--mpi", "none", "true")
        assert wait_for(client, job_id)["status"] == 0
        assert ranks(client, job_id) == {0, 1}


def test_gpu_affinity_keeps_each_tasks_gpu_on_the_socket_of_its_core(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Two sockets of one core and one GPU each (GPUs are dealt to sockets in id order).
    with LocalCluster(tmp_path_factory.mktemp("gpuaff"), size=1, resources="cores=2,gpus=2,sockets=2") as c:
        code = ("import os; print(os.environ['CUDA_VISIBLE_DEVICES'], "
                "open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0])")
        out = mc(c, "run", "-n", "2", "-c", "1", "-g", "1", "--gpu-affinity", "-l", "python3", "-c", code)
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.splitlines()) == ["0: 0 0", "1: 1 1"]
        # Two cores and a GPU on one socket do not exist here: refused at submit, while without the
        # affinity the same request runs.
        refused = mc(c, "run", "-c", "2", "-g", "1", "--gpu-affinity", "true")
        assert refused.returncode != 0 and "needs 2 cores per task on one socket, the largest socket has 1" in (
            refused.stderr)
        assert mc(c, "run", "-c", "2", "-g", "1", "true").returncode == 0
