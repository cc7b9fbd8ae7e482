"""The rank simulator: many simulated worker ranks in a few processes, against a real rank 0.

Each simulated rank is the real `WorkerAgent` with the test executor (every task exits 0 at once, the executor
`config.test_exec` selects), so join, heartbeats, `run`/`ahead`/`done`/`done-ack`, recall and shutdown follow
worker/agent.py exactly (protocol.md §2.5–2.10). What a simulated rank leaves out is its process: it has no
ROUTER (it is a leaf, no children), no ZAP thread (only servers check keys), no process start and no per-task
process work (fork, exec, cgroups, output pipes); its ZeroMQ context, the I/O thread behind it and its event loop
are shared with the other ranks of its simulator process. Each rank has its own DEALER socket with the ZeroMQ
routing id of its rank, connected with CURVE and the instance certificate (§2.2) to its real parent, so rank 0
and, with a fanout below the size, the interior ranks (real `mc worker` processes) carry the real load.

    python -m minicluster.testing.ranksim --config PATH --ranks FIRST-LAST

runs one simulator process (it prints one JSON line, the time of its first connect, then runs until rank 0's
`shutdown` reaches every one of its ranks). `SimulatedCluster` starts rank 0, the interior ranks and the
simulator processes; benchmarks/ranksim.py measures with it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

import zmq
import zmq.asyncio

from minicluster import config as config_mod
from minicluster import runtime
from minicluster.config import InstanceConfig
from minicluster.overlay import curve
from minicluster.overlay.uplink import HOME, Uplink
from minicluster.proto import envelope
from minicluster.proto.envelope import BadMessage, Message
from minicluster.testing.cluster import LocalCluster
from worker.agent import WorkerAgent
from worker.resources import discover


class SimulatedRank:
    """One leaf rank: the real worker's uplink to its parent (with its healing, §2.4.1) and the real agent."""

    def __init__(self, ctx: zmq.asyncio.Context, config: InstanceConfig, cert: curve.Certificate, rank: int,
                 agent_resources: Any) -> None:
        self.rank = rank
        self.uplink = Uplink(ctx, config, rank, cert, self.receive)
        self.agent = WorkerAgent(config, rank, self.send, agent_resources, f"unix://{config.socket_path}")
        self.bad_frames = 0

    def send(self, kind: str, dst: int, body: dict[str, Any]) -> None:
        # A leaf routes everything up (§2.4); zmq.asyncio queues behind EAGAIN in order, as the real overlay's.
        self.uplink.send([envelope.encode(Message(kind, self.rank, dst, body))])

    async def receive(self, sock: zmq.asyncio.Socket) -> None:
        while not sock.closed:  # closed when the uplink moved (on `home`, handled here)
            frames = await sock.recv_multipart()
            try:
                msg = envelope.decode(frames[-1])
            except BadMessage:
                self.bad_frames += 1
                continue
            if msg.dst != self.rank:
                continue
            if msg.kind == HOME:
                self.uplink.go_home()
            else:
                self.agent.handle(msg)

    async def run(self) -> None:
        self.uplink.start()
        try:
            await self.agent.run()
        finally:
            await self.uplink.close()


async def run_simulator(config: InstanceConfig, cert: curve.Certificate, ranks: range, stagger: float = 0.0) -> None:
    """Run `ranks` as simulated leaves in this event loop until each got `shutdown` (or SIGTERM); with `stagger`,
    their connects are spread evenly over that many seconds, as pods that come up one after another."""
    ctx = zmq.asyncio.Context()
    # Each rank: its DEALER, and the pair of sockets its link monitor speaks over (minicluster/overlay/uplink.py).
    ctx.set(zmq.MAX_SOCKETS, 3 * len(ranks) + 64)
    # Every rank's node looks the same; discovery (reading /proc, /sys) is done once, not per rank.
    node = discover(config.resources, config.node_properties)
    loop = asyncio.get_running_loop()
    started = time.time()
    print(json.dumps({"first_connect": started, "pid": os.getpid(), "ranks": len(ranks)}), flush=True)
    runs = []
    for i, rank in enumerate(ranks):
        if stagger:
            await asyncio.sleep(max(0.0, stagger * i / len(ranks) - (time.time() - started)))
        runs.append(loop.create_task(SimulatedRank(ctx, config, cert, rank, node).run()))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [t.cancel() for t in runs])
    await asyncio.gather(*runs, return_exceptions=True)
    ctx.destroy(linger=0)


def raise_fd_limit() -> None:
    """Two file descriptors per ZeroMQ socket (its mailbox and its connection): lift the soft limit to the hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _parse_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicluster.testing.ranksim", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the instance config rank 0 was started with")
    parser.add_argument("--ranks", required=True, help="FIRST-LAST: the ranks this process simulates")
    parser.add_argument("--stagger", type=float, default=0.0, help="spread the connects over this many seconds")
    args = parser.parse_args(argv)
    config = config_mod.load(args.config)
    cert = curve.load(config.curve_cert)
    ranks = _parse_range(args.ranks)
    if ranks.start < 1 or ranks.stop > config.tree_size:
        parser.error(f"--ranks {args.ranks}: outside 1..{config.tree_size - 1}")
    raise_fd_limit()
    asyncio.run(run_simulator(config, cert, ranks, args.stagger))
    return 0


class SimulatedCluster:
    """Rank 0 and the interior ranks as real processes (LocalCluster), every leaf simulated in `processes` processes.

    `start()` starts rank 0 and waits for its socket, then the interior ranks, then the simulators; `first_connect`
    is the earliest time a simulator opened its sockets. `stop()` shuts the instance down through rank 0.
    """

    def __init__(self, state_dir: str | os.PathLike[str], size: int, processes: int = 2, fanout: int | None = None,
                 stagger: float = 0.0, nice: int = 0, wait_interior: float = 0.0, **settings: Any) -> None:
        fanout = fanout or size  # flat by default: every simulated rank is a child of rank 0
        values: dict[str, Any] = dict(test_exec=True, resources="cores=64", heartbeat_interval=1.0,
                                      unresponsive_after=10.0, lost_after=30.0)
        values.update(settings)
        self.local = LocalCluster(state_dir, size=size, fanout=fanout, **values)
        self.config = self.local.config
        # Ranks with children are real worker processes; the leaves are simulated.
        self.interior = [r for r in range(1, size) if r * fanout + 1 < size]
        leaves = [r for r in range(1, size) if r not in set(self.interior)]
        per = -(-len(leaves) // max(1, processes)) if leaves else 0
        # Contiguous blocks of leaves: the ranks of one process share their parent as far as possible.
        self.blocks = [leaves[i:i + per] for i in range(0, len(leaves), per)] if per else []
        self.simulators: list[subprocess.Popen[bytes]] = []
        self.stagger = stagger
        # On one machine the other ranks stand for other nodes: `nice` lowers their priority, not rank 0's.
        self.wrapper = ("nice", "-n", str(nice)) if nice else ()
        # Seconds to wait for the interior ranks to be up before the simulators start (0: start those at once).
        # Hundreds of interior processes start one after another on a small machine, in parallel on real nodes.
        self.wait_interior = wait_interior
        self.interior_up_s: float | None = None
        self.first_connect = 0.0

    @property
    def broker_pid(self) -> int:
        return self.local.procs[0].pid

    def start(self, timeout: float = 60.0) -> SimulatedCluster:
        self.local.start_rank(0)
        self.local.wait_socket(timeout)
        started = time.time()
        for rank in self.interior:
            self.local.start_rank(rank, wrapper=self.wrapper)
        if self.wait_interior and self.interior:
            self._wait_up(1 + len(self.interior), self.wait_interior)
            self.interior_up_s = time.time() - started
        for block in self.blocks:
            # Blocks are contiguous ranges of leaves unless an interior rank falls inside; one process per block.
            for part in _runs(block):
                self.simulators.append(subprocess.Popen(
                    [*self.wrapper, *runtime.python_argv(), "-m", "minicluster.testing.ranksim",
                     "--config", self.local.config_path, "--ranks", f"{part.start}-{part.stop - 1}",
                     "--stagger", str(self.stagger)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env={**os.environ, "MC_URI": self.local.uri}))
        starts = []
        for proc in self.simulators:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"simulator process {proc.pid} exited with {proc.wait()} before connecting")
            starts.append(json.loads(line)["first_connect"])
        self.first_connect = min(starts) if starts else time.time()
        return self

    def wait_joined(self, timeout: float = 120.0, poll: float = 0.2) -> float:
        """Wait until every rank is up; the seconds since `first_connect` (to within `poll` and one request)."""
        self._wait_up(self.config.size, timeout, poll)
        return time.time() - self.first_connect

    def _wait_up(self, count: int, timeout: float, poll: float = 0.2) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.joined() >= count:
                    return
            except OSError:  # a busy rank 0 let the HTTP request time out: not joined yet, ask again
                pass
            time.sleep(poll)
        raise TimeoutError(f"{self.joined()} of {count} ranks joined in {timeout}s")

    def joined(self) -> int:
        """How many ranks are up: from `/status`'s counts when rank 0 serves it, which rank 0 keeps as ranks change
        state, so polling it does not add a 10,000-row `status` reply to the join storm it times."""
        if self.config.status_port:
            return int(self.local.http_status()["ranks"]["up"])
        return sum(s == "up" for s in self.local.rank_states().values())

    def stop(self) -> None:
        self.local.stop()
        deadline = time.time() + 20
        for proc in self.simulators:
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> SimulatedCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _runs(ranks: list[int]) -> list[range]:
    """Split sorted ranks into maximal contiguous ranges."""
    out: list[range] = []
    for rank in ranks:
        if out and out[-1].stop == rank:
            out[-1] = range(out[-1].start, rank + 1)
        else:
            out.append(range(rank, rank + 1))
    return out


if __name__ == "__main__":
    sys.exit(main())
