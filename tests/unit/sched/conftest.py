"""Shared builders for the scheduler unit tests."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from broker.sched import ResourceGraph  # noqa: E402


def add_node(graph, rank, cores=4, sockets=2, gpus=0, memory_mb=1024, properties=None,
             hostname=None):
    per = cores // sockets
    graph.add_rank(
        rank, hostname=hostname or f"node{rank}",
        sockets={s: tuple(range(s * per, (s + 1) * per)) for s in range(sockets)},
        gpus=tuple(range(gpus)), memory_mb=memory_mb, properties=properties or {})


def make_graph(nnodes=4, **kw):
    graph = ResourceGraph()
    for rank in range(nnodes):
        add_node(graph, rank, **kw)
    return graph


@pytest.fixture
def graph4():
    """4 nodes x 2 sockets x 2 cores, 2 GPUs, 1024 MB."""
    return make_graph(4, gpus=2)
