"""Joining ranks into the graph (broker/nodes.py): GPU/memory placement from the join, the config's
topology levels, and a resource graph file that describes the ranks itself."""
import json

import pytest

from broker import nodes
from broker.sched import jgf
from minicluster.config import ConfigError, InstanceConfig
from worker.resources import discover


def wire(**changes):
    base = discover("cores=4,gpus=2,memory=1000,sockets=2", "rack=r1,zone=b").to_wire()
    base.update(changes)
    return base


def test_join_places_gpus_and_memory_per_socket_and_levels_from_properties():
    graph, described = nodes.build_graph(InstanceConfig(topology="zone,rack"))
    assert nodes.add_rank(graph, 3, wire(gpu_sockets=[[1, [0, 1]]], memory_sockets=[[0, 900], [1, 100]]),
                          described) is None
    node = graph.nodes[3]
    assert [(s.gpus_all, s.mem_all) for s in node.sockets] == [(0, 900), (0b11, 100)]
    assert node.parent.label == "zone=b/rack=r1"
    # an old worker (no placement keys) or an inconsistent one: even split
    nodes.add_rank(graph, 4, wire(gpu_sockets=[[0, [0, 7]]], memory_sockets=[[0, 5]]), described)
    assert [(s.gpus_all, s.mem_all) for s in graph.nodes[4].sockets] == [(0b1, 500), (0b10, 500)]
    old = wire()
    del old["gpu_sockets"], old["memory_sockets"]
    nodes.add_rank(graph, 5, old, described)
    assert graph.nodes[5].total_mem == 1000
    with pytest.raises(KeyError):
        nodes.add_rank(graph, 6, {"hostname": "x"}, described)


def test_resource_graph_file_describes_ranks_that_start_down(tmp_path):
    from tests.unit.sched.test_sched_jgf import jgf_doc

    path = tmp_path / "site.json"
    path.write_text(json.dumps(jgf_doc(racks=2, nodes=1)))
    graph, described = nodes.build_graph(InstanceConfig(resource_graph=str(path)))
    assert described == {0, 1} and [r["state"] for r in graph.summary()] == ["down", "down"]
    assert nodes.add_rank(graph, 0, wire(), described) is None  # the file's 4 cores, 2 GPUs: all there
    assert graph.summary()[0]["state"] == "up" and graph.nodes[0].parent.label == "rack=rack0"
    small = discover("cores=2,gpus=1").to_wire()
    assert nodes.add_rank(graph, 1, small, described) == (
        "resources differ from the resource graph: cores 2-3 missing, GPUs 1 missing")
    assert nodes.add_rank(graph, 9, wire(), described) == nodes.NOT_IN_FILE
    assert graph.nodes[9].parent.label == "rack=r1"  # its own properties name its place


def test_bad_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file|does not exist|No such file"):
        nodes.build_graph(InstanceConfig(resource_graph=str(tmp_path / "missing.json")))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        nodes.build_graph(InstanceConfig(resource_graph=str(tmp_path / "bad.json")))
    with pytest.raises(ConfigError, match="resource type"):
        InstanceConfig(topology="socket")
    with pytest.raises(ConfigError, match="drop topology"):
        InstanceConfig(topology="rack", resource_graph="x.json")
    assert jgf.dump(nodes.build_graph(InstanceConfig())[0])["graph"]["nodes"][0]["metadata"]["type"] == "cluster"
