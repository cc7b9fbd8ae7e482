"""`mc broker`, `mc worker` and `mc boot`: the process entry points used by pods and by `mc start`.

The rank comes from --rank or from JOB_COMPLETION_INDEX, which Kubernetes Indexed Jobs set in each pod.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from minicluster import config as config_mod
from minicluster import exitcodes, runtime
from minicluster.cli import init
from minicluster.cli.options import non_negative_int
from minicluster.overlay import curve

# The kubelet's default terminationMessagePath.
TERMINATION_LOG = "/dev/termination-log"

if TYPE_CHECKING:
    from broker.durable.statelock import StateLock


def setup_logging(rank: int) -> None:
    level = os.environ.get("MC_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s: %(message)s")


def _parser(prog: str, with_command: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", required=True, help="instance config file (TOML)")
    parser.add_argument("--rank", type=non_negative_int, help="this process's rank (default: $JOB_COMPLETION_INDEX)")
    if with_command:
        parser.add_argument("command", nargs=argparse.REMAINDER,
                            help="batch mode: run this once every rank joined, then stop with its status")
    return parser


def _rank(args: argparse.Namespace) -> int:
    if args.rank is not None:
        return int(args.rank)
    index = os.environ.get("JOB_COMPLETION_INDEX")
    if index is None or not (index.isascii() and index.isdigit()):
        raise config_mod.ConfigError("no rank: pass --rank or set JOB_COMPLETION_INDEX")
    return int(index)


def _command(args: argparse.Namespace) -> list[str] | None:
    command = list(getattr(args, "command", None) or [])
    if command and command[0] == "--":
        command = command[1:]
    return command or None


def run_broker(config_path: str, command: list[str] | None, state_lock: StateLock | None = None) -> int:
    """`state_lock`: the state dir's lock, when `mc start` took it before forking this broker."""
    from broker.service import Broker, install_signal_handlers

    config = config_mod.load(config_path)
    config.check_access_group()
    setup_logging(0)
    cert = curve.load(config.curve_cert)

    async def main() -> int:
        broker = Broker(config, cert, config_path=config_path, command=command, state_lock=state_lock)
        install_signal_handlers(broker)
        return await broker.run()

    return _run_profiled(main)


def _run_profiled(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """MC_PROFILE=FILE writes a cProfile of the whole process there (docs/performance.md#profiling)."""
    path = os.environ.get("MC_PROFILE")
    if not path:
        return asyncio.run(main())
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        return asyncio.run(main())
    finally:
        profile.disable()
        profile.dump_stats(path)


def run_worker(config_path: str, rank: int, guarded: bool = True) -> int:
    """`guarded`: fork the rank's guard (worker/containment.py); not where its parent already does a guard's work
    (`mc start`'s launcher, `mc boot` as PID 1, whose exit ends the pod's PID namespace)."""
    from worker.containment import guard
    from worker.service import run_worker as serve

    config = config_mod.load(config_path)
    setup_logging(rank)
    cert = curve.load(config.curve_cert)
    if guarded:  # before any thread: however this process ends, kill -9 included, its tasks end with it
        guard(config.state_dir, rank, f"unix://{config.socket_path}")
    return _run_profiled(lambda: serve(config, rank, cert))


def broker_main(argv: list[str]) -> int:
    args = _parser("mc broker", True).parse_args(argv)
    return run_broker(args.config, _command(args))


def worker_main(argv: list[str]) -> int:
    args = _parser("mc worker", False).parse_args(argv)
    return run_worker(args.config, _rank(args))


def _argv_json(text: str) -> list[str]:
    try:
        argv = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) for arg in argv) or not argv[0]:
        raise argparse.ArgumentTypeError("must be a JSON list of strings: the command's argv")
    return argv


def _run_step(what: str, argv: list[str], env: dict[str, str]) -> int:
    """A commands.pre or commands.post of the operator, run to its end; its status as a rank's would be."""
    try:
        code = subprocess.run(argv, env=env, check=False).returncode
    except OSError as exc:
        print(f"mc boot: cannot run the {what} command {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return code if code >= 0 else exitcodes.stopped_by(-code)


def start_problem(config: config_mod.InstanceConfig) -> str | None:
    """Why the runtime cannot run in this image as this uid (one line), or None.  The image decides the uid and
    maybe has no passwd entry for it, nor a HOME it can write, nor a writable /tmp (a read-only root filesystem):
    the programs of the image then get a HOME or TMPDIR in the state dir, which is all the runtime must write."""
    uid = os.getuid()
    try:
        os.makedirs(config.state_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=config.state_dir).close()
    except OSError as exc:
        return f"uid {uid} cannot write the state dir {config.state_dir} ({exc.strerror})"
    for name, default, fallback in (("HOME", "", "home"), ("TMPDIR", "/tmp", "tmp")):
        given = os.environ.get(name) or default
        if not (os.path.isabs(given) and os.path.isdir(given) and os.access(given, os.W_OK | os.X_OK)):
            fallback = os.path.join(config.state_dir, fallback)
            os.makedirs(fallback, mode=0o700, exist_ok=True)
            print(f"mc boot: {name} {given or '(unset)'} is no directory uid {uid} can write: the image's programs "
                  f"get {name}={fallback}", file=sys.stderr)
            os.environ[name] = fallback
    return None


def cannot_start(why: str) -> int:
    """Say why in one line, on stderr and as the container's termination message (the MiniCluster's Ready
    reason, minicluster/operator/pods.py), and exit CANNOT_START: the pod failure policy fails the Job at once."""
    line = exitcodes.CANNOT_START_MESSAGE + why
    print(line, file=sys.stderr)
    if os.access(TERMINATION_LOG, os.W_OK):  # the kubelet's file, where there is one; never created here
        with open(TERMINATION_LOG, "w") as f:
            f.write(line + "\n")
    return exitcodes.CANNOT_START


def boot_main(argv: list[str]) -> int:
    parser = _parser("mc boot", True)
    parser.add_argument("--broker-elsewhere", action="store_true",
                        help="rank 0 runs in a pod of its own (the operator's spec.storage): as rank 0, exit 0")
    parser.add_argument("--pre", type=_argv_json, metavar="JSON",
                        help="run this argv (a JSON list) before the rank starts; if it fails the rank does not "
                             "start and exits with its status")
    parser.add_argument("--post", type=_argv_json, metavar="JSON",
                        help="run this argv after the rank ended, with its status in MC_EXIT_STATUS; it fails the "
                             "rank only if the rank itself succeeded")
    args = parser.parse_args(argv)
    rank = _rank(args)
    if rank == 0 and args.broker_elsewhere:
        print("mc boot: rank 0 runs in its own pod (spec.storage); nothing to do at this index", file=sys.stderr)
        return 0
    unfit = start_problem(config_mod.load(args.config))
    if unfit:
        return cannot_start(unfit)
    pid_1 = os.getpid() == 1
    init.fork_rank()  # as a container's PID 1: reap orphans, forward signals (minicluster/cli/init.py)
    # As in Flux Operator, pre runs on every rank before it starts (so before it joins, and before the batch
    # command, which waits for every rank), post on every rank after it ended. Not in os.environ: tasks never see it.
    env = runtime.command_env(os.environ) | {"MC_RANK": str(rank)}  # an image's program: nothing of the view
    if args.pre:
        status = _run_step("pre", args.pre, env)
        if status != exitcodes.SUCCESS:
            print(f"mc boot: the pre command exited {status}; rank {rank} does not start", file=sys.stderr)
            return status
    status = run_broker(args.config, _command(args)) if rank == 0 else run_worker(args.config, rank, not pid_1)
    if args.post:
        post = _run_step("post", args.post, {**env, "MC_EXIT_STATUS": str(status)})
        status = status or post
    return status
