"""The job-level, node-level and per-process keys a worker registers for a PMIx job (pure).

These are what Open MPI 4.1 and 5 read at `MPI_Init` when they are started directly by a resource
manager (as under Flux's PMIx plugin or Slurm's `--mpi=pmix`): sizes, the node and process maps, this
node's peers and leader, and each rank's node, local rank and node rank.  Ranks fill the job's nodes
in order (protocol.md §2.5 `layout`), so node i holds a consecutive block of ranks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worker.pmi import libpmix

Entry = tuple[str, int, object]


@dataclass(frozen=True)
class JobLayout:
    """Which ranks each node of a job runs; `nodes[i]` = (worker rank, task count) in node order."""

    nodes: tuple[tuple[int, int], ...]

    @classmethod
    def from_wire(cls, layout: list[list[int]]) -> JobLayout:
        nodes = tuple(sorted((int(r), int(n)) for r, n in layout))
        if not nodes or any(n < 1 for _, n in nodes):
            raise ValueError(f"every node of a job needs at least one task: {layout}")
        return cls(nodes)

    @property
    def size(self) -> int:
        return sum(n for _, n in self.nodes)

    def ranks_per_node(self) -> list[list[int]]:
        out, start = [], 0
        for _, n in self.nodes:
            out.append(list(range(start, start + n)))
            start += n
        return out

    def node_of(self, task: int) -> int:
        """The worker rank that runs `task`."""
        start = 0
        for worker, n in self.nodes:
            if task < start + n:
                return worker
            start += n
        raise ValueError(f"task {task} is outside a job of {start} tasks")


def node_name(worker_rank: int) -> str:
    """The name a worker goes by in PMIx maps: unique per rank even where ranks share a host (mc start)."""
    return f"mc-rank{worker_rank}"


def job_keys(nspace: str, layout: JobLayout, worker_rank: int, tmpdir: str,
             regex: Callable[[list[str]], str], ppn: Callable[[list[list[int]]], str]) -> list[Entry]:
    """Everything registered with `PMIx_server_register_nspace` for `nspace` on `worker_rank`."""
    workers = [w for w, _ in layout.nodes]
    node_id = workers.index(worker_rank)
    per_node = layout.ranks_per_node()
    local = per_node[node_id]
    size = layout.size
    keys: list[Entry] = [
        ("pmix.jobid", libpmix.STRING, nspace),
        ("pmix.nmap", libpmix.STRING, regex([node_name(w) for w in workers])),
        ("pmix.pmap", libpmix.STRING, ppn(per_node)),
        ("pmix.univ.size", libpmix.UINT32, size),
        ("pmix.job.size", libpmix.UINT32, size),
        ("pmix.max.size", libpmix.UINT32, size),
        ("pmix.num.nodes", libpmix.UINT32, len(workers)),
        ("pmix.job.napps", libpmix.UINT32, 1),
        ("pmix.appnum", libpmix.UINT32, 0),
        ("pmix.app.size", libpmix.UINT32, size),
        ("pmix.aldr", libpmix.PROC_RANK, 0),
        ("pmix.spawned", libpmix.BOOL, False),
        ("pmix.local.size", libpmix.UINT32, len(local)),
        ("pmix.lpeers", libpmix.STRING, ",".join(map(str, local))),
        ("pmix.lldr", libpmix.PROC_RANK, local[0]),
        ("pmix.nodeid", libpmix.UINT32, node_id),
        ("pmix.hname", libpmix.STRING, node_name(worker_rank)),
        ("pmix.tmpdir", libpmix.STRING, tmpdir),
        ("pmix.nsdir", libpmix.STRING, tmpdir),
        ("pmix.tdir.rmclean", libpmix.BOOL, True),
    ]
    for node, ranks in enumerate(per_node):
        for local_rank, rank in enumerate(ranks):
            keys.append(("pmix.pdata", libpmix.DATA_ARRAY, [
                ("pmix.rank", libpmix.PROC_RANK, rank),
                ("pmix.grank", libpmix.PROC_RANK, rank),
                ("pmix.apprank", libpmix.PROC_RANK, rank),
                ("pmix.appnum", libpmix.UINT32, 0),
                ("pmix.lrank", libpmix.UINT16, local_rank),
                ("pmix.nrank", libpmix.UINT16, local_rank),
                ("pmix.nodeid", libpmix.UINT32, node),
                ("pmix.hname", libpmix.STRING, node_name(workers[node])),
            ]))
    return keys
