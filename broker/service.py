"""Rank 0: wires the overlay, job manager, scheduler, execution tracking, client socket and status endpoint.

It also hosts rank 0's own WorkerAgent, so the broker's node runs tasks like any other rank.  Periodic work
(liveness sweep, time limits, purge, config reload) runs as small loops on the one event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from broker.api import flowops  # noqa: F401  (registers the workflow operations)
from broker import nodes, sched
from broker.api.clientapi import ClientServer
from broker.execution import Execution
from broker.flow.recovery import recover as recover_workflows, settled as settle_workflows
from broker.job import State
from broker.jobmanager import JobManager
from broker.durable.journal import Journal
from broker.api.ops import Operations
from broker.ranks import RankTable
from broker.recovery import Reattach, load
from broker.share import accounting, preemption
from broker.api import shareops  # noqa: F401  (registers the sharing operations)
from broker.share.service import Sharing
from broker.stop import settle_running
from broker.durable.statelock import StateLock
from broker.status_http import StatusServer
from broker.supervise import Supervisor
from broker.watchers import Watchers
from minicluster import config as config_mod
from minicluster import exitcodes, runtime
from minicluster.config import InstanceConfig
from minicluster.overlay.curve import Certificate
from minicluster.overlay.transport import Overlay
from minicluster.overlay.uplink import HOME
from minicluster.proto import messages, topology
from minicluster.proto.envelope import BadMessage, Message
from worker import rank0

log = logging.getLogger(__name__)
# How long a stopping broker waits for its last journal write (a full disk stalls it).
CLOSE_WRITE_WAIT = 5.0
# How often the scheduler looks at the queue again while the journal is stalled.
STALLED_RETRY = 0.5
# The most tasks one scheduling pass starts; the next pass follows once the event loop has read what waits
# (heartbeats, results, requests). At 10,000 ranks of 64 cores a 1,000,000-task array's first pass started 640,000
# elements at once: the loop was blocked for over 15 s, and live ranks were declared lost.
PASS_STARTS = 4096


class Broker:
    def __init__(self, config: InstanceConfig, cert: Certificate, config_path: str | None = None,
                 command: list[str] | None = None, state_lock: StateLock | None = None) -> None:
        self.config = config
        # First of all: a second instance on this state dir is refused before it touches anything.
        self.state_lock = state_lock or StateLock(config.state_dir)
        self.config_path = config_path
        self.command = command
        self.owner_uid = os.getuid()
        self.stopping = False
        self.stop_mode = "requeue"
        self.disrupted: int | None = None
        self._stop = asyncio.Event()
        # Set once every rank has joined (again, after a restart): batch mode and the reattach window wait on it.
        self._all_up = asyncio.Event()
        self.uri = f"unix://{config.socket_path}"
        self.journal = Journal(config.state_dir)
        # Ranks a resource graph file describes (their description comes from it, not from their join).
        self.graph, self.described = nodes.build_graph(config)
        self.scheduler = sched.Scheduler(self.graph, config.policy, config.default_time_limit)
        self.watchers = Watchers()
        self._schedule_pending = False  # before the manager: the recovery below may wake the scheduler
        self.sharing = Sharing(config, self.journal, self.scheduler)
        self.supervisor = Supervisor(self._crashed)
        self.overlay = Overlay(config, 0, cert, self._on_message)
        self.manager = JobManager(config, self.journal, self.scheduler, self.watchers, self.owner_uid, next_id=1,
                                  tasks=self._execution, wake_scheduler=self._wake_scheduler,
                                  background=self.supervisor, sharing=self.sharing)
        recovered = load(self.manager)
        accounting.restore(self.journal, recovered.active)
        accounting.load_records(self.journal, recovered.active)
        self.epoch = recovered.epoch
        self.manager.next_id = recovered.next_id
        self.reattach: Reattach | None = Reattach(self.manager, recovered.active)
        self.workflows = recover_workflows(self.manager.workflow, self.journal, recovered.active)
        # Drains outlive restarts: applied as each rank's resources are added.
        self.drains = self.manager.store.drains()
        for rank in self.described & self.drains.keys():
            self.graph.drain(rank, self.drains[rank])
        self.known_ranks: set[int] = set()
        self.ranks = RankTable(config.size, config.tree_size, config.endpoint_of,
                               config.unresponsive_after, config.lost_after)
        # Beats counted (one per worker heartbeat), those of them relayed in an `hbs`, and the messages that
        # brought them (`hb` and `hbs`).
        self.heartbeats = 0
        self.heartbeats_relayed = 0
        self.heartbeat_messages = 0
        self.homes_sent = 0
        self.agent = rank0.agent(config, self.overlay.send, self.uri)
        self.client_server = ClientServer(Operations(self), config.socket_path, config.access_group,
                                          config.state_dir)
        self.status_server = (StatusServer(config.status_port, self.status_snapshot, config.status_hosts(),
                                           self.metrics_snapshot)
                              if config.status_port else None)
        self._started = time.time()
        self.command_state: dict[str, Any] | None = None

    def _execution(self, manager: JobManager) -> Execution:
        """The job manager's task execution, made by the manager once it is whole (each calls the other)."""
        self.execution = Execution(self.config, manager, self.overlay.send, self.uri)
        return self.execution

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def run(self) -> int:
        self.journal.start()
        self.overlay.start()
        await self.client_server.start()
        if self.status_server is not None:
            await self.status_server.start()
        loops = {"the liveness sweep": self._sweep_loop(), "the time-limit loop": self._deadline_loop(),
                 "the purge loop": self._purge_loop(), "the config reload loop": self._reload_loop(),
                 "the fair-share loop": self._sharing_loop(), "rank 0's agent": self.agent.run()}
        for name, coro in loops.items():
            self.supervisor.spawn(coro, name)
        if self.reattach is None or not self.reattach.needed:
            self.reattach = None
            settle_workflows(self.manager.workflow, self.workflows)
        else:
            self.supervisor.spawn(self._close_reattach_window(), "the reattach window")
        log.info("broker up: epoch %d, %s", self.epoch, self.uri)
        status = exitcodes.SUCCESS
        if self.command:
            status = await self._run_command(self.command)  # a stop that comes first ends the command
            if (self.command_state or {}).get("state") != "exited":
                status = exitcodes.SUCCESS  # ended by `mc shutdown`: a clean end (a disruption returns below)
            self.request_stop()
        await self._stop.wait()
        if self.disrupted is None:
            # A disruption meanwhile (SIGTERM during a drain) stops the settling: the broker leaves as below.
            await settle_running(self.manager, lambda: None if self.disrupted is not None else self.stop_mode,
                                 self.config.kill_grace)
        if self.disrupted is not None:
            await self._leave()
            return self.disrupted
        await self._shutdown()
        return status

    def request_stop(self, mode: str = "requeue") -> None:
        """End the MiniCluster: running jobs are requeued, cancelled or waited for (`mode`, broker/stop.py),
        then every rank is told to stop. A stop asked for while a drain waits replaces it."""
        if not self.stopping or self.stop_mode == "drain":
            self.stop_mode = mode
        self.stopping = True
        self._stop.set()

    def disrupt(self, signum: int) -> None:
        """Stopped by a signal (pod deleted, evicted, node drained): a disruption, not the MiniCluster's end.

        Nothing is recorded as ended and no worker is told to stop: they keep their tasks and rejoin the broker
        that replaces this one, which resumes from the journal (architecture.md#restart)."""
        if self.disrupted is None:
            log.warning("stopped by signal %d: leaving without ending the MiniCluster", signum)
        self._leave_with(exitcodes.stopped_by(signum))

    def _crashed(self, what: str, exc: BaseException) -> None:
        """A supervised task failed (broker/supervise.py logged it): leave as a crash, to be restarted."""
        self._leave_with(exitcodes.CRASHED)

    def _leave_with(self, status: int) -> None:
        if self.disrupted is None:
            self.disrupted = status
        self.stopping = True
        self._stop.set()

    async def _shutdown(self) -> None:
        # Rank 0's own agent passes `shutdown` on to rank 0's children, and they to theirs.
        self.agent.handle(Message(messages.Shutdown.KIND, 0, 0, {}))
        await self.agent.stopped.wait()
        await self._close()

    async def _leave(self) -> None:
        # Rank 0's own tasks die with its pod: end them with their grace, and record how they ended.
        await self.agent.shutdown()
        await self._close()

    async def _close(self) -> None:
        await asyncio.sleep(0.1)  # let the last results and kills go out
        await self.supervisor.cancel_all()
        try:
            # A full disk stalls writes: wait a little, then leave (journal.close gives up what is not durable).
            await asyncio.wait_for(self.journal.write(self.sharing.save_usage(time.time())), CLOSE_WRITE_WAIT)
        except Exception as exc:  # a full disk must not stop the shutdown; the last periodic save stands
            log.warning("could not save fair-share usage: %r", exc)
        await self.client_server.close()
        if self.status_server is not None:
            await self.status_server.close()
        await self.journal.close()
        await self.overlay.close()

    async def _run_command(self, argv: list[str]) -> int:
        """Batch mode: once every rank joined, run the command with MC_URI set; its status is ours.

        A stop request (SIGTERM, `mc shutdown`) ends the command too: SIGTERM, then SIGKILL after kill_grace.
        """
        joined = asyncio.ensure_future(self._all_up.wait())
        stop_asked = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait((joined, stop_asked), return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        stop_asked.cancel()
        if self._stop.is_set():
            return 128 + signal.SIGTERM
        # The image's own environment: nothing of the runtime's view but its bin/, last on PATH.
        env = runtime.command_env(os.environ) | {"MC_URI": self.uri}
        # Off a terminal the command leads its own process group, so stopping it reaches what it started too;
        # on one it stays in ours, which keeps the terminal (an interactive `mc start -- bash`).
        own_group = not _has_terminal()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, process_group=0 if own_group else None)
        except OSError as exc:
            log.error("cannot run %s: %s", argv[0], exc)
            self.command_state = {"state": "exited", "status": 127}
            return 127
        self.command_state = {"state": "running", "status": None}
        exited = asyncio.ensure_future(proc.wait())
        stopping = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait((exited, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        stopped_first = not exited.done()
        if stopped_first:
            _signal_command(proc.pid, own_group, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), self.config.kill_grace)
            except TimeoutError:
                _signal_command(proc.pid, own_group, signal.SIGKILL)
        code = await exited
        if own_group:
            _signal_command(proc.pid, own_group, signal.SIGKILL)  # what the command left behind
        status = code if code >= 0 else exitcodes.stopped_by(-code)
        # A command the broker's own stop ended did not fail: the operator must not report CommandFailed.
        self.command_state = {"state": "stopped" if stopped_first else "exited", "status": status}
        return status

    # --- overlay messages ----------------------------------------------------------------------------------

    def _on_message(self, msg: Message) -> None:
        if rank0.for_agent(msg):
            self.agent.handle(msg)
            return
        self._handle(msg)
        if self.ranks.came_back:
            self._call_children_home()

    def _call_children_home(self) -> None:
        """Ranks heard from again: their children may have linked around them while they were away (§2.4.1)."""
        back, self.ranks.came_back = self.ranks.came_back, []
        for rank in back:
            for child in topology.children(rank, self.config.fanout, self.config.tree_size):
                if self.ranks.is_member(child):
                    self.overlay.send(HOME, child, {})
                    self.homes_sent += 1

    def _handle(self, msg: Message) -> None:
        handler = _HANDLERS.get(msg.kind)
        if handler is None:
            messages.send(self.overlay.send, msg.src,
                          messages.Refusal("unknown-kind", f"unknown kind {msg.kind!r}", msg.kind))
            return
        if not 0 <= msg.src < self.config.tree_size:
            return
        self.ranks.seen(msg.src, time.monotonic())
        # Output a worker queued while rank 0 was down arrives before its join: kept (protocol.md §2.6).
        if msg.kind not in _BEFORE_JOIN and not self.ranks.is_member(msg.src):
            messages.send(self.overlay.send, msg.src, messages.Rejoin(self.epoch))
            return
        try:
            typed = messages.decode(msg.kind, msg.body)
        except BadMessage as exc:
            messages.send(self.overlay.send, msg.src, messages.refusal(msg.kind, exc))
            return
        if typed.dropped:
            log.warning("rank %d sent %d malformed rows in a %s message; they were dropped", msg.src, typed.dropped,
                        msg.kind)
        handler(self, msg.src, typed)

    def _on_join(self, rank: int, join: messages.Join) -> None:
        if self._is_repeat(rank, join):
            self._on_repeated_join(rank, join)
            return
        try:
            if rank != 0 or self.config.broker_runs_tasks:
                self._add_resources(rank, join.resources)
        except (KeyError, TypeError, ValueError) as exc:
            messages.send(self.overlay.send, rank,
                          messages.Refusal("bad-request", f"bad resources: {exc}", messages.Join.KIND))
            return
        self.ranks.joined(rank, time.monotonic(), join.pid, join.hostname)
        if join.results:
            self.execution.on_done(rank, join.results)
        if self.reattach is not None:
            self.reattach.report(rank, join.running)
        else:
            self.execution.reconcile(rank, join.running)
        messages.send(self.overlay.send, rank, messages.Welcome(self.epoch, self.config.size))
        if self.ranks.all_up():
            self._all_up.set()
            if not self.manager.all_ranks_seen:
                self.manager.all_ranks_seen = True
                # The resource graph and the job table are long-lived: keep the collector from rescanning them.
                gc.freeze()
        self._wake_scheduler()

    def _is_repeat(self, rank: int, join: messages.Join) -> bool:
        """A repeat sent before the worker read our welcome (protocol.md §2.6)."""
        return (self.ranks.is_member(rank) and self.ranks.ranks[rank].pid == join.pid
                and join.epoch != self.epoch)

    def _on_repeated_join(self, rank: int, join: messages.Join) -> None:
        """Its place and resources are known: only its results may be new. Its `running` cannot list the runs
        sent since the welcome, so it is not compared (while reattaching it is the latest report); the welcome
        goes again in case the first one was dropped."""
        if self.reattach is not None:
            self.reattach.report(rank, join.running)
        if join.results:
            self.execution.on_done(rank, join.results)
            self._wake_scheduler()
        messages.send(self.overlay.send, rank, messages.Welcome(self.epoch, self.config.size))

    def _add_resources(self, rank: int, wire: dict[str, Any]) -> None:
        if rank in self.known_ranks:
            self.graph.set_up(rank)
            return
        mismatch = nodes.add_rank(self.graph, rank, wire, self.described)
        self.known_ranks.add(rank)
        self.manager.ranks_changed()
        if rank in self.drains:
            self.graph.drain(rank, self.drains.pop(rank))
        elif mismatch:
            self.graph.drain(rank, mismatch)

    def _on_hb(self, rank: int, _hb: messages.Heartbeat) -> None:
        """One worker heartbeat, sent alone; a rank that has not joined is told to rejoin."""
        self.heartbeat_messages += 1
        self.heartbeats += 1
        if not self.ranks.heartbeat(rank, time.monotonic()):
            self._rejoin(rank)

    def _on_hbs(self, relay: int, hbs: messages.Heartbeats) -> None:
        """Heartbeats relayed by `relay` (protocol.md §2.6): each counts as an `hb` from its rank, if that rank is
        below the relay."""
        self.heartbeat_messages += 1
        now = time.monotonic()
        # Names bound once: at 10,000 ranks this loop is most of what an idle rank 0 does.
        tree_size, fanout, next_hop, heartbeat = self.config.tree_size, self.config.fanout, topology.next_hop, \
            self.ranks.heartbeat
        counted = 0
        for rank, _seq, _running in hbs.beats:
            if rank >= tree_size or next_hop(relay, rank, fanout) is None:
                self.overlay.bad_frames += 1
                continue
            counted += 1
            if not heartbeat(rank, now):
                self._rejoin(rank)
        self.heartbeats += counted
        self.heartbeats_relayed += counted

    def _rejoin(self, rank: int) -> None:
        messages.send(self.overlay.send, rank, messages.Rejoin(self.epoch))

    def _on_done(self, rank: int, done: messages.Done) -> None:
        self.execution.on_done(rank, done.results)

    def _on_returned(self, rank: int, returned: messages.Returned) -> None:
        self.execution.on_returned(rank, returned.keys)

    def _on_out(self, _rank: int, out: messages.Output) -> None:
        self.execution.on_output(out.chunks)

    def _on_pmi_put(self, rank: int, put: messages.PmiPut) -> None:
        self.execution.pmi.on_put(rank, put)

    def _on_pmix_group(self, rank: int, part: messages.PmixGroup) -> None:
        self.execution.pmi.on_group(rank, part, self.epoch)

    def _on_stdin_ack(self, rank: int, ack: messages.StdinAck) -> None:
        self.execution.stdin.on_ack(rank, ack)

    def _on_pmi_init(self, _rank: int, init: messages.PmiInit) -> None:
        self.execution.pmi.on_init(init)

    def _on_abort(self, rank: int, abort: messages.Abort) -> None:
        self.execution.pmi.on_abort(rank, abort)

    def _on_error(self, rank: int, refusal: messages.Refusal) -> None:
        log.warning("rank %d refused a %s message: %s", rank, refusal.ref, refusal.message)

    # --- scheduling and periodic work ----------------------------------------------------------------------

    def _wake_scheduler(self) -> None:
        if not self._schedule_pending:
            self._schedule_pending = True
            asyncio.get_running_loop().call_soon(self._schedule)

    def _schedule(self) -> None:
        self._schedule_pending = False
        if self.reattach is not None or self.stopping:
            return
        if self.journal.stalled is not None:
            # Nothing new starts while its results could not be recorded (a full disk): what runs goes on, and
            # the queue is looked at again a moment later.
            if not self._schedule_pending:
                self._schedule_pending = True
                asyncio.get_running_loop().call_later(STALLED_RETRY, self._schedule)
            return
        starts = self.scheduler.schedule(time.time(), PASS_STARTS)
        if starts:
            self.execution.start(starts)
            if len(starts) >= PASS_STARTS:
                self._wake_scheduler()  # more may fit: after the loop's next turn
        self.execution.window.recall_overtaken()
        preemptions = self.scheduler.take_preemptions()
        if preemptions:
            preemption.carry_out(self.manager, self.execution, self.sharing, preemptions)

    async def _close_reattach_window(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_up.wait(), self.config.reattach_timeout)
        # Give joined workers a moment to re-send results they held while rank 0 was away.
        await asyncio.sleep(min(0.5, self.config.heartbeat_interval))
        reattach, self.reattach = self.reattach, None
        assert reattach is not None, "the window is opened only with a Reattach"
        reattach.settle(self.execution, time.time())
        settle_workflows(self.manager.workflow, self.workflows)
        self.manager.all_ranks_seen = self.ranks.all_up()
        self._wake_scheduler()

    async def _sweep_loop(self) -> None:
        period = self.config.heartbeat_interval / 2
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            stalled = max(0.0, now - last - 2 * period)
            last = now
            for rank in self.ranks.sweep(now, stalled):
                log.warning("rank %d lost", rank)
                self.graph.set_down(rank)
                self.execution.rank_lost(rank)

    async def _deadline_loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            self.execution.check_deadlines(now)
            self.execution.window.recall_overdue(now)

    async def _sharing_loop(self) -> None:
        """Every `fairshare_interval`: fair-share factors, and the usage that changed saved to the journal (a
        kill -9 loses at most that much); every `interval`: every pending job's priority again (age)."""
        weights = self.sharing.weights
        last_full = time.monotonic()
        self.sharing.refresh(time.time())
        while True:
            await asyncio.sleep(weights.fairshare_interval)
            now = time.time()  # usage and decay are stamped with wall time (they are stored)
            self.sharing.refresh(now)
            saved = self.sharing.save_usage(now)
            if saved:
                self.journal.write(saved)
            if time.monotonic() - last_full >= weights.interval:
                last_full = time.monotonic()
                self.sharing.reprioritize(now)
            self._wake_scheduler()

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.manager.purge()

    async def _reload_loop(self) -> None:
        """Follow `size` (the operator updates it when a MiniCluster is scaled) and the queues and priority
        weights (when its spec.queues changes) in the config file."""
        if not self.config_path:
            return
        mtime = os.stat(self.config_path).st_mtime
        while True:
            await asyncio.sleep(2)
            try:
                now_mtime = os.stat(self.config_path).st_mtime
                if now_mtime == mtime:
                    continue
                mtime = now_mtime
                new = config_mod.load(self.config_path)
            except (OSError, config_mod.ConfigError) as exc:
                log.warning("config reload failed: %s", exc)
                continue
            if new.size != self.config.size and new.size <= self.config.tree_size:
                log.info("size changed %d -> %d", self.config.size, new.size)
                self.config = self.config.replace(size=new.size)
                self.manager.config = self.config
                self.ranks.resize(new.size)
            if new.sharing != self.config.sharing:
                # Queues and weights apply now; banks from the config at the next start (mc bank: now).
                log.info("queue and priority settings changed: applied")
                self.config = self.config.replace(queues=new.queues, default_queue=new.default_queue,
                                                  priority=new.priority, banks=new.banks,
                                                  default_projects=new.default_projects)
                self.manager.config = self.sharing.config = self.config
                self.sharing.apply(self.config.sharing)
                self.sharing.reprioritize(time.time())
                self._wake_scheduler()

    def status_snapshot(self) -> dict[str, Any]:
        counts = self.ranks.counts()
        history = self.manager.history
        jobs = {"queued": 0, "running": 0, "finished": history.succeeded, "failed": history.failed}
        for job in self.manager.jobs.values():  # the active ones, and those whose end is not durable yet
            if job.state == State.INACTIVE:
                jobs["failed" if job.status else "finished"] += 1
            else:
                jobs["running" if job.state in (State.RUN, State.CLEANUP) else "queued"] += 1
        started = datetime.datetime.fromtimestamp(self._started, datetime.UTC)
        return {"name": self.config.name, "size": self.config.size, "max_size": self.config.tree_size,
                # A new `started` with an epoch that did not grow means a new, empty journal (state lost).
                "epoch": self.epoch, "started": started.isoformat(timespec="milliseconds"),
                "ranks": {"up": counts["up"], "unresponsive": counts["unresponsive"], "lost": counts["lost"],
                          "expected": counts["expected"]},
                "ready": self.ranks.all_up(), "jobs": jobs, "command": self.command_state,
                **self.sharing.gauges(),
                "counters": {"journal_commits": self.journal.commits, "journal_statements": self.journal.statements,
                             "journal_stalls": self.journal.stalls,
                             "overlay_dropped": self.overlay.dropped, "overlay_bad_frames": self.overlay.bad_frames,
                             "heartbeats": self.heartbeats, "heartbeats_relayed": self.heartbeats_relayed,
                             "heartbeat_messages": self.heartbeat_messages,
                             "overlay_adoptions": self.overlay.adoptions, "overlay_homes_sent": self.homes_sent,
                             "tasks_started": self.execution.tasks_started,
                             "tasks_completed": self.execution.tasks_ended,
                             "tasks_failed": self.execution.tasks_failed}}

    def metrics_snapshot(self) -> dict[str, Any]:
        """/metrics: the status, and what only Prometheus reads (per rank, per topology group and per bank: more
        than the operator's poll of /status needs).  From counts kept as things happen: no journal reads."""
        return {**self.status_snapshot(), "cores": self.graph.cores_busy(),
                "fairshare": self.sharing.fairshare_gauges(),
                "journal": {"stalled": self.journal.stalled is not None,
                            "commit_seconds": self.journal.commit_seconds}}


_HANDLERS: dict[str, Callable[[Broker, int, Any], None]] = {
    messages.Join.KIND: Broker._on_join,
    messages.Heartbeat.KIND: Broker._on_hb,
    messages.Heartbeats.KIND: Broker._on_hbs,
    messages.Done.KIND: Broker._on_done,
    messages.Output.KIND: Broker._on_out,
    messages.Returned.KIND: Broker._on_returned,
    messages.PmiPut.KIND: Broker._on_pmi_put,
    messages.PmixGroup.KIND: Broker._on_pmix_group,
    messages.PmiInit.KIND: Broker._on_pmi_init,
    messages.StdinAck.KIND: Broker._on_stdin_ack,
    messages.Abort.KIND: Broker._on_abort,
    messages.Refusal.KIND: Broker._on_error,
}
# Kinds a rank that has not joined this epoch may send (protocol.md §2.6): the rest is answered `rejoin`.
_BEFORE_JOIN = frozenset({messages.Join.KIND, messages.Heartbeat.KIND, messages.Heartbeats.KIND,
                          messages.Output.KIND})


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _signal_command(pid: int, own_group: bool, sig: int) -> None:
    try:
        if own_group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def install_signal_handlers(broker: Broker) -> None:
    loop = asyncio.get_running_loop()
    # SIGTERM is how Kubernetes stops a pod: the broker leaves, the MiniCluster does not end (exitcodes.py).
    loop.add_signal_handler(signal.SIGTERM, broker.disrupt, signal.SIGTERM)
    # In batch mode the command owns the terminal: Ctrl-C is its to handle (mc run cancels its job).
    if broker.command:
        loop.add_signal_handler(signal.SIGINT, lambda: None)
    else:
        loop.add_signal_handler(signal.SIGINT, broker.disrupt, signal.SIGINT)
