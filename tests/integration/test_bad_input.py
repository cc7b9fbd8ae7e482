"""Bad input on both protocols gets a clear error where there is someone to tell, and the broker keeps
running with nothing lost (protocol.md §2.3, §3.1–3.2)."""
from __future__ import annotations

import socket
import struct
import time
from typing import Any

import msgpack
import pytest
import zmq

from minicluster.client import Client, ClientError
from minicluster.overlay import curve
from minicluster.proto import envelope, frames
from minicluster.testing import LocalCluster
from tests.integration.conftest import job, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("bad"), size=2, fanout=2, max_size=4).start()
    yield c
    c.stop()


def raw(cluster: LocalCluster) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(cluster.config.socket_path)
    s.settimeout(10)
    return s


def reply(s: socket.socket) -> dict:
    message = frames.read_blocking(s)
    assert message is not None
    return message


def still_serving(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        assert wait_for(c, c.submit(job(["true"])))["status"] == 0


def test_undecodable_frame(cluster: LocalCluster) -> None:
    with raw(cluster) as s:
        s.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        answer = reply(s)
        assert answer["ok"] is False and answer["error"]["code"] == "bad-frame"
        assert s.recv(1) == b""  # and the connection is closed
    still_serving(cluster)


def test_oversized_frame_is_refused_without_reading_it(cluster: LocalCluster) -> None:
    with raw(cluster) as s:
        s.sendall(struct.pack(">I", frames.MAX_FRAME + 1))
        answer = reply(s)
        assert answer["error"]["code"] == "bad-frame" and "exceeds" in answer["error"]["message"]
    still_serving(cluster)


@pytest.mark.parametrize("message, code", [
    ({"v": 1, "id": 7, "op": "no-such-op"}, "unknown-op"),
    ({"v": 2, "id": 7, "op": "hello"}, "version"),
    ({"v": 1, "op": "hello"}, "bad-request"),
    ({"v": 1, "id": 7, "op": "cancel", "jobs": "1"}, "bad-request"),
    ({"v": 1, "id": 7, "op": "job", "job": 10**9}, "not-found"),
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "ntasks": -1}}, "invalid-jobspec"),
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "requires": ["=bad"]}}, "invalid-jobspec"),
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "policy": "random"}}, "invalid-jobspec"),
    # Found by fuzzing (test_jobspec_fuzz*.py): a MemoryError in the matcher, an OverflowError in the idset.
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "nnodes": 2**62, "ntasks": 2**62}},
     "invalid-jobspec"),
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "array": "0-" + "9" * 40}}, "invalid-jobspec"),
    ({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], "time_limit": float("inf")}},
     "invalid-jobspec"),
    # Found by the protocol fuzz: a user name with a NUL byte reached getpwnam (ValueError, "internal").
    ({"v": 1, "id": 7, "op": "usage", "user": "a\0b"}, "bad-request"),
    ({"v": 1, "id": 7, "op": "usage", "user": str(2**32)}, "bad-request"),
    ({"v": 1, "id": 7, "op": "usage", "user": 2**63}, "bad-request"),
])
def test_bad_requests_get_clear_errors(cluster: LocalCluster, message: dict, code: str) -> None:
    with raw(cluster) as s:
        s.sendall(frames.pack(message))
        answer = reply(s)
        assert answer["ok"] is False and answer["error"]["code"] == code and answer["error"]["message"]
        # The connection stays usable after a refused request.
        s.sendall(frames.pack({"v": 1, "id": 8, "op": "hello"}))
        assert reply(s)["ok"] is True


@pytest.mark.parametrize("field", ["ntasks", "nnodes", "tasks_per_node", "cores_per_task", "gpus_per_task",
                                   "mem_per_task", "urgency", "retries", "max_retries_per_index",
                                   "max_failed_indexes", "success_count", "success_task"])
def test_integers_beyond_their_range_are_refused(cluster: LocalCluster, field: str) -> None:
    # The largest integer msgpack carries, from a raw client (mc-submit checks its options before sending).
    with raw(cluster) as s:
        s.sendall(frames.pack({"v": 1, "id": 7, "op": "submit", "jobspec": {"argv": ["true"], field: 2**64 - 1}}))
        answer = reply(s)
        assert answer["error"]["code"] == "invalid-jobspec" and answer["error"]["message"].startswith(field)


@pytest.mark.parametrize("fields, says", [
    ({"output": "out{"}, "output: '{' in 'out{' is not a placeholder"),
    ({"output": "/x/{id:70000000}"}, "'{id:70000000}' in '/x/{id:70000000}' is not a placeholder"),
    ({"env": {"A=B": "1"}}, "env: 'A=B' is not a variable name"),
    ({"env": {"A": "a\0b"}}, "env: the value of 'A' contains a NUL byte"),
    ({"argv": ["echo", "a\0b"]}, "argv: argument 1"),
    ({"cwd": "/tmp\0"}, "cwd: '/tmp\\x00' contains a NUL byte"),
])
def test_what_the_worker_could_not_start_is_refused_at_submit(cluster: LocalCluster, fields: dict, says: str) -> None:
    """These passed submit and stayed in RUN forever, pinning their cores (issue 10, item 2)."""
    with cluster.client() as c:
        with pytest.raises(ClientError) as info:
            c.call("submit", jobspec=job(["true"]) | fields)  # not c.submit: it checks before sending
        assert info.value.code == "invalid-jobspec" and says in str(info.value) and len(str(info.value)) < 300
        # A bad spec among good ones in one submit-many refuses only itself.
        answers = c.call("submit-many", jobspecs=[job(["true"]), job(["true"]) | fields])["jobs"]
        assert isinstance(answers[0], int) and answers[1]["code"] == "invalid-jobspec"
        assert wait_for(c, answers[0])["status"] == 0
    still_serving(cluster)


def test_frame_not_a_map(cluster: LocalCluster) -> None:
    with raw(cluster) as s:
        body = msgpack.packb([1, 2, 3])
        s.sendall(struct.pack(">I", len(body)) + body)
        assert reply(s)["error"]["code"] == "bad-frame"


def test_client_disconnecting_mid_stream(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        long_job = c.submit(job(["sh", "-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.1; done"]))
    for _ in range(5):
        with raw(cluster) as s:
            s.sendall(frames.pack({"v": 1, "id": 1, "op": "output", "job": long_job, "follow": True}))
            s.sendall(frames.pack({"v": 1, "id": 2, "op": "eventlog", "job": long_job, "follow": True}))
            s.sendall(b"\x00\x00")  # half a header, then gone
    with cluster.client() as c:
        assert wait_for(c, long_job)["status"] == 0
        assert b"".join(d for _, _, d in c.output(long_job)) == b"1\n2\n3\n4\n5\n"
    still_serving(cluster)


def refusals_to_a_peer(cluster: LocalCluster, frames_to_send: list[bytes], wanted: int) -> list[dict[str, Any]]:
    """Send frames as a peer holding the key (rank 2's free slot); the bodies of the `error`s rank 0 answers."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"2")
    dealer.setsockopt(zmq.LINGER, 0)
    curve.make_client(dealer, curve.load(cluster.config.curve_cert))
    dealer.connect(cluster.config.endpoint_of(0))
    answers: list[dict[str, Any]] = []
    try:
        for frame in frames_to_send:
            dealer.send(frame)
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        deadline = time.time() + 5
        while len(answers) < wanted and time.time() < deadline:
            if poller.poll(200):
                msg = msgpack.unpackb(dealer.recv(), raw=False)
                if msg[1] == "error":
                    answers.append(msg[4])
    finally:
        dealer.close()
        ctx.term()
    return answers


def test_malformed_overlay_frames_from_an_authenticated_peer(cluster: LocalCluster) -> None:
    """Garbage, a wrong version and an unknown kind."""
    answers = refusals_to_a_peer(cluster, [b"\xc1not msgpack", msgpack.packb([1, "hb", "two", 0, {}]),
                                           msgpack.packb([9, "hb", 2, 0, {}]),
                                           envelope.encode(envelope.Message("no-such-kind", 2, 0, {}))], 2)
    assert sorted(a["code"] for a in answers) == ["unknown-kind", "version"]
    still_serving(cluster)
    assert cluster.rank_states()[1] == "up"


def test_overlay_bodies_are_checked_at_the_edge(cluster: LocalCluster) -> None:
    """Typed messages (minicluster/proto/messages.py): a mistyped body is refused naming the field, before any
    handler reads it; the peer never joins and the broker keeps serving."""
    answers = refusals_to_a_peer(cluster, [envelope.encode(envelope.Message("join", 2, 0, body)) for body in (
        {"pid": "me", "resources": {}}, {"pid": 1, "resources": [1, 2]})], 2)
    assert [(a["code"], a["message"], a["ref"]) for a in answers] == [
        ("bad-request", "join: field 'pid' has the wrong type", "join"),
        ("bad-request", "join: field 'resources' has the wrong type", "join")]
    still_serving(cluster)
    with cluster.client() as c:
        assert 2 not in {r["rank"] for r in c.resources()}


def test_a_worker_refuses_a_malformed_message_and_keeps_running(cluster: LocalCluster) -> None:
    """Rank 0 → worker and worker ↔ worker kinds are checked where the worker reads them: a mistyped
    `pmix-dmodex` (routed through rank 0 to worker 1, and to rank 0's own agent) and a `kill` without a
    signal are answered with `error` naming the field; before, each raised inside the agent's handler."""
    bodies = [(1, "pmix-dmodex", {"job": 1, "task": "0", "id": 1, "from": 2}),
              (0, "pmix-dmodex", {"job": 1, "task": 0, "id": 1}),
              (1, "kill", {"keys": [[1, 0]]})]
    answers = refusals_to_a_peer(cluster, [envelope.encode(envelope.Message(kind, 2, dst, body))
                                           for dst, kind, body in bodies], 3)
    assert sorted((a["code"], a["message"], a["ref"]) for a in answers) == [
        ("bad-request", "kill: missing field 'signal'", "kill"),
        ("bad-request", "pmix-dmodex: field 'task' has the wrong type", "pmix-dmodex"),
        ("bad-request", "pmix-dmodex: missing field 'from'", "pmix-dmodex")]
    assert cluster.rank_states()[1] == "up"
    still_serving(cluster)


def test_client_library_reports_errors(cluster: LocalCluster) -> None:
    with cluster.client() as c:
        with pytest.raises(ClientError) as info:
            c.job(123456)
        assert info.value.code == "not-found"
    with pytest.raises(ClientError) as info:
        Client("unix:///nonexistent/socket")
    assert "cannot reach" in str(info.value)
