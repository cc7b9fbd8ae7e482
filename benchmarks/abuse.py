"""What a hostile (or careless) client costs the broker: its peak RSS and its longest stall per abuse case.

    python benchmarks/abuse.py [--json] [--quick] [--only parked,output,wait-ids,arrays,submit-many,restart]

Each case runs against a fresh one-rank instance (LocalCluster). The broker's peak RSS is its VmHWM after the
case, next to its VmHWM when it came up (`rss_mb`: start, peak). The stall is the longest round trip of a `hello`
that a second client sends every 10 ms while the case runs: how long the broker's loop did not answer.

parked       60 connections each send a 16 MiB frame's header and 15 MiB of its body, then wait.
output       one connection sends 200 `output` requests for a job that printed 16 MiB, and reads nothing.
wait-ids     one connection sends 20,000 `wait` requests for a running job, all with the same id.
arrays       20 held arrays of 10^8 elements each.
submit-many  one `submit-many` of 100,000 specs (test executor).
restart      a running 10^8-element array (test executor, tasks of 1 h), then kill -9 of the broker and a
             restart: how long until it answers, the new broker's peak RSS, and its longest stall through the
             reattach window and after.

--quick: a tenth of each count (6 parked connections, 10^7-element arrays, ...).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minicluster.client import Client, ClientError  # noqa: E402
from minicluster.proto import frames  # noqa: E402
from minicluster.testing import LocalCluster  # noqa: E402

ENV = {"PATH": os.environ.get("PATH", os.defpath)}


def spec(argv: list[str], **fields: Any) -> dict[str, Any]:
    return {"argv": argv, "env": ENV, "cwd": "/tmp", **fields}


def vm(pid: int, key: str) -> float:
    """A /proc/PID/status size in MiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class Pinger:
    """Sends `hello` every 10 ms from a thread; the longest round trip is the broker's longest stall."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.uri) as c:
            while not self._stop.is_set():
                t0 = time.monotonic()
                with contextlib.suppress(ClientError, OSError):
                    c.hello()
                self.longest = max(self.longest, time.monotonic() - t0)
                time.sleep(0.01)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def raw(cluster: LocalCluster) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(cluster.config.socket_path)
    return sock


def request(req_id: int, op: str, **fields: Any) -> bytes:
    return frames.pack({"v": frames.VERSION, "id": req_id, "op": op, **fields})


def push_all(socks: list[socket.socket], data: bytes, idle: float = 2.0) -> int:
    """Send `data` on every socket until all went or the broker took nothing for `idle` s; bytes sent."""
    left = {sock: memoryview(data) for sock in socks}
    for sock in socks:
        sock.setblocking(False)
    sent = 0
    while left:
        _, writable, _ = select.select([], list(left), [], idle)
        if not writable:
            break
        for sock in writable:
            with contextlib.suppress(BlockingIOError, ConnectionError):
                n = sock.send(left[sock][:1 << 20])
                sent += n
                left[sock] = left[sock][n:]
                if not left[sock]:
                    del left[sock]
    return sent


@contextlib.contextmanager
def instance(**settings: Any) -> Iterator[LocalCluster]:
    with tempfile.TemporaryDirectory(prefix="mc-abuse-") as tmp, \
            LocalCluster(Path(tmp) / "mc", size=1, **settings) as cluster:
        yield cluster


def parked(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    socks = [raw(cluster) for _ in range(int(60 * scale))]
    partial = frames.HEADER.pack(frames.MAX_FRAME) + b"\0" * (15 << 20)
    try:
        # One connection after the other (sending on all at once, the broker took a few MiB of each).
        sent = sum(push_all([sock], partial, idle=0.5) for sock in socks)
        return {"connections": len(socks), "sent_mb": round(sent / 2**20)}
    finally:
        for sock in socks:
            sock.close()


def unread_output(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    with cluster.client() as c:
        chatty = c.submit(spec(["sh", "-c", "head -c 16777216 /dev/zero | tr '\\0' x | fold -w 1000"]))
        for _ in c.wait([chatty]):
            pass
    count = int(200 * scale)
    with raw(cluster) as sock:
        sent = push_all([sock], b"".join(request(i + 1, "output", job=chatty) for i in range(count)))
        time.sleep(2)  # let the broker answer into the socket nobody reads
        return {"requests": count, "sent_bytes": sent}


def wait_ids(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    with cluster.client() as c:
        running = c.submit(spec(["sleep", "600"]))
        count = int(20_000 * scale)
        with raw(cluster) as sock:
            push_all([sock], request(7, "wait", jobs=[running]) * count)
            time.sleep(1)
        c.cancel([running])
    return {"requests": count}


def arrays(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    size = int(10**8 * scale)
    with cluster.client() as c:
        ids = [c.submit(spec(["true"], array=f"0-{size - 1}", hold=True)) for _ in range(20)]
        c.cancel(ids)
    return {"arrays": 20, "elements": size}


def submit_many(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    count = int(100_000 * scale)
    with cluster.client() as c:
        t0 = time.monotonic()
        answers = c.submit_many([spec(["true"])] * count)
        took = time.monotonic() - t0
    return {"specs": count, "accepted": sum(isinstance(a, int) for a in answers), "seconds": round(took, 1)}


def restart(cluster: LocalCluster, scale: float) -> dict[str, Any]:
    size = int(10**8 * scale)
    with cluster.client() as c:
        array = c.submit(spec(["true"], array=f"0-{size - 1}", env={**ENV, "MC_TEST_RUN_DURATION": "3600"}))
        next(e for e in c.eventlog(array, follow=True) if e[2] == "start")
        time.sleep(1)
    cluster.kill(0)
    t0 = time.monotonic()
    cluster.start_rank(0)
    cluster.wait_socket(600)
    first_answer = time.monotonic() - t0
    # Through the reattach window and what follows it (the array's pending elements are expanded again).
    with Pinger(cluster.uri) as pinger:
        time.sleep(cluster.config.reattach_timeout + 3)
    return {"elements": size, "first_answer_s": round(first_answer, 2),
            "longest_stall_after_restart_s": round(pinger.longest, 3)}


CASES: dict[str, tuple[Callable[[LocalCluster, float], dict[str, Any]], dict[str, Any]]] = {
    "parked": (parked, {}),
    "output": (unread_output, {}),
    "wait-ids": (wait_ids, {}),
    "arrays": (arrays, {"test_exec": True}),
    "submit-many": (submit_many, {"test_exec": True}),
    "restart": (restart, {"test_exec": True, "resources": "cores=64"}),
}


def run_case(name: str, scale: float) -> dict[str, Any]:
    fn, settings = CASES[name]
    with instance(**settings) as cluster:
        start = vm(cluster.procs[0].pid, "VmHWM")
        with Pinger(cluster.uri) as pinger:
            details = fn(cluster, scale)
            time.sleep(0.5)
        pid = cluster.procs[0].pid
        return {"case": name, **details, "rss_mb": {"start": round(start), "peak": round(vm(pid, "VmHWM"))},
                "longest_stall_s": round(pinger.longest, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--quick", action="store_true", help="a tenth of each count")
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    args = parser.parse_args()
    results = []
    for name in args.only.split(","):
        result = run_case(name, 0.1 if args.quick else 1.0)
        results.append(result)
        if not args.json:
            print(json.dumps(result), flush=True)
    if args.json:
        print(json.dumps({"benchmark": "abuse", "quick": args.quick, "cases": results}, indent=2))


if __name__ == "__main__":
    main()
