"""Rank 0's core per task without sockets or processes: tests/unit/core_rig.py driven through plain jobs or an array.

    python benchmarks/core_cpu.py jobs|array|window N [--profile FILE]
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/core_cpu.py jobs 600   # instructions

The real JobManager, Execution, scheduler and sqlite journal (on tmpfs), one worker rank of 8 cores, a fake clock.
Every message rank 0 sends is msgpack-encoded and decoded, and typed-decoded as its receiver would; each `done`
goes the same way before rank 0 reads it. `jobs`: 8 single-task jobs submitted per scheduling pass; `array`: one
N-element array with `dispatch_window = 0`; `window`: the same with a dispatch window of 32 and elements that
take no time (each core runs a chain of elements sent ahead, as on a big test-executor array). Prints the
process CPU time per task (both threads: the journal writer's too).

On a shared machine, CPU time moves by ±15 % from run to run; the instructions valgrind counts do not. Run it
under callgrind for N and for a larger N: the difference of the two totals over the difference of N is the
instructions per task, start-up left out. PYTHONPATH=OTHER_CHECKOUT measures another tree the same way (the
script adds its own tree only when run from it). Not a timed test.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TREE = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or Path(__file__).resolve().parents[1])
sys.path[:0] = [str(TREE), str(TREE / "tests" / "unit")]

import core_rig  # type: ignore[import-not-found]  # noqa: E402  (tests/unit of the tree measured)
from minicluster.config import InstanceConfig  # noqa: E402
from minicluster.proto import envelope, messages  # noqa: E402
from minicluster.proto.envelope import Message  # noqa: E402
from minicluster.testing import comm  # noqa: E402

TYPED = hasattr(messages, "decode_order")  # trees before typed messages decoded nothing at the receiver


def _over_the_wire(kind: str, src: int, dst: int, body: dict[str, Any]) -> Message:
    received = envelope.decode(envelope.encode(Message(kind, src, dst, body)))
    if TYPED and kind in messages.TO_WORKER:
        messages.decode_order(kind, received.body)
    return received


def _send(self: comm.RecordingSender, kind: str, dst: int, body: dict[str, Any]) -> None:
    self.sent.append(_over_the_wire(kind, 0, dst, body))


comm.RecordingSender.send = _send  # type: ignore[method-assign]  # the test kit's sender, without its own checks


class _Worker:
    """The worker ranks as rank 0 sees them: each task sent ends at the next `done`, and an element sent ahead
    starts the moment the task it follows ends (protocol.md §2.10), as the agent does."""

    def __init__(self, core: core_rig.Core) -> None:
        self.core = core
        self.running: list[tuple[int, list[Any]]] = []  # (rank, run entry)
        self.behind: dict[tuple[int, int], tuple[int, list[Any]]] = {}  # (job, task it follows) -> (rank, entry)

    def _receive(self) -> None:
        for m in self.core.sender.take("run"):
            self.running += [(m.dst, entry) for entry in m.body["tasks"]]
        for m in self.core.sender.take("ahead"):
            for entry in m.body["tasks"]:
                self.behind[(entry[0], entry[6])] = (m.dst, entry)
        self.core.sender.take()

    async def cycle(self) -> int:
        """One scheduling pass, then every running task ends at once. The number of tasks that ended."""
        core = self.core
        core.schedule()
        await core.durable()
        self._receive()
        results: dict[int, list[list[Any]]] = {}
        now = core.clock()
        # With the window, tasks that take no time: its depth is the most it allows (`depth_of`).
        started = now if getattr(core.config, "dispatch_window", 0) else now - 1
        ended, self.running = self.running, []
        for rank, entry in ended:
            results.setdefault(rank, []).append([entry[0], entry[1], 0, 0, None, None, started, now])
            following = self.behind.pop((entry[0], entry[1]), None)
            if following is not None:
                self.running.append(following)
        for rank, rows in results.items():
            body = _over_the_wire("done", rank, 0, {"results": rows}).body
            if TYPED:
                done = messages.decode("done", body)
                assert isinstance(done, messages.Done)
                body = {"results": done.results}
            core.execution.on_done(rank, body["results"])
        await core.durable()
        self._receive()
        return sum(map(len, results.values()))


async def drive(case: str, n: int, profile: cProfile.Profile | None) -> float:
    """CPU µs per task of n plain jobs or an n-element array."""
    fields = InstanceConfig.__dataclass_fields__
    settings = ({"dispatch_window": 32 if case == "window" else 0}) if "dispatch_window" in fields else {}
    async with core_rig.started(Path(tempfile.mkdtemp()), **settings) as core:
        core.add_rank(1, "cores=8,memory=4096")
        if profile is not None:
            profile.enable()
        start, done, worker = time.process_time(), 0, _Worker(core)
        if case in ("array", "window"):
            core.submit(array=f"1-{n}")
            await core.durable()
        while done < n:
            if case == "jobs":
                for _ in range(8):
                    core.submit()
                await core.durable()
            done += await worker.cycle()
        cpu = time.process_time() - start
        if profile is not None:
            profile.disable()
    return cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=("jobs", "array", "window"))
    parser.add_argument("n", type=int)
    parser.add_argument("--profile", help="write a cProfile of the timed part here")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    us = asyncio.run(drive(args.case, args.n, profile))
    if profile is not None:
        profile.dump_stats(args.profile)
    print(f"{TREE}: {args.case} {us:.1f} us CPU per task")


if __name__ == "__main__":
    main()
