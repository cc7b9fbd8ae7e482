"""`mc start`: a whole MiniCluster as local processes, the embedded default (like `flux start`).

The launcher writes a config and a fresh CURVE certificate into the state dir, then forks the broker and
N-1 workers from this already-imported, single-threaded process (cheap: no interpreter start per rank).
Each child runs the same code as `mc broker` / `mc worker` in a pod.  With a command, the broker runs it once
every rank joined, and its status is ours; without one, the instance runs until `mc shutdown` or a signal.
Nothing is left behind: ranks that do not exit are killed, and so are tasks recorded in their pidfiles.
A worker rank that dies while the instance runs is started again, as Kubernetes restarts a pod (`_Restarts`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from broker.durable.statelock import StateLock
from minicluster import config as config_mod
from minicluster import exitcodes
from minicluster.cli.argparser import Parser
from minicluster.cli.common import UsageError
from minicluster.cli.options import positive_int
from minicluster.overlay import curve

EXIT_GRACE = 10.0
# A lost worker is restarted after RESTART_FIRST s, twice as long after each quick failure up to RESTART_MAX s (a
# pod's CrashLoopBackOff, shorter); a run of RESTART_RESET s starts the count again, and after RESTART_LIMIT quick
# failures in a row the rank stays down (said on stderr, as each restart is).
RESTART_FIRST, RESTART_MAX, RESTART_RESET, RESTART_LIMIT = 1.0, 30.0, 60.0, 10


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="mc start", description="start a local MiniCluster", epilog=(
        "Without a command, mc start runs in the foreground until `mc shutdown`, SIGTERM, SIGHUP or a second "
        "Ctrl-C; `mc start --size 4 -- bash` gives a shell inside the instance instead. A worker rank that dies "
        "is restarted after a delay that grows with each quick failure (1 s to 30 s), as its pod would be. The "
        "broker is not restarted if it dies: the instance stops (in Kubernetes, its pod is restarted)."))
    p.add_argument("--size", type=positive_int, default=1, help="number of ranks, broker included (default 1)")
    p.add_argument("--fanout", type=positive_int, default=32, help="tree fanout (default 32)")
    p.add_argument("--state-dir", help="keep the journal here; an existing one is resumed (default: temporary)")
    p.add_argument("--test-exec", action="store_true", help="complete tasks without running them (benchmarks)")
    p.add_argument("--resources", default="", help="override discovered resources, e.g. cores=64,gpus=4")
    p.add_argument("--properties", default="", help="node properties for every rank, e.g. zone=a,spot")
    p.add_argument("--policy", default="first-fit", choices=config_mod.POLICIES)
    p.add_argument("--transport", choices=("ipc", "tcp"), default="ipc", help="overlay transport (default ipc)")
    p.add_argument("--cert", help="CURVE certificate file to use instead of a fresh one")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other config key, e.g. --set lost_after=5, --set 'queues={debug={priority=100}}' "
                        "(a TOML inline table; repeatable)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run this inside the instance")
    return p


def local_endpoint(transport: str, state_dir: Path, ranks: int) -> tuple[str, int]:
    """(endpoint pattern, port_base) for `ranks` ranks on this host: ipc sockets in the state dir, or a run of
    free loopback TCP ports."""
    if transport == "ipc":
        return f"ipc://{state_dir}/overlay-{{rank}}.sock", 0
    return "tcp://127.0.0.1:{port}", _free_port_range(ranks)


def _free_port_range(count: int) -> int:
    """A base port with `count` consecutive free ports (checked, not reserved: good enough for one host)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
        try:
            probes = []
            for port in range(base, base + count):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return base
    raise OSError(f"no {count} consecutive free TCP ports on 127.0.0.1")


def _overrides(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise config_mod.ConfigError(f"--set {pair!r}: expected KEY=VALUE")
        value: object = text
        if text.startswith(("{", "[")):
            # A TOML inline table or array: --set 'queues={debug={priority=100}}'
            try:
                out[key] = tomllib.loads(f"value = {text}")["value"]
            except tomllib.TOMLDecodeError as exc:
                raise config_mod.ConfigError(f"--set {key}: {text!r} is not a TOML table or array: {exc}") from None
            continue
        for cast in (int, float):
            try:
                value = cast(text)
                break
            except ValueError:
                pass
        if text in ("true", "false"):
            value = text == "true"
        out[key] = value
    return out


def build_config(args: argparse.Namespace, state_dir: Path) -> config_mod.InstanceConfig:
    from worker.resources import parse_override

    try:
        parse_override(args.resources)
    except ValueError as exc:  # found now rather than by every rank once forked
        raise UsageError(f"--resources: {exc}") from None
    path = state_dir / "config.toml"
    if path.exists():
        base = config_mod.load(path)
        return base.replace(test_exec=args.test_exec or base.test_exec)
    cert = Path(args.cert) if args.cert else curve.create(state_dir / "curve")
    endpoint, port_base = local_endpoint(args.transport, state_dir, args.size)
    values = dict(
        name=f"local-{os.getpid()}", size=args.size, fanout=args.fanout, endpoint=endpoint, port_base=port_base,
        curve_cert=str(cert.resolve()), state_dir=str(state_dir), test_exec=args.test_exec,
        resources=args.resources, properties=args.properties, policy=args.policy,
        lost_after=5.0, reattach_timeout=5.0,
    )
    values.update(_overrides(args.set))
    config = config_mod.from_mapping(values, source="--set")
    config.check_access_group()
    return config


def _fork_rank(config_path: str, rank: int, command: list[str] | None, lock: StateLock) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from minicluster.cli import boot

        if rank == 0:
            code = boot.run_broker(config_path, command, lock)  # the broker holds the lock with us
        else:
            lock.forget()
            code = boot.run_worker(config_path, rank, guarded=False)  # _supervise guards it
    except BaseException as exc:  # the child must never return into the launcher's code
        print(f"mc start: rank {rank}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _preload() -> None:
    """Import what every rank needs once, before forking, so no child pays for it."""
    import broker.service  # noqa: F401
    import worker.service  # noqa: F401


def _wait(pid: int, deadline: float | None) -> int | None:
    while True:
        try:
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:
            return None
        except InterruptedError:
            continue
        if done:
            return os.waitstatus_to_exitcode(status)
        if deadline is not None and time.time() > deadline:
            return None
        time.sleep(0.02)


def _stop_all(pids: dict[int, int], state_dir: Path, ranks: int) -> None:
    deadline = time.time() + EXIT_GRACE
    for pid in pids.values():
        if _wait(pid, deadline) is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait(pid, None)
    from worker.containment import kill_instance_leftovers

    kill_instance_leftovers(str(state_dir), range(ranks))  # rank 0 included


class _Restarts:
    """When each worker rank that died is started again, and whether it still is."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}  # rank -> when its process was started (monotonic)
        self.quick: dict[int, int] = {}  # rank -> failures in a row that came before RESTART_RESET s
        self.due: dict[int, float] = {}  # rank -> when to start it again

    def ended(self, rank: int, code: int, now: float) -> None:
        """The rank's process ended with `code` (as os.waitstatus_to_exitcode): schedule it again, or say why not."""
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        if code == 0:  # told to stop
            return
        if 0 < code < 128:  # a failure a restart would not fix (minicluster/exitcodes.py)
            print(f"mc start: rank {rank} {how}; it is not restarted", file=sys.stderr, flush=True)
            return
        quick = 0 if now - self.started.get(rank, now) >= RESTART_RESET else self.quick.get(rank, 0)
        if quick >= RESTART_LIMIT:
            print(f"mc start: rank {rank} {how}; it failed {quick} times in a row, it stays down", file=sys.stderr,
                  flush=True)
            return
        self.quick[rank] = quick + 1
        delay = min(RESTART_FIRST * 2 ** quick, RESTART_MAX)
        self.due[rank] = now + delay
        print(f"mc start: rank {rank} {how}; restarting it in {delay:g} s", file=sys.stderr, flush=True)

    def take_due(self, now: float) -> list[int]:
        ranks = [rank for rank, when in self.due.items() if when <= now]
        for rank in ranks:
            del self.due[rank]
            self.started[rank] = now
        return ranks


def _supervise(pids: dict[int, int], start: Callable[[int], int], stopping: list[int],
               cleanup: Callable[[int], object]) -> int | None:
    """Wait for rank 0 to end, restarting the worker ranks that die meanwhile; rank 0's status (None: unknown).
    The launcher is each worker's guard (worker/containment.py): `cleanup(rank)` kills what the tasks of a worker
    that did not end in order left, the moment it is reaped, before any restart. No worker is restarted once
    `stopping` holds a signal: the instance is on its way out."""
    restarts = _Restarts()
    for rank in pids:
        restarts.started[rank] = time.monotonic()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if not pid:
            for due in [] if stopping else restarts.take_due(time.monotonic()):
                pids[due] = start(due)
            time.sleep(0.05)
            continue
        ended = next((r for r, p in pids.items() if p == pid), None)
        if ended is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if ended == 0:
            return code
        del pids[ended]
        if code not in (0, exitcodes.DISRUPTED):  # the two orderly ends, which end the worker's tasks first
            cleanup(ended)
        if not stopping:
            restarts.ended(ended, code, time.monotonic())


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    temporary = args.state_dir is None
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="mc-")).resolve()
    if state_dir.exists() and not state_dir.is_dir():
        raise UsageError(f"--state-dir {args.state_dir}: not a directory")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        # Before the config is rewritten or any rank forked: a live instance on this dir keeps it.
        lock = StateLock(str(state_dir))
        config = build_config(args, state_dir)
        config_path = str(state_dir / "config.toml")
        config_mod.write(config, config_path)
        _preload()
        return _run(config, config_path, command or None, state_dir, lock)
    finally:
        if temporary:
            shutil.rmtree(state_dir, ignore_errors=True)


def _run(config: config_mod.InstanceConfig, config_path: str, command: list[str] | None, state_dir: Path,
         lock: StateLock) -> int:
    uri = f"unix://{config.socket_path}"
    pids: dict[int, int] = {}
    stop_signal: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        # With a command, Ctrl-C belongs to it (mc run cancels its job); a second one stops everything.
        if command and signum == signal.SIGINT and not stop_signal:
            stop_signal.append(signum)
            return
        stop_signal.append(signum)
        # Every rank leaves on SIGTERM; none tells the others to stop (minicluster/exitcodes.py).
        _signal_all(pids, signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    os.environ["MC_URI"] = uri
    pids[0] = _fork_rank(config_path, 0, command, lock)
    for rank in range(1, config.size):
        pids[rank] = _fork_rank(config_path, rank, None, lock)
    if not command:
        print(f"MiniCluster {config.name}: {config.size} rank(s); state in {state_dir}\n"
              f"connect with:  export MC_URI={uri}\nstop with:     mc shutdown (or Ctrl-C, SIGTERM)",
              file=sys.stderr, flush=True)
    # Rank 0 stays in `pids` while it runs, so a signal can still reach it.
    from worker.containment import kill_rank_leftovers

    status = _supervise(pids, lambda rank: _fork_rank(config_path, rank, None, lock), stop_signal,
                        lambda rank: kill_rank_leftovers(str(state_dir), rank, uri))
    pids.pop(0, None)
    if status is not None and status < 0:
        print(f"mc start: the broker (rank 0) was killed by {signal.Signals(-status).name}; a local instance does "
              f"not restart its broker, stopping the workers", file=sys.stderr, flush=True)
        _signal_all(pids, signal.SIGTERM)
    _stop_all(pids, state_dir, config.tree_size)
    if status is None:
        return 1
    if status < 0:
        return 128 - status
    late = [s for s in stop_signal if s != signal.SIGINT]
    # Stopped by a signal and nothing else to report (the ranks it stopped say 143, a disruption): exit as a
    # process that signal ended would.
    return 128 + late[0] if late and status in (0, exitcodes.DISRUPTED) and not command else status


def _signal_all(pids: dict[int, int], sig: int) -> None:
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
