"""Relaying a client's standard input to a job's tasks (protocol.md §3.8; overlay `stdin` / `stdin-ack`).

A `stdin` request is answered once every rank that runs a reading task acknowledged the data, so the client
sends at most one chunk ahead of the slowest reader and nothing piles up here.  Data that arrives before the
job's tasks were dispatched waits for them.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from minicluster.proto import messages

Send = Callable[[str, int, dict[str, Any]], None]
Answer = asyncio.Future  # of {"open": bool}


class _JobStdin:
    __slots__ = ("targets", "queued", "seq", "waiting", "closed")

    def __init__(self) -> None:
        self.targets: dict[int, list[int]] | None = None  # rank -> reading tasks, once dispatched
        self.queued: list[tuple[bytes, bool, Answer]] = []
        self.seq = 0
        # seq -> (ranks yet to acknowledge, the answer, whether any task still reads)
        self.waiting: dict[int, tuple[set[int], Answer, list[bool]]] = {}
        self.closed = False


class StdinRelay:
    def __init__(self, send: Send) -> None:
        self.send = send
        self._jobs: dict[int, _JobStdin] = {}

    def write(self, job_id: int, data: bytes, eof: bool) -> Answer:
        """Relay `data` (then end-of-file) to the job's reading tasks; the answer comes once they have it."""
        answer: Answer = asyncio.get_running_loop().create_future()
        state = self._jobs.setdefault(job_id, _JobStdin())
        if state.closed:
            answer.set_result({"open": False})
            return answer
        state.closed = eof
        if state.targets is None:
            state.queued.append((data, eof, answer))
        else:
            self._send(job_id, state, data, eof, answer)
        return answer

    def close(self, job_id: int) -> None:
        """The writer went away: the tasks read end-of-file."""
        state = self._jobs.get(job_id)
        if state is not None and not state.closed:
            self.write(job_id, b"", True)

    def dispatched(self, job_id: int, targets: dict[int, list[int]]) -> None:
        """The job's `run`s went out: what waited for them follows (in order, on the same links)."""
        state = self._jobs.setdefault(job_id, _JobStdin())
        state.targets = targets
        queued, state.queued = state.queued, []
        for data, eof, answer in queued:
            self._send(job_id, state, data, eof, answer)

    def on_ack(self, rank: int, ack: messages.StdinAck) -> None:
        state = self._jobs.get(ack.job)
        entry = state.waiting.get(ack.seq) if state is not None else None
        if state is None or entry is None:
            return
        ranks, answer, reading = entry
        ranks.discard(rank)
        reading[0] = reading[0] or ack.open
        if not ranks:
            del state.waiting[ack.seq]
            _answer(answer, reading[0])

    def ended(self, job_id: int) -> None:
        """The job finished: nobody reads any more."""
        state = self._jobs.pop(job_id, None)
        if state is None:
            return
        for _data, _eof, answer in state.queued:
            _answer(answer, False)
        for _ranks, answer, _reading in state.waiting.values():
            _answer(answer, False)

    def _send(self, job_id: int, state: _JobStdin, data: bytes, eof: bool, answer: Answer) -> None:
        assert state.targets is not None
        if not state.targets:
            _answer(answer, False)
            return
        seq = state.seq
        state.seq += 1
        state.waiting[seq] = (set(state.targets), answer, [False])
        for rank, tasks in state.targets.items():
            messages.send(self.send, rank, messages.Stdin(job_id, seq, tasks, data, eof))


def _answer(answer: Answer, reading: bool) -> None:
    if not answer.done():
        answer.set_result({"open": reading})
