"""The per-rank worker agent (protocol.md §2.5–2.8): join, heartbeats, run and kill tasks, report results.

Rank 0 runs one too, inside the broker process, so the broker's node executes tasks like every other.
Results are kept until rank 0 acknowledges them (`done-ack`) and re-sent after a rejoin, so a broker restart
loses none.  Output and results produced in one loop iteration leave in one message each.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from minicluster.config import InstanceConfig
from minicluster.model import outputpath
from minicluster.model.text import cut
from minicluster.proto import messages, topology
from minicluster.proto.backoff import Backoff
from minicluster.proto.envelope import BadMessage, Message
from minicluster.proto.rows import Result, TaskEntry, result_row
from worker.containment import contain
from worker.helpers import helper_count
from worker.executor import STATUS_CANNOT_RUN, TaskExecutor, TaskResult, TaskSpec, TestExecutor
from worker.lines import LineBuffers
from worker.memlimit import MemoryLimits, TaskMemoryGroup
from worker.pmi.jobs import PMIJobs
from worker.resources import NodeResources
from worker.stdin import StdinPipes

log = logging.getLogger(__name__)

Key = tuple[int, int]
Send = Callable[[str, int, dict[str, Any]], None]
STREAMS = {"stdout": 1, "stderr": 2}
# Output is flushed at this size even within one loop iteration, to keep messages moderate.
OUTPUT_FLUSH_BYTES = 256 * 1024
# Unacknowledged results carried by a `join`; any beyond follow in `done` messages.
JOIN_RESULTS = 10_000
# Entries sent ahead (protocol.md §2.10) a worker holds at most; any more are returned at once.
WINDOW_LIMIT = 4096
# While elements wait in the window, no core waits for rank 0: results (and output) leave at most this often, in
# fewer and larger messages, which is rank 0's cost per task.
WINDOW_FLUSH_SECONDS = 0.002
RESEND_HEARTBEATS = 5  # unacknowledged results go again after 5 to 10 heartbeats


class _CannotStart(Exception):
    """The task ends unstarted with `status` (126 or 127) and this message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WorkerAgent:
    def __init__(self, config: InstanceConfig, rank: int, send: Send, resources: NodeResources, uri: str) -> None:
        self.config = config
        self.rank = rank
        self.send = send
        self.resources = resources
        self.uri = uri
        pidfile = os.path.join(config.state_dir, f"tasks-rank{rank}.pids")
        self.lines = LineBuffers(self._on_output)
        # A new executor first kills what this rank's previous run left behind (its pidfile, its cgroup tree).
        if config.test_exec:
            self.executor: TaskExecutor | TestExecutor = TestExecutor(self.lines.feed, self._on_exit)
        else:
            self.executor = TaskExecutor(self.lines.feed, self._on_exit, pidfile=pidfile,
                                         containment=contain(config.state_dir, rank),
                                         spawn_helpers=self._spawn_helpers(config, resources))
        self.pmi = PMIJobs(rank, send, shared_cores=self._shares_cores(config, resources))
        self.stdin = StdinPipes()
        # --mem is a limit where this worker may make memory cgroups, else a scheduling hint.
        self.memory = None if config.test_exec else MemoryLimits.detect()
        self.memory_groups: dict[Key, TaskMemoryGroup] = {}
        # With a resource override (tests, benchmarks) there may be more logical cores than real ones:
        # logical core i is bound to real core i mod n, so oversubscription still binds somewhere valid.
        self._real_cores = sorted(os.sched_getaffinity(0)) if config.resources else None
        self._uid = os.getuid()
        self.jobs: dict[int, messages.JobInfo] = {}
        self.running: dict[Key, tuple[list[int], list[int]]] = {}
        # Attempt numbers (protocol.md §2.9) of running tasks past their first attempt, and runs of a newer
        # attempt that wait for the older one, which rank 0 killed, to exit: key -> (entry, jobinfo).
        self.attempts: dict[Key, int] = {}
        self._after_exit: dict[Key, tuple[list[Any], messages.JobInfo]] = {}
        # The dispatch window (protocol.md §2.10): task -> (run entry, jobinfo) of the element that starts when it
        # ends, and each waiting element -> the task it follows.
        self._next: dict[Key, tuple[list[Any], messages.JobInfo]] = {}
        self._waits_for: dict[Key, Key] = {}
        self.job_running: dict[int, int] = {}
        self.output_sent: dict[int, int] = {}
        self.unacked: dict[Key, list[Any]] = {}
        self._unacked_at_resend: set[Key] = set()
        self._heartbeats_since_resend = 0
        self.epoch = 0
        self.welcomed = asyncio.Event()
        self.join_repeats = Backoff()
        self._join_due: float | None = None  # monotonic: when an unanswered join goes again; None: none sent
        self.stopped = asyncio.Event()
        self._out: list[list[Any]] = []
        self._out_bytes = 0
        self._done: list[list[Any]] = []
        self._flush_scheduled = False
        self._hb_seq = 0
        self._stopping: asyncio.Task[None] | None = None

    @staticmethod
    def _shares_cores(config: InstanceConfig, resources: NodeResources) -> bool:
        """Whether this rank's tasks share cores with other tasks: other ranks on this host, or more cores
        declared than this process may run on."""
        other_ranks_here = config.single_host and max(config.size, config.max_size) > 1
        return other_ranks_here or len(resources.cores) > len(os.sched_getaffinity(0))

    @staticmethod
    def _spawn_helpers(config: InstanceConfig, resources: NodeResources) -> int:
        """Helpers for this rank: `auto` counts the cores it really has, not a resource override's (tests,
        benchmarks pretend to have 64 cores on 2)."""
        cores = len(os.sched_getaffinity(0)) if config.resources else len(resources.cores)
        return helper_count(config.spawn_helpers, cores)

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Join, repeating the join with backoff until welcomed (protocol.md §2.6), then heartbeat until told to
        shut down."""
        while not self.stopped.is_set():
            if not self.welcomed.is_set():
                await self._join_until_welcomed()
                continue
            self._hb_seq += 1
            messages.send(self.send, 0, messages.Heartbeat(self._hb_seq, len(self.running)))
            if self.unacked:
                self._resend_overdue_results()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), self.config.heartbeat_interval)

    async def _join_until_welcomed(self) -> None:
        """One step of joining: the first join, or a repeat once due; then wait for the welcome, the stop or
        the next repeat. No heartbeat before the welcome: rank 0 would only answer it with `rejoin`."""
        due = self._join_due
        if due is None:
            due = self._start_join()
        elif time.monotonic() >= due:
            due = self._send_join()
        waits = [asyncio.ensure_future(self.welcomed.wait()), asyncio.ensure_future(self.stopped.wait())]
        await asyncio.wait(waits, timeout=max(0.0, due - time.monotonic()), return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()

    def _start_join(self) -> float:
        """Join now, the backoff started over; returns when the join goes again if it is not answered."""
        self.join_repeats.reset()
        return self._send_join()

    def _send_join(self) -> float:
        self.join()
        self._join_due = time.monotonic() + self.join_repeats.next_wait()
        return self._join_due

    def join(self) -> None:
        # Rank 0 counts what waited in the window as not started (protocol.md §2.10): it must not start now.
        self._next.clear()
        self._waits_for.clear()
        running = [[job, task, cores, gpus, *self._attempt_list((job, task))]
                   for (job, task), (cores, gpus) in self.running.items()]
        # Results travel with the join, so a restarted rank 0 knows what ended before it settles reattachment.
        results = list(self.unacked.values())[:JOIN_RESULTS]
        messages.send(self.send, 0, messages.Join(os.getpid(), self.resources.hostname, self.resources.to_wire(),
                                                  running, results, self.epoch))

    async def shutdown(self) -> None:
        self._next.clear()
        self._waits_for.clear()
        await self.executor.shutdown(self.config.kill_grace)
        self.stdin.close_all()
        self.lines.close()
        self._flush()
        self.pmi.close_all()
        self.stopped.set()

    # --- messages from rank 0 ------------------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        """Decode a message once, here: a missing or mistyped field is answered with `error` (protocol.md §2.5)
        and goes no further."""
        handler = _HANDLERS.get(msg.kind)
        if handler is None:
            messages.send(self.send, msg.src,
                          messages.Refusal("unknown-kind", f"unknown kind {msg.kind!r}", msg.kind))
            return
        try:
            order = messages.decode_order(msg.kind, msg.body)
        except BadMessage as exc:
            log.warning("rank %d refused a %s message from rank %d: %s", self.rank, msg.kind, msg.src, exc)
            messages.send(self.send, msg.src, messages.refusal(msg.kind, exc))
            return
        if order.dropped:
            log.warning("rank %d: %d malformed rows of a %s message were dropped", self.rank, order.dropped, msg.kind)
            messages.send(self.send, msg.src, messages.Refusal(
                "bad-request", f"{msg.kind}: {order.dropped} malformed rows were dropped", msg.kind))
        handler(self, order)

    def _on_welcome(self, welcome: messages.Welcome) -> None:
        epoch = welcome.epoch
        if epoch != self.epoch:
            self.epoch = epoch
            # A new broker relays no stdin for tasks started under the old one: give them end-of-file.
            self.stdin.close_all()
            self._resend_results()
        self.welcomed.set()

    def _on_rejoin(self, _rejoin: messages.Rejoin) -> None:
        # Not welcomed yet: a join is out and repeats; this answers a message sent before rank 0 read it.
        if self.welcomed.is_set():
            self.welcomed.clear()
            self._start_join()

    def _on_run(self, run: messages.Run) -> None:
        self.jobs.update(run.jobs)
        local: dict[int, list[TaskEntry]] = {}
        for row in run.tasks:
            entry = TaskEntry.of_checked(row)  # checked as the message was decoded
            local.setdefault(entry.job, []).append(entry)
        for job_id, entries in local.items():
            info = self.jobs.get(job_id)
            if info is None:
                log.warning("run for job %d without its job info", job_id)
                continue
            fresh = self._fresh(job_id, entries, info)
            try:
                pmi_env = self.pmi.prepare(job_id, info, [e.task for e in fresh]) if info.mpi else None
            except Exception as exc:  # e.g. no libpmix on this node: the job fails, the worker runs on
                log.error("job %d: cannot serve PMI: %s", job_id, exc)
                self.pmi.finished(job_id)
                self._fail_unstarted(job_id, [e.task for e in fresh], f"cannot serve PMI: {exc}")
                continue
            for job, task, index, cores, gpus, attempt in fresh:
                try:
                    self._start(job, task, index, cores, gpus, info, pmi_env, attempt)
                except _CannotStart as exc:
                    self._fail_unstarted(job, [task], str(exc), exc.status)
                except Exception as exc:  # one task that cannot start must not take the rest of the batch along
                    log.exception("job %d task %d cannot start", job, task)
                    self._fail_unstarted(job, [task], f"cannot start: {cut(str(exc))}")
            if pmi_env is not None:
                self.pmi.spawned(job_id)

    def _on_ahead(self, ahead: messages.Ahead) -> None:
        """Elements to start each when the task it follows ends here (protocol.md §2.10)."""
        if not self.welcomed.is_set():
            return  # sent before our join: rank 0 counts them as returned
        returned = []
        for entry in ahead.tasks:
            job, task = entry[0], entry[1]
            after = (entry[7] if len(entry) > 7 else job, entry[6])  # a whole job follows another job's task
            info = ahead.jobs.get(job)
            if (job, task) in self._waits_for:  # sent again (rank 0 had it back): where rank 0 says now
                self._unlink((job, task))
            if info is None or len(self._waits_for) >= WINDOW_LIMIT or after in self._next:
                returned.append([job, task])
            elif after in self.running or after in self._waits_for:
                self._next[after] = (entry[:6], info)
                self._waits_for[(job, task)] = after
            else:  # the task it follows has ended already
                self._on_run(messages.Run({job: info}, [entry[:6]]))
        if returned:
            messages.send(self.send, 0, messages.Returned(returned))

    def _on_recall(self, recall: messages.Recall) -> None:
        """Drop these entries if they wait still; a successor of one follows its predecessor instead."""
        returned = [[job, task] for job, task in recall.keys if self._unlink((job, task))]
        if returned:  # the others started already: rank 0 learns so from their predecessors' results
            messages.send(self.send, 0, messages.Returned(returned))

    def _unlink(self, key: Key) -> bool:
        """Take a waiting entry out of its chain (its successor follows its predecessor); False if none waits."""
        after = self._waits_for.pop(key, None)
        if after is None:
            return False
        del self._next[after]
        following = self._next.pop(key, None)
        if following is not None:
            self._next[after] = following
            self._waits_for[(following[0][0], following[0][1])] = after
        return True

    def _fresh(self, job_id: int, entries: list[TaskEntry], info: messages.JobInfo) -> list[TaskEntry]:
        """The entries to start now: not a repeat of a run this rank has (running or ended, not yet
        acknowledged); a newer attempt of a task still running waits for it to exit."""
        fresh = []
        for entry in entries:
            key = (job_id, entry.task)
            attempt = entry.attempt
            if key in self.running:
                if self.attempts.get(key, 0) < attempt:
                    self._after_exit[key] = (entry.to_row(), info)
                continue
            row = self.unacked.get(key)
            if row is not None and Result.attempt_of(row) >= attempt:
                continue
            fresh.append(entry)
        return fresh

    def _attempt_list(self, key: Key) -> list[int]:
        attempt = self.attempts.get(key, 0)
        return [attempt] if attempt else []

    def _start(self, job: int, task: int, index: int, cores: list[int], gpus: list[int], info: messages.JobInfo,
               pmi_env: dict[int, tuple[dict[str, str], tuple[int, ...]]] | None, attempt: int = 0) -> None:
        key = (job, task)
        env = dict(info.env)
        env.update(MC_JOB_ID=str(job), MC_TASK_RANK=str(task), MC_TASK_COUNT=str(info.ntasks),
                   MC_NODE_RANK=str(self.rank), MC_TASK_ATTEMPT=str(attempt), MC_URI=self.uri)
        if info.array:
            env["MC_TASK_INDEX"] = str(index)
        if attempt:
            self.attempts[key] = attempt
        fds: tuple[int, ...] = ()
        if pmi_env is not None:
            extra, fds = pmi_env[task]
            env.update(extra)
        argv, user = self._command(info, index)
        try:
            path = outputpath.expand(info.output, job, task, index) if info.output else None
        except outputpath.TemplateError as exc:
            raise _CannotStart(STATUS_CANNOT_RUN, f"output: {exc}") from None
        if path is not None and info.cwd:
            path = os.path.join(info.cwd, path)  # a relative path is the task's, as its cwd is; not the worker's
        self.running[key] = (cores, gpus)
        bind = tuple(cores) if self.resources.pinned else ()
        if self._real_cores is not None:
            bind = tuple(sorted({self._real_cores[c % len(self._real_cores)] for c in cores}))
        if pmi_env is not None and self.pmi.shared_cores:
            # Pinned where ranks share the host's cores, an MPI job's ranks land two to a CPU and wait on each other
            # (mpi4py's test_rma: 7 s unpinned, 108-145 s pinned; docs/mpi.md, ranks that share cores).
            bind = ()
        self.job_running[job] = self.job_running.get(job, 0) + 1
        stdin_fd = self.stdin.open(key) if task in info.stdin else None
        try:
            self.executor.start(TaskSpec(key=key, argv=argv, env=env, cwd=info.cwd, cores=bind,
                                         gpus=tuple(gpus), stdout_path=path, stderr_path=path, pass_fds=fds,
                                         stdin_fd=stdin_fd, memory_group=self._memory_group(key, info),
                                         user=user, umask=info.umask))
        finally:
            if stdin_fd is not None:
                os.close(stdin_fd)

    def _command(self, info: messages.JobInfo, index: int) -> tuple[tuple[str, ...], tuple[int, int] | None]:
        """The task's argv, and the (uid, gid) it runs as when that is not this worker's own: the spawn takes them
        in the task's own process before it execs (worker/spawn.py), and opens the task's files as them."""
        argv = tuple(a.replace("{cc}", str(index)) for a in info.argv)
        return argv, None if info.uid == self._uid else (info.uid, info.gid)

    def _memory_group(self, key: Key, info: messages.JobInfo) -> TaskMemoryGroup | None:
        limit = info.mem_per_task
        if not limit or self.memory is None:
            return None
        try:
            group = self.memory.create(key[0], key[1], limit)
        except OSError as exc:
            log.warning("job %d task %d runs without its --mem limit: %s", key[0], key[1], exc)
            return None
        self.memory_groups[key] = group
        return group

    def _fail_unstarted(self, job: int, tasks: list[int], error: str, status: int = STATUS_CANNOT_RUN) -> None:
        """End tasks that could not start with status 126 and the reason, on the next loop iteration (after
        the rest of their `run` message was started)."""
        now = time.time()
        loop = asyncio.get_running_loop()
        for task in tasks:
            loop.call_soon(self._on_exit, TaskResult((job, task), status, None, None, error, None, now, now))

    def _on_kill(self, kill: messages.Kill) -> None:
        for job, task, *_ in kill.keys:
            key = (job, task)
            if key not in self.running:
                continue
            if kill.signal == signal.SIGTERM and kill.grace > 0:
                self.executor.terminate(key, kill.grace)
            else:
                self.executor.signal(key, kill.signal)

    def _on_done_ack(self, ack: messages.DoneAck) -> None:
        for entry in ack.keys:
            key = (entry[0], entry[1])
            row = self.unacked.get(key)
            # Only the acknowledged attempt's result (protocol.md §2.9); a missing attempt means 0.
            if row is not None and Result.attempt_of(row) == (entry[2] if len(entry) > 2 else 0):
                del self.unacked[key]

    def _on_pmi_kvs(self, kvs: messages.PmiKvs) -> None:
        self.pmi.exchanged(kvs)

    def _on_pmix_group_done(self, done: messages.PmixGroupDone) -> None:
        self.pmi.pmix.group_done(done)

    def _on_pmix_dmodex(self, request: messages.DmodexRequest) -> None:
        self.pmi.pmix.dmodex_request(request)

    def _on_pmix_dmodex_data(self, reply: messages.DmodexReply) -> None:
        self.pmi.pmix.dmodex_reply(reply)

    def _on_shutdown(self, shutdown: messages.Shutdown) -> None:
        # Shutdown travels down the tree: a rank passes it on before it stops routing for its subtree.
        for child in topology.children(self.rank, self.config.fanout, self.config.tree_size):
            messages.send(self.send, child, shutdown)
        self._stopping = asyncio.get_running_loop().create_task(self.shutdown())
        self._stopping.add_done_callback(self._shutdown_ended)

    def _shutdown_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # Never hang half-stopped: say why, and let the rank end all the same.
            log.critical("rank %d: shutdown failed", self.rank, exc_info=task.exception())
            self.stopped.set()

    def _on_error(self, refusal: messages.Refusal) -> None:
        log.warning("rank 0 refused a %s message: %s", refusal.ref, refusal.message)

    # --- executor callbacks --------------------------------------------------------------------------------

    def _on_output(self, key: Key, stream: str, data: bytes) -> None:
        """Whole lines (or a partial one, by the flush rules of worker/lines.py) of one task's stream."""
        # Rank 0 keeps at most output_cap bytes per job; forwarding more (one byte more, so it can tell)
        # would only grow this rank's send queue.
        sent = self.output_sent.get(key[0], 0)
        room = self.config.output_cap + 1 - sent
        if room <= 0:
            return
        data = data[:room]
        self.output_sent[key[0]] = sent + len(data)
        self._out.append([key[0], key[1], STREAMS[stream], data])
        self._out_bytes += len(data)
        if self._out_bytes >= OUTPUT_FLUSH_BYTES:
            self._flush_output()
        self._schedule_flush()

    def _on_exit(self, result: TaskResult) -> None:
        key = result.key
        self.lines.flush(key)
        self.stdin.close(key)
        error = result.error
        max_rss = result.max_rss
        group = self.memory_groups.pop(key, None)
        if group is not None:
            if error is None and result.signal == signal.SIGKILL and group.oom_killed():
                error = f"out of memory: exceeded --mem {group.limit_mb} MiB"
            max_rss = group.peak_kb() or max_rss
            self._remove_group(group)
        if self.running.pop(key, None) is not None:
            left = self.job_running[key[0]] - 1
            if left:
                self.job_running[key[0]] = left
            else:
                del self.job_running[key[0]]
                self._forget_job(key[0])
        elif key[0] not in self.job_running:
            self._forget_job(key[0])  # none of its tasks here could start
        # Accounting (protocol.md §2.5), when measured.
        usage = {"cpu": result.cpu, "rss": max_rss} if result.cpu or max_rss else None
        row = result_row(key[0], key[1], result.status, result.exit_code, result.signal, error, result.started,
                         result.ended, self.attempts.pop(key, 0), usage)
        self.unacked[key] = row
        self._done.append(row)
        self._schedule_flush()
        waiting = self._after_exit.pop(key, None)
        if waiting is not None:
            entry, info = waiting
            self._on_run(messages.Run({key[0]: info}, [entry]))
        following = self._next.pop(key, None)
        if following is not None:  # the next element of the window starts on the cores this one freed
            entry, info = following
            del self._waits_for[(entry[0], entry[1])]
            self._on_run(messages.Run({entry[0]: info}, [entry]))

    def _forget_job(self, job: int) -> None:
        """The job's last task here ended: drop its info (every `run` carries it) and PMI server."""
        self.jobs.pop(job, None)
        self.output_sent.pop(job, None)
        self.pmi.finished(job)

    def _remove_group(self, group: TaskMemoryGroup, tries: int = 20) -> None:
        # The task's leftover processes were just SIGKILLed; the group empties once they are gone.
        if not group.remove() and tries:
            asyncio.get_running_loop().call_later(0.5, self._remove_group, group, tries - 1)

    def _on_stdin(self, stdin: messages.Stdin) -> None:
        job, seq = stdin.job, stdin.seq
        left = [len(stdin.tasks)]
        reading = [False]

        def written(still_reading: bool) -> None:
            reading[0] = reading[0] or still_reading
            left[0] -= 1
            if left[0] == 0:
                messages.send(self.send, 0, messages.StdinAck(job, seq, reading[0]))

        if not stdin.tasks:
            messages.send(self.send, 0, messages.StdinAck(job, seq, False))
        for task in stdin.tasks:
            self.stdin.write((job, task), stdin.data, stdin.eof, written)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop = asyncio.get_running_loop()
            if self._next:
                loop.call_later(WINDOW_FLUSH_SECONDS, self._flush)
            else:
                loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._flush_output()
        if self._done:
            messages.send(self.send, 0, messages.Done(self._done))
            self._done = []

    def _flush_output(self) -> None:
        if self._out:
            messages.send(self.send, 0, messages.Output(self._out))
            self._out, self._out_bytes = [], 0

    def _resend_overdue_results(self) -> None:
        """Every RESEND_HEARTBEATS heartbeats, the results that were unacknowledged the time before as well
        (protocol.md §2.6). Younger ones most likely wait for their commit: re-sending them made a busy rank 0
        busier still (at 20,000 tasks/s, half its CPU went to decoding duplicates)."""
        self._heartbeats_since_resend += 1
        if self._heartbeats_since_resend < RESEND_HEARTBEATS:
            return
        self._heartbeats_since_resend = 0
        overdue = [row for key, row in self.unacked.items() if key in self._unacked_at_resend]
        self._unacked_at_resend = set(self.unacked)
        self._resend_results(overdue)

    def _resend_results(self, rows: list[list[Any]] | None = None) -> None:
        if rows is None:
            rows = list(self.unacked.values())
        for start in range(0, len(rows), 10_000):
            messages.send(self.send, 0, messages.Done(rows[start:start + 10_000]))


_HANDLERS: dict[str, Callable[[WorkerAgent, Any], None]] = {
    messages.Welcome.KIND: WorkerAgent._on_welcome,
    messages.Rejoin.KIND: WorkerAgent._on_rejoin,
    messages.Run.KIND: WorkerAgent._on_run,
    messages.Ahead.KIND: WorkerAgent._on_ahead,
    messages.Recall.KIND: WorkerAgent._on_recall,
    messages.Kill.KIND: WorkerAgent._on_kill,
    messages.DoneAck.KIND: WorkerAgent._on_done_ack,
    messages.PmiKvs.KIND: WorkerAgent._on_pmi_kvs,
    messages.PmixGroupDone.KIND: WorkerAgent._on_pmix_group_done,
    messages.DmodexRequest.KIND: WorkerAgent._on_pmix_dmodex,
    messages.DmodexReply.KIND: WorkerAgent._on_pmix_dmodex_data,
    messages.Stdin.KIND: WorkerAgent._on_stdin,
    messages.Shutdown.KIND: WorkerAgent._on_shutdown,
    messages.Refusal.KIND: WorkerAgent._on_error,
}

WORKER_KINDS = frozenset(_HANDLERS)
PEER_KINDS = messages.PEER_KINDS
