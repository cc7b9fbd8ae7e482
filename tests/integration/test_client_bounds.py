"""What a client can make the broker do (issue 10 item 7): every request gets its final response (an event log
read from beyond the 64-bit range included), an error never echoes unbounded input, a request id still in use is
refused, and clients parked inside huge frames do not stop the others. The memory each abuse costs the broker is
measured by benchmarks/abuse.py."""
from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minicluster.client import Client, ClientError
from minicluster.proto import frames
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, started, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("bounds"), size=1) as c:
        yield c


def connect(cluster: LocalCluster) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(cluster.config.socket_path)
    return sock


def send(sock: socket.socket, req_id: int, op: str, **fields: Any) -> None:
    sock.sendall(frames.pack({"v": frames.VERSION, "id": req_id, "op": op, **fields}))


def receive(sock: socket.socket) -> dict[str, Any]:
    message = frames.read_blocking(sock)
    assert message is not None, "the broker closed the connection"
    return message


def test_an_eventlog_from_beyond_64_bits_is_answered(client: Client) -> None:
    job_id = client.submit(job(["true"]))
    wait_for(client, job_id)
    rid = client.request("eventlog", job=job_id, **{"from": 1 << 63})
    with pytest.raises(ClientError) as refused:
        assert client.next_response([rid], timeout=20) is not None, "no answer: the stream never ended"
    assert refused.value.code == "bad-request" and "out of range" in str(refused.value)
    assert [e[2] for e in client.eventlog(job_id, from_=(1 << 63) - 1)] == []


def test_an_error_never_echoes_a_huge_request(cluster: LocalCluster) -> None:
    with connect(cluster) as sock:
        send(sock, 1, "\0" * (5 << 20))  # its repr is four times as long: 20 MiB, over the frame limit
        error = receive(sock)
        assert error["id"] == 1 and error["error"]["code"] == "unknown-op"
        assert len(error["error"]["message"]) <= 1000 and error["error"]["message"].endswith("…")
        send(sock, 2, "hello")
        assert receive(sock)["ok"] is True, "the connection is still usable"


def test_a_request_id_still_open_is_refused(cluster: LocalCluster, client: Client) -> None:
    running = client.submit(job(["sleep", "60"]))
    started(client, running)
    with connect(cluster) as sock:
        send(sock, 7, "wait", jobs=[running])
        send(sock, 7, "wait", jobs=[running])
        refused = receive(sock)
        assert refused["id"] == 7 and refused["error"]["code"] == "bad-request"
        assert "in use" in refused["error"]["message"]
        client.cancel([running])
        assert receive(sock)["job"] == running  # the first wait is answered once
        assert receive(sock) == {"v": 1, "id": 7, "ok": True}
        send(sock, 7, "hello")  # and its id is free again
        assert receive(sock)["ok"] is True


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def push_all(socks: list[socket.socket], data: bytes) -> None:
    """Send `data` on every socket until all of it went or the broker has stopped taking any for a second."""
    left = {sock: memoryview(data) for sock in socks}
    for sock in socks:
        sock.setblocking(False)
    while left:
        _, writable, _ = select.select([], list(left), [], 1.0)
        if not writable:
            return
        for sock in writable:
            with contextlib.suppress(BlockingIOError):
                sent = sock.send(left[sock][:1 << 20])
                left[sock] = left[sock][sent:]
                if not left[sock]:
                    del left[sock]


def test_clients_parked_inside_huge_frames_do_not_grow_the_broker(cluster: LocalCluster) -> None:
    broker = cluster.procs[0].pid
    before = rss_mb(broker)
    parked = [connect(cluster) for _ in range(24)]
    try:
        partial = frames.HEADER.pack(frames.MAX_FRAME) + b"\0" * (12 << 20)
        push_all(parked, partial)  # 16 MiB frames announced, 12 MiB of each sent: 288 MiB if all were read
        with connect(cluster) as sock:
            send(sock, 1, "hello")  # and the others are still served
            assert receive(sock)["ok"] is True
        grown = rss_mb(broker) - before
        assert grown < 120, f"the broker grew {grown:.0f} MiB holding parked frames"
    finally:
        for sock in parked:
            sock.close()


def test_unread_pipelined_output_requests_do_not_grow_the_broker(cluster: LocalCluster, client: Client) -> None:
    chatty = client.submit(job(["sh", "-c", "head -c 16777216 /dev/zero | tr '\\0' x | fold -w 1000"]))
    assert wait_for(client, chatty)["status"] == 0
    broker = cluster.procs[0].pid
    before = rss_mb(broker)
    with connect(cluster) as sock:
        push_all([sock], b"".join(frames.pack({"v": 1, "id": i, "op": "output", "job": chatty})
                                  for i in range(1, 61)))
        with connect(cluster) as other:  # once this is answered the broker has had its turn at all 60
            send(other, 1, "hello")
            assert receive(other)["ok"] is True
            send(other, 2, "output", job=chatty)  # and another client still reads the output
            assert receive(other)["chunks"]
        grown = rss_mb(broker) - before
        assert grown < 120, f"the broker grew {grown:.0f} MiB holding 60 unread output streams"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[LocalCluster, Path]]:
    """A one-rank instance of this test's own, whose broker's log is kept (it will be stopped or starved)."""
    cluster = LocalCluster(tmp_path / "state", size=1)
    log = tmp_path / "broker.log"
    try:
        with open(log, "wb") as out:
            cluster.start_rank(0, stderr=out)
        cluster.wait_up()
        yield cluster, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.procs[0].pid, signal.SIGCONT)
        cluster.stop()


def mc_with_timeout(cluster: LocalCluster, *argv: str, seconds: str = "2") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MC_URI": cluster.uri, "MC_CLIENT_TIMEOUT": seconds}
    return subprocess.run(["mc", *argv], capture_output=True, text=True, env=env, timeout=20)


def fill_listen_queue(path: str) -> list[socket.socket]:
    """Connections the stopped broker cannot accept, until its listen queue is full."""
    queued: list[socket.socket] = []
    try:
        for _ in range(10_000):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            queued.append(sock)
            sock.setblocking(False)
            sock.connect(path)
    except BlockingIOError:
        return queued
    raise AssertionError("the listen queue never filled")


@pytest.mark.long
def test_a_stopped_broker_gets_a_clear_timeout_not_a_client_that_waits_forever(
        own_broker: tuple[LocalCluster, Path]) -> None:
    cluster, _log = own_broker
    broker = cluster.procs[0].pid
    os.kill(broker, signal.SIGSTOP)
    try:
        for argv in (("jobs",), ("status",), ("submit", "true")):
            out = mc_with_timeout(cluster, *argv)
            assert out.returncode == 1, (argv, out)
            assert out.stderr.startswith(f"mc {argv[0]}: error: the MiniCluster at ") and \
                "did not answer within 2 s" in out.stderr and "MC_CLIENT_TIMEOUT" in out.stderr, out.stderr
        queued = fill_listen_queue(cluster.config.socket_path)
        try:  # a client beyond the listen queue is not even accepted: it gives up connecting, as clearly
            with pytest.raises(ClientError) as unaccepted:
                Client(cluster.uri, timeout=1)
            assert unaccepted.value.code == "timeout"
            assert "did not accept the connection within 1 s" in str(unaccepted.value)
        finally:
            for sock in queued:
                sock.close()
    finally:
        os.kill(broker, signal.SIGCONT)
    # Waiting for a job is not an answer: it is not bounded by the timeout.
    waited = mc_with_timeout(cluster, "submit", "--wait", "sleep", "3", seconds="1")
    assert waited.returncode == 0, waited.stderr


def test_at_its_descriptor_limit_the_broker_refuses_new_clients_cleanly(own_broker: tuple[LocalCluster, Path]) -> None:
    """Lowered under the broker's feet, the open-files limit first stops clients short of the descriptors the
    broker keeps for its own work, then leaves it none at all. Either way a new client is told `unavailable` at
    once, one line is logged, clients already connected are served, and new ones are again once it is raised."""
    cluster, log = own_broker
    broker = cluster.procs[0].pid
    soft, hard = resource.prlimit(broker, resource.RLIMIT_NOFILE)
    held: list[Client] = []

    def refused_at_once() -> None:
        with pytest.raises(ClientError) as refused, Client(cluster.uri, timeout=10) as client:
            client.hello()
        assert refused.value.code == "unavailable" and "open-files limit" in str(refused.value)

    try:
        held.append(cluster.client())
        held[0].jobs(all=True)  # the journal's reader is open: what follows is met by clients alone
        subprocess.run(["prlimit", f"--pid={broker}", f"--nofile=256:{hard}"], check=True, timeout=10)
        with pytest.raises(ClientError) as stopped:
            for _ in range(256):
                held.append(Client(cluster.uri, timeout=10))
                held[-1].hello()
        held.pop().close()
        assert stopped.value.code == "unavailable"
        spare = 256 - len(os.listdir(f"/proc/{broker}/fd"))
        assert spare > 0, "clients were refused only once the broker had no descriptor left"
        subprocess.run(["prlimit", f"--pid={broker}", f"--nofile={256 - spare}:{hard}"], check=True, timeout=10)
        for _ in range(50):  # none left at all: refusals go on as long as it lasts, the accept loop works
            refused_at_once()
        assert all(client.hello()["size"] == 1 for client in held)
    finally:
        resource.prlimit(broker, resource.RLIMIT_NOFILE, (soft, hard))
        for client in held:
            client.close()
    with cluster.client() as client:
        assert client.hello()["size"] == 1
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    assert text.count("client connection refused at the open-files limit") == 1, text[-3000:]
