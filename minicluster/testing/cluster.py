"""LocalCluster: a MiniCluster of real processes, one per rank, for tests and benchmarks.

Unlike `mc start`, each rank is its own `python -m minicluster broker|worker` process that can be killed and
restarted on its own, which is what the durability and node-loss tests need.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from minicluster import config as config_mod
from minicluster import runtime
from minicluster.cli.launcher import local_endpoint
from minicluster.client import Client, ClientError
from minicluster.overlay import curve


class LocalCluster:
    def __init__(self, state_dir: str | os.PathLike[str], size: int = 2, fanout: int = 2,
                 transport: str = "ipc", cert: str | None = None, **settings: Any) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cert_path = cert or str(curve.create(self.state_dir / "curve"))
        endpoint, port_base = local_endpoint(transport, self.state_dir, max(size, settings.get("max_size", 0)))
        values: dict[str, Any] = dict(
            name="test", size=size, fanout=fanout, endpoint=endpoint, port_base=port_base, curve_cert=cert_path,
            state_dir=str(self.state_dir), heartbeat_interval=0.2, unresponsive_after=0.8, lost_after=2.0,
            reattach_timeout=3.0, kill_grace=1.0,
        )
        values.update(settings)
        self.config = config_mod.from_mapping(values, source="LocalCluster")
        self.config_path = str(self.state_dir / "config.toml")
        config_mod.write(self.config, self.config_path)
        self.uri = f"unix://{self.config.socket_path}"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    # --- processes -----------------------------------------------------------------------------------------

    def start_rank(self, rank: int, config_path: str | None = None, env: dict[str, str] | None = None,
                   stderr: Any = None, wrapper: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start one rank's process; `env` adds to this process's environment, `stderr` as for Popen, and
        `wrapper` runs it through a command (e.g. `ip netns exec NS`)."""
        role = "broker" if rank == 0 else "worker"
        argv = [*wrapper, *runtime.python_argv(), "-m", "minicluster", role, "--config",
                config_path or self.config_path]
        if rank:
            argv += ["--rank", str(rank)]
        proc = subprocess.Popen(argv, env={**os.environ, "MC_URI": self.uri, **(env or {})}, stdin=subprocess.DEVNULL,
                                stderr=stderr)
        self.procs[rank] = proc
        return proc

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for rank in range(self.config.size):
            self.start_rank(rank)
        self.wait_up(timeout=timeout)
        return self

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[rank]
        proc.send_signal(sig)
        proc.wait(10)

    def restart(self, rank: int, timeout: float = 30.0) -> None:
        self.start_rank(rank)
        if rank == 0:
            self.wait_socket(timeout)
        self.wait_states({rank: "up"}, timeout)

    def stop(self) -> None:
        try:
            if self.procs.get(0) is not None and self.procs[0].poll() is None:
                with self.client() as c:
                    c.shutdown()
        except Exception:
            pass
        deadline = time.time() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        from worker.containment import kill_instance_leftovers

        kill_instance_leftovers(str(self.state_dir), range(self.config.tree_size))

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()  # a cluster that never came up must not outlive the test
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- observing -----------------------------------------------------------------------------------------

    def client(self) -> Client:
        return Client(self.uri)

    def wait_socket(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with self.client() as c:
                    c.hello()
                return
            except (OSError, ClientError):
                time.sleep(0.05)
        raise TimeoutError(f"broker socket {self.config.socket_path} did not answer in {timeout}s")

    def http_status(self) -> dict[str, Any]:
        """Rank 0's `GET /status` (docs/operator.md): needs `status_port` in the settings."""
        if not self.config.status_port:
            raise ValueError("this LocalCluster has no status_port")
        host = self.config.status_hosts()[0]
        with urllib.request.urlopen(f"http://{host}:{self.config.status_port}/status", timeout=5) as reply:
            status: dict[str, Any] = json.load(reply)
        return status

    def rank_states(self) -> dict[int, str]:
        with self.client() as c:
            return {row["rank"]: row["state"] for row in c.status()["ranks"]}

    def wait_states(self, wanted: dict[int, str], timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        states: dict[int, str] = {}
        while time.time() < deadline:
            try:
                states = self.rank_states()
            except (OSError, ClientError):
                states = {}
            if all(states.get(r) == s for r, s in wanted.items()):
                return
            time.sleep(0.05)
        raise TimeoutError(f"wanted rank states {wanted}, have {states}")

    def wait_up(self, timeout: float = 30.0) -> float:
        """Wait until every rank joined; returns the seconds it took."""
        t0 = time.time()
        self.wait_socket(timeout)
        self.wait_states(dict.fromkeys(range(self.config.size), "up"), timeout - (time.time() - t0))
        return time.time() - t0
