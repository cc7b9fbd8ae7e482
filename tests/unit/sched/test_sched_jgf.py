"""A whole graph from a JSON Graph Format file (as Fluxion's JGF reader takes), and back."""
import json

import pytest

from broker.sched import Request, jgf
from minicluster.model import restree


def jgf_doc(racks=2, nodes=2, first_rank=0, memory_unit="GB"):
    """cluster > rack > node > socket > {core, gpu, memory}, Fluxion style, plus a power edge."""
    vertices, edges = [], []

    def vertex(kind, name, parent=None, **meta):
        uid = str(len(vertices))
        vertices.append({"id": uid, "metadata": {"type": kind, "name": name, **meta}})
        if parent is not None:
            edges.append({"source": parent, "target": uid, "metadata": {"subsystem": "containment"}})
        return uid

    root = vertex("cluster", "tiny0", id=0, rank=-1)
    rank = first_rank
    for r in range(racks):
        rack = vertex("rack", f"rack{r}", root, id=r)
        for _ in range(nodes):
            node = vertex("node", f"node{rank}", rack, id=rank, rank=rank, properties={"ssd": "yes"})
            for s in range(2):
                sock = vertex("socket", f"socket{s}", node, id=s)
                for c in range(2):
                    vertex("core", f"core{2 * s + c}", sock, id=2 * s + c)
                vertex("gpu", f"gpu{s}", sock, id=s)
                vertex("memory", f"memory{s}", sock, id=s, size=2, unit=memory_unit)
            rank += 1
    pdu = vertex("pdu", "pdu0")  # another subsystem: not part of the containment tree
    edges.append({"source": pdu, "target": "1", "metadata": {"subsystem": "power"}})
    return {"graph": {"nodes": vertices, "edges": edges}}


def test_load_builds_levels_nodes_sockets_and_numa(tmp_path):
    path = tmp_path / "site.json"
    path.write_text(json.dumps(jgf_doc()))
    graph = jgf.load(str(path))
    assert graph.levels == (("rack", "rack"),)
    rows = graph.summary()
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["path"] == "rack=rack1" and rows[2]["hostname"] == "node2"
    assert rows[0]["properties"] == {"ssd": "yes", "rack": "rack0"}
    node = graph.nodes[1]
    assert [(s.cores_all, s.gpus_all, s.mem_all) for s in node.sockets] == [(0b11, 0b1, 2048),
                                                                           (0b1100, 0b10, 2048)]
    req = Request.from_shape(restree.shape_of(restree.parse("rack[1]>node[2]>socket[2]>{core[2],gpu[1]}")))
    graph.check_feasible(req)
    assert sorted(graph.match(req)) == [0, 1]


def test_dump_then_load_is_the_same_graph():
    graph = jgf.build(jgf_doc(racks=3, nodes=3))
    again = jgf.build(jgf.dump(graph))
    assert again.summary() == graph.summary() and again.levels == graph.levels
    assert again.snapshot() == graph.snapshot()


def test_nodes_without_sockets_and_looked_through_types():
    doc = {"graph": {"nodes": [
        {"id": "c", "metadata": {"type": "cluster", "name": "c"}},
        {"id": "n", "metadata": {"type": "node", "name": "lone", "rank": 7, "properties": ["bigmem"]}},
        {"id": "numa", "metadata": {"type": "numanode", "name": "numa0"}},
        {"id": "k0", "metadata": {"type": "core", "id": 0}},
        {"id": "k1", "metadata": {"type": "core", "id": 1}},
        {"id": "m", "metadata": {"type": "memory", "size": 512, "unit": "MiB"}},
        {"id": "ssd", "metadata": {"type": "ssd", "name": "ssd0", "size": 100}},
    ], "edges": [{"source": "c", "target": "n"}, {"source": "n", "target": "numa"},
                 {"source": "numa", "target": "k0"}, {"source": "n", "target": "k1"},
                 {"source": "n", "target": "m"}, {"source": "c", "target": "ssd"}]}}
    graph = jgf.build(doc)
    (row,) = graph.summary()
    assert (row["rank"], row["cores_total"], row["memory_mb_total"]) == (7, 2, 512)
    assert row["properties"] == {"bigmem": ""} and graph.levels == ()


@pytest.mark.parametrize("change, message", [
    (lambda d: d["graph"]["nodes"][2]["metadata"].pop("rank"), "node node0 has no rank"),
    (lambda d: d["graph"]["nodes"][13]["metadata"].update(rank=0), "rank 0 appears twice"),
    (lambda d: d["graph"]["edges"].pop(0), "expected one containment root"),
    (lambda d: d["graph"]["nodes"][7]["metadata"].update(unit="furlongs"), "bad size"),
    (lambda d: d["graph"]["nodes"][4]["metadata"].pop("id"), "needs metadata.id"),
    (lambda d: d["graph"]["edges"].append({"source": "0", "target": "999"}), "unknown vertex"),
    (lambda d: d["graph"].pop("nodes"), "expected {\"graph\""),
    (lambda d: d["graph"]["nodes"][1]["metadata"].update(type="Rack"), "level name 'Rack'"),
])
def test_bad_files_are_refused_naming_the_vertex(change, message):
    doc = jgf_doc()
    change(doc)
    with pytest.raises(ValueError, match=message.replace("{", r"\{")):
        jgf.build(doc)


def test_levels_in_conflicting_order_are_refused():
    doc = {"graph": {"nodes": [
        {"id": "c", "metadata": {"type": "cluster"}},
        {"id": "z", "metadata": {"type": "zone", "name": "z"}},
        {"id": "r", "metadata": {"type": "rack", "name": "r"}},
        {"id": "r2", "metadata": {"type": "rack", "name": "r2"}},
        {"id": "z2", "metadata": {"type": "zone", "name": "z2"}},
        {"id": "a", "metadata": {"type": "node", "rank": 0}},
        {"id": "b", "metadata": {"type": "node", "rank": 1}},
    ], "edges": [{"source": "c", "target": "z"}, {"source": "z", "target": "r"},
                 {"source": "r", "target": "a"}, {"source": "c", "target": "r2"},
                 {"source": "r2", "target": "z2"}, {"source": "z2", "target": "b"}]}}
    with pytest.raises(ValueError, match="conflicting order"):
        jgf.build(doc)
