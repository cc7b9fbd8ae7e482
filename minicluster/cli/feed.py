"""Forwarding our standard input to a running job (`mc run`, protocol.md §3.8), as `srun` and `flux run` do.

One `stdin` request at a time: the next chunk is read only once the broker said the previous one reached the
tasks, so a job that reads slowly slows the reading down instead of filling memory anywhere. In the background
of a terminal nothing is read (reading would stop `mc run` with SIGTTIN); once in the foreground, it is.
"""
from __future__ import annotations

import os
import select

from minicluster.client import Client, ClientError

CHUNK = 64 * 1024


class StdinFeeder:
    def __init__(self, client: Client, job: int, fd: int) -> None:
        self.client = client
        self.job = job
        self.fd = fd
        self.request: int | None = None  # the `stdin` request awaiting its answer
        self.done = False

    def wake_fds(self) -> tuple[int, ...]:
        """The fd to watch while waiting for the broker: ours when a chunk may be read now."""
        if self.done or self.request is not None or not self._in_foreground():
            return ()
        return (self.fd,)

    def read_and_send(self) -> None:
        """Read what is there, if anything, and send it; end-of-file is sent too."""
        if not select.select([self.fd], [], [], 0)[0]:
            return
        try:
            data = os.read(self.fd, CHUNK)
        except OSError:
            data = b""
        self.request = self.client.request("stdin", job=self.job, data=data, eof=not data)
        self.done = not data

    def answered(self) -> None:
        """Take the answer to the outstanding request, if it came; stop once no task reads."""
        if self.request is None:
            return
        try:
            got = self.client.next_response((self.request,), timeout=0)
        except ClientError:
            self.request, self.done = None, True
            return
        if got is not None:
            self.request = None
            self.done = self.done or not got[1].get("open")

    def _in_foreground(self) -> bool:
        try:
            return not os.isatty(self.fd) or os.tcgetpgrp(self.fd) == os.getpgrp()
        except OSError:
            return False
