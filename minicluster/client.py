"""Synchronous client of the broker: protocol.md §3 (client protocol).

One `Client` is one unix-socket connection. Requests carry ids chosen here; responses are matched by
id, so many requests may be in flight at once (pipelining) and several streams (`output`, `eventlog`,
`wait`) can be followed on one connection. Not thread-safe: use one Client per thread.
"""
from __future__ import annotations

import os
import time

# The C module under `socket`: socket.py imports enum and selectors, about a third of mc-submit's start-up (issue
# 17 item 6), and a unix socket needs nothing of what it adds.
import _socket

from minicluster.proto.frames import VERSION, FrameError, not_text, pack_request, read_blocking

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on mc-submit's start-up path
if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Collection, Iterable, Iterator
    from typing import Any, TypeAlias

    from minicluster.model.jobspec import Jobspec
else:
    # collections.deque itself, without collections/__init__ (operator, keyword, reprlib): mc-submit again.
    from _collections import deque

# Where a broker listens unless told otherwise: a system instance, then the default `state_dir` (pods: the
# broker's socket is in its state dir, so `kubectl exec` finds it with no MC_URI at all).
DEFAULT_SOCKETS = ("/run/minicluster/broker.sock", "/var/lib/minicluster/run/broker.sock")
# submit-many batches stay well under the 16 MiB frame limit, whatever the size of each environment.
BATCH_BYTES = 8 * 1024 * 1024
BATCH_COUNT = 1000
JOBS_PAGE = 1000  # jobs per `jobs` response while paging (protocol.md §3.3)
# How long a client waits to connect, and for the broker to answer a request (MC_CLIENT_TIMEOUT overrides it):
# a stopped or saturated broker gets a clear error, not a client that waits forever. Streams that wait for jobs
# (`wait`, `follow`) are not bounded: a job may legitimately run for days.
DEFAULT_TIMEOUT = 60.0
_CONNECT_RETRY = 0.05
_FROM_ENV = -1.0
_SEND_CHUNK = 256 * 1024

JobspecLike: TypeAlias = "Jobspec | dict[str, Any]"


class ClientError(Exception):
    """An error response from the broker (protocol.md §3.2), or a failure to reach it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ClientError({self.code!r}, {self.message!r})"


def socket_path(uri: str | None = None) -> str:
    """The broker socket: `uri`, else $MC_URI, else the default local socket if it exists."""
    uri = uri or os.environ.get("MC_URI")
    if uri:
        if uri.startswith("unix://"):
            return uri[len("unix://"):]
        if "://" in uri:
            raise ClientError("bad-uri", f"unsupported MiniCluster URI {uri!r}: expected unix:///PATH")
        return uri
    for path in DEFAULT_SOCKETS:
        if os.path.exists(path):
            return path
    raise ClientError("no-instance", f"no MiniCluster found: set MC_URI or run inside `mc start` "
                                     f"(no broker socket at {' or '.join(DEFAULT_SOCKETS)})")


def client_timeout() -> float | None:
    """$MC_CLIENT_TIMEOUT in seconds (0 or `none`: no bound), else DEFAULT_TIMEOUT."""
    text = os.environ.get("MC_CLIENT_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    if text.lower() in ("0", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise ClientError("bad-timeout", f"MC_CLIENT_TIMEOUT={text!r}: expected seconds (a positive number), "
                                         "or 0 for no bound")
    return value


def wire_jobspec(spec: JobspecLike) -> dict[str, Any]:
    """The wire map of `spec`, validated locally so a bad jobspec fails before any I/O."""
    # Here, not at the top: `mc-submit` sends its jobspec unchecked and must not pay for importing the model.
    from minicluster.model.jobspec import InvalidJobspec, from_wire

    data = spec if isinstance(spec, dict) else spec.to_wire()
    if data.get("umask") is None:  # the submitter's, as the tools send it (protocol.md §3.4)
        data = {**data, "umask": own_umask()}
    try:
        from_wire(data)
    except InvalidJobspec as exc:
        raise ClientError("invalid-jobspec", str(exc)) from None
    return data


def own_umask() -> int:
    """This process's umask, read without setting it (os.umask would, for every thread of the caller's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise ClientError("umask", "no Umask line in /proc/self/status (Linux 4.7 or later is needed)")


class Client:
    """A connection to one MiniCluster broker. Use as a context manager, or call close()."""

    def __init__(self, uri: str | None = None, timeout: float | None = _FROM_ENV) -> None:
        """`timeout`: seconds to wait to connect and for each answer (None: no bound; default client_timeout())."""
        self.path = socket_path(uri)
        self.timeout = client_timeout() if timeout == _FROM_ENV else timeout
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._connect()
        except OSError as exc:
            self._sock.close()
            raise ClientError("connect", f"cannot reach the MiniCluster at {self.path}: "
                                         f"{exc.strerror or exc}") from None
        except ClientError:
            self._sock.close()
            raise
        self._next_id = 1
        self._open: set[int] = set()        # requests still expecting a response
        self._inbox: dict[int, deque[dict[str, Any]]] = {}
        self._discarded: set[int] = set()   # abandoned streams whose responses are dropped
        self._pending_submits: list[int] = []

    def _connect(self) -> None:
        """Connect within the timeout. A unix socket's connect waits while the broker's listen queue is full (it
        is stopped, or too busy to accept); without blocking it fails at once (EAGAIN) instead, and is tried
        again until the deadline."""
        if self.timeout is None:
            self._sock.connect(self.path)
            return
        deadline = time.monotonic() + self.timeout
        self._sock.setblocking(False)
        try:
            while True:
                try:
                    self._sock.connect(self.path)
                    return
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ClientError("timeout", self._timeout_text("accept the connection")) from None
                    time.sleep(_CONNECT_RETRY)
        finally:
            self._sock.setblocking(True)

    def _timeout_text(self, what: str) -> str:
        return (f"the MiniCluster at {self.path} did not {what} within {self.timeout:g} s: its broker is stopped "
                "or overloaded (`mc status` when it answers; MC_CLIENT_TIMEOUT sets this bound)")

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ low level: pipelined requests

    def request(self, op: str, **fields: Any) -> int:
        """Send one request without waiting for its response; returns its id."""
        rid = self._next_id
        self._next_id += 1
        self._send(pack_request({"v": VERSION, "id": rid, "op": op, **fields}))
        self._open.add(rid)
        self._inbox[rid] = deque()
        return rid

    def response(self, rid: int, bounded: bool = True) -> dict[str, Any]:
        """The next response of request `rid`, blocking; raises ClientError for an error response, and (when
        `bounded`) with code `timeout` when the broker sends nothing for `self.timeout` seconds."""
        while rid in self._inbox and not self._inbox[rid]:
            self._receive(self.timeout if bounded else None)
        got = self.next_response((rid,))
        assert got is not None
        return got[1]

    def next_response(self, rids: Collection[int], timeout: float | None = None,
                      wake: Collection[int] = ()) -> tuple[int, dict[str, Any]] | None:
        """The next response of any request in `rids`, or None after `timeout` seconds or once a file
        descriptor in `wake` is readable.

        Responses of other requests that arrive meanwhile are kept for later. A response with
        `more` true means the stream goes on; any other response is the request's last.
        """
        for rid in rids:
            if rid not in self._inbox:
                raise ValueError(f"request {rid} has no response to come")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for rid in rids:
                box = self._inbox[rid]
                if box:
                    msg = box.popleft()
                    if not box and rid not in self._open:
                        del self._inbox[rid]
                    return rid, _checked(msg)
            if deadline is not None or wake:
                import select  # here, not at the top: see _send

                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                readable, _, _ = select.select([self._sock.fileno(), *wake], [], [], left)
                if self._sock.fileno() not in readable:
                    return None
            self._receive()

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request and its single response."""
        return self.response(self.request(op, **fields))

    def stream(self, op: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """The responses of one streaming request; leaving the loop early drops the rest."""
        rid = self.request(op, **fields)
        finished = False
        # Waiting for jobs to end is not bounded, the answers to a plain read are.
        bounded = op != "wait" and not fields.get("follow")
        try:
            while True:
                msg = self.response(rid, bounded)
                finished = not msg.get("more")
                yield msg
                if finished:
                    return
        finally:
            if not finished:
                self.discard(rid)

    def discard(self, rid: int) -> None:
        """Stop caring about request `rid`: its queued and future responses are dropped."""
        self._inbox.pop(rid, None)
        if rid in self._open:
            self._discarded.add(rid)

    def _receive(self, timeout: float | None = None) -> None:
        """Read one frame; with `timeout`, the broker may be silent at most that long. A frame cut short by the
        timeout leaves the connection unusable: it is closed."""
        if timeout is not None:
            self._sock.settimeout(timeout)
        try:
            msg = read_blocking(self._sock)
        except FrameError as exc:
            raise ClientError("bad-frame", f"bad frame from the broker: {exc}") from None
        except ConnectionResetError:
            msg = None
        except TimeoutError:
            self._sock.close()
            raise ClientError("timeout", self._timeout_text("answer")) from None
        finally:
            if timeout is not None and self._sock.fileno() >= 0:
                self._sock.settimeout(None)
        if msg is None:
            raise ClientError("disconnected", "the broker closed the connection")
        rid = msg.get("id")
        final = not msg.get("more")
        if rid == 0 and msg.get("ok") is False:
            _checked(msg)   # a connection-level error (bad-frame): nothing else will follow
        if rid in self._discarded:
            if final:
                self._discarded.discard(rid)
                self._open.discard(rid)
            return
        if rid not in self._open:
            return          # not ours to match: an id we never sent or already finished
        self._inbox[rid].append(msg)
        if final:
            self._open.discard(rid)

    def _farewell(self) -> None:
        """The broker closed the connection: raise the error it closed it with, if it sent one (such as
        `unavailable` at its open-files limit, protocol.md §3.1), rather than a bare disconnection."""
        self._sock.settimeout(0.0)
        try:
            msg = read_blocking(self._sock)
        except (OSError, FrameError):
            return
        if msg is not None and msg.get("id") == 0:
            _checked(msg)

    def _send(self, data: bytes) -> None:
        """Send all of `data`, reading incoming frames meanwhile.

        A pipelining client that only writes can deadlock with a broker that is blocked writing
        responses back; reading whenever the socket is readable keeps both directions moving.
        """
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view[:_SEND_CHUNK], _socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except (BrokenPipeError, ConnectionResetError):
                self._farewell()
                raise ClientError("disconnected", "the broker closed the connection") from None
            view = view[sent:]
            if view and not sent:
                # The socket is full: wait until it takes more, reading the broker's answers meanwhile.  Only
                # now: a request that fits (mc-submit's) never imports select.
                import select

                readable, writable, _ = select.select([self._sock], [self._sock], [], self.timeout)
                if not readable and not writable:
                    raise ClientError("timeout", self._timeout_text("read a request"))
                if readable and not writable:
                    self._receive()

    # ------------------------------------------------------------ jobs

    def hello(self) -> dict[str, Any]:
        return _fields(self.call("hello"))

    def submit(self, spec: JobspecLike, check: bool = True) -> int:
        """Submit one job; returns its id once the broker has made it durable.

        `check=False` leaves checking a wire map to the broker, which refuses a bad one with the same
        `invalid-jobspec` error (and spares this process the import of the jobspec model).
        """
        data = wire_jobspec(spec) if check or not isinstance(spec, dict) else spec
        return self.call("submit", jobspec=data)["job"]

    def submit_async(self, spec: JobspecLike) -> int:
        """Send a `submit` without waiting; returns the request id. Results come from collect()."""
        rid = self.request("submit", jobspec=wire_jobspec(spec))
        self._pending_submits.append(rid)
        return rid

    def collect(self) -> list[int | ClientError]:
        """For every submit_async() since the last collect(), in order: its job id or its error."""
        rids, self._pending_submits = self._pending_submits, []
        out: list[int | ClientError] = []
        for rid in rids:
            try:
                out.append(self.response(rid)["job"])
            except ClientError as exc:
                out.append(exc)
        return out

    def submit_many(self, specs: Iterable[JobspecLike]) -> list[int | ClientError]:
        """Submit many jobs in pipelined `submit-many` batches; per job, its id or its error."""
        batches = list(_batches(specs))    # validate every jobspec before sending any
        rids = [self.request("submit-many", jobspecs=batch) for batch in batches]
        out: list[int | ClientError] = []
        for rid in rids:
            for item in self.response(rid)["jobs"]:
                if isinstance(item, dict):
                    out.append(ClientError(item.get("code", "error"), item.get("message", "")))
                else:
                    out.append(item)
        return out

    def wait(self, job_ids: Iterable[int]) -> Iterator[dict[str, Any]]:
        """`{job, status, state, exception}` for each job, as it becomes inactive."""
        for msg in self.stream("wait", jobs=list(job_ids)):
            if "job" in msg:
                yield _fields(msg)

    def jobs(self, all: bool = False, ids: Iterable[int] | None = None,
             limit: int | None = None, alloc: bool = False, priority: bool = False) -> list[dict[str, Any]]:
        """Job summaries (protocol.md §3.6), newest first; active jobs only unless `all`; `alloc` adds placements;
        `priority` adds each pending job's priority factors (`priority_components`, §3.10). Pages through the
        broker's listing (§3.3) until `limit` jobs, or all of them."""
        fields: dict[str, Any] = {"all": all}
        if alloc:
            fields["alloc"] = True
        if priority:
            fields["priority"] = True
        if ids is not None:
            fields["ids"] = list(ids)
        out: list[dict[str, Any]] = []
        while True:
            fields["limit"] = JOBS_PAGE if limit is None else min(JOBS_PAGE, limit - len(out))
            msg = self.call("jobs", **fields)
            out.extend(msg["jobs"])
            after = msg.get("next")
            if ids is not None or after is None or (limit is not None and len(out) >= limit):
                return out
            fields["before"] = after

    def job(self, job_id: int) -> dict[str, Any]:
        """One job summary; arrays also carry `failed`, the idset of failed indices."""
        msg = self.call("job", job=job_id)
        summary = dict(msg["job"])
        if "failed" in msg:
            summary["failed"] = msg["failed"]
        return summary

    def cancel(self, job_ids: Iterable[int]) -> tuple[list[int], dict[int, str]]:
        """Cancel jobs: (the cancelled ids, {job: why not} for the others)."""
        msg = self.call("cancel", jobs=list(job_ids))
        return msg.get("cancelled", []), _errors(msg)

    def eventlog(self, job_id: int, from_: int = 0, follow: bool = False) -> Iterator[list[Any]]:
        """Events `[seq, time, name, context]`; with `follow`, until the `clean` event."""
        for msg in self.stream("eventlog", job=job_id, **{"from": from_}, follow=follow):
            yield from msg.get("events", [])

    def output(self, job_id: int, follow: bool = False, index: int | None = None,
               attempt: int | None = None) -> Iterator[tuple[int, int, bytes]]:
        """Output chunks `(task, stream, data)`, stream 1 = stdout, 2 = stderr; `attempt` selects one attempt's
        output (0 the first run, 1 the first retry or requeue, ...).

        `stream("output", ...)` gives the responses themselves, with `files` and `truncated` (protocol.md §3.3).
        """
        fields: dict[str, Any] = {"job": job_id, "follow": follow}
        if index is not None:
            fields["index"] = index
        if attempt is not None:
            fields["attempt"] = attempt
        for msg in self.stream("output", **fields):
            yield from ((task, stream, data) for task, stream, data in msg.get("chunks", []))

    def task_results(self, job_id: int, from_: int = 0, limit: int | None = None,
                     errors: bool = False) -> list[list[Any]]:
        """`[task, index, rank, status, exit_code, signal, error, attempt]` per ended task, its final attempt
        (`errors`: only those with an error, such as a command not found)."""
        fields: dict[str, Any] = {"job": job_id, "from": from_, "errors": errors}
        if limit is not None:
            fields["limit"] = limit
        return self.call("task-results", **fields)["tasks"]

    def stdin(self, job_id: int, data: bytes, eof: bool = False) -> bool:
        """Write to the job's standard input (protocol.md §3.8); False once no task reads it any more."""
        return bool(self.call("stdin", job=job_id, data=data, eof=eof).get("open"))

    # ------------------------------------------------------------ workflows (protocol.md §3.9)

    def attempts(self, job_id: int, index: int | None = None, failed: bool = False, from_: int = 0,
                 limit: int | None = None) -> list[list[Any]]:
        """Every recorded attempt: `[task, index, attempt, rank, status, exit_code, signal, error, started, ended,
        outcome]`, outcome `retry`, `requeue`, `node-lost`, `broker-restart` or `final`; `failed` keeps the tasks
        that failed for good or ran more than once."""
        fields: dict[str, Any] = {"job": job_id, "from": from_, "failed": failed}
        if index is not None:
            fields["index"] = index
        if limit is not None:
            fields["limit"] = limit
        return self.call("attempts", **fields)["attempts"]

    def hold(self, job_ids: Iterable[int]) -> tuple[list[int], dict[int, str]]:
        """Keep pending jobs from starting: (the held ids, {job: why not} for the others)."""
        msg = self.call("hold", jobs=list(job_ids))
        return msg.get("held", []), _errors(msg)

    def release(self, job_ids: Iterable[int]) -> tuple[list[int], dict[int, str]]:
        """Lift holds: (the released ids, {job: why not})."""
        msg = self.call("release", jobs=list(job_ids))
        return msg.get("released", []), _errors(msg)

    def update(self, job_id: int, **changes: Any) -> dict[str, Any]:
        """Change `urgency`, `time_limit` (seconds) and/or `name` of an active job; all or nothing."""
        return self.call("update", job=job_id, **changes)["updated"]

    def requeue(self, job_ids: Iterable[int]) -> tuple[list[int], dict[int, str]]:
        """Kill running jobs and put them back in the queue; returns once they are queued again."""
        msg = self.call("requeue", jobs=list(job_ids))
        return msg.get("requeued", []), _errors(msg)

    # ------------------------------------------------------------ instance

    def resources(self) -> list[dict[str, Any]]:
        return self.call("resources")["ranks"]

    def resource_tree(self) -> dict[str, Any]:
        """The containment hierarchy with free/used/total per vertex (protocol.md §3.3)."""
        return self.call("resources", tree=True)["tree"]

    def status(self) -> dict[str, Any]:
        return _fields(self.call("status"))

    def drain(self, ranks: Iterable[int], reason: str = "") -> list[int]:
        return self.call("drain", ranks=list(ranks), reason=reason)["drained"]

    def undrain(self, ranks: Iterable[int]) -> list[int]:
        return self.call("undrain", ranks=list(ranks))["undrained"]

    def shutdown(self, mode: str = "requeue") -> None:
        """Stop the instance; its running jobs are requeued (the default), cancelled, or waited for (`drain`)."""
        self.call("shutdown", mode=mode)

    # ------------------------------------------------------------ sharing (protocol.md §3.10)

    def queues(self) -> dict[str, Any]:
        """`{default, queues: [queueinfo]}`: each queue's settings, state, counts and users."""
        return _fields(self.call("queues"))

    def queue_control(self, action: str, queues: Iterable[str] = (), reason: str = "") -> list[str]:
        """start/stop (scheduling) or enable/disable (accepting) the queues, all of them if none named."""
        return self.call("queue-control", action=action, queues=list(queues), reason=reason)["queues"]

    def banks(self) -> list[dict[str, Any]]:
        """Banks and user associations in Fair Tree order, with shares, usage and fair-share factors."""
        return self.call("banks")["banks"]

    def bank_add(self, bank: str, parent: str = "root", shares: int = 1, user: int | str | None = None,
                 default: bool = False) -> None:
        """Create or change a bank, or (with `user`) add a user to one."""
        if user is None:
            self.call("bank-add", bank=bank, parent=parent, shares=shares)
        else:
            self.call("bank-add", bank=bank, user=user, shares=shares, default=default)

    def bank_remove(self, bank: str, user: int | str | None = None) -> None:
        fields: dict[str, Any] = {"bank": bank}
        if user is not None:
            fields["user"] = user
        self.call("bank-remove", **fields)

    def usage(self, user: int | str | None = None, project: str | None = None, since: float | None = None,
              until: float | None = None, by_queue: bool = False) -> list[dict[str, Any]]:
        """Core-, GPU-, wall- and CPU-hours of finished jobs per user and bank (and queue)."""
        fields: dict[str, Any] = {"by_queue": by_queue}
        for name, value in (("user", user), ("project", project), ("since", since), ("until", until)):
            if value is not None:
                fields[name] = value
        return self.call("usage", **fields)["usage"]

    def job_usage(self, job_id: int) -> dict[str, Any]:
        """What a finished job held and used, and its CPU and memory efficiency."""
        return self.call("job-usage", job=job_id)["usage"]


def _checked(msg: dict[str, Any]) -> dict[str, Any]:
    if msg.get("ok") is False:
        error = msg.get("error") or {}
        raise ClientError(str(error.get("code", "error")), str(error.get("message", "request failed")))
    return msg


def _errors(msg: dict[str, Any]) -> dict[int, str]:
    return {int(k): v for k, v in (msg.get("errors") or {}).items()}


def _fields(msg: dict[str, Any]) -> dict[str, Any]:
    """A response without its envelope keys."""
    return {k: v for k, v in msg.items() if k not in ("v", "id", "ok", "more")}


def _batches(specs: Iterable[JobspecLike]) -> Iterator[list[dict[str, Any]]]:
    import msgpack  # here, not at the top: mc-submit sends one small frame without it (frames.pack_request)

    batch: list[dict[str, Any]] = []
    size = 0
    for spec in specs:
        data = wire_jobspec(spec)
        try:
            nbytes = len(msgpack.packb(data, use_bin_type=True))
        except UnicodeEncodeError:
            raise not_text(data, "jobspec") from None
        if batch and (size + nbytes > BATCH_BYTES or len(batch) >= BATCH_COUNT):
            yield batch
            batch, size = [], 0
        batch.append(data)
        size += nbytes
    if batch:
        yield batch


__all__ = ["Client", "ClientError", "DEFAULT_SOCKETS", "own_umask", "socket_path", "wire_jobspec"]
