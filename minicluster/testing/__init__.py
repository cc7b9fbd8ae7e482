"""The test kit: what tests of minicluster (and of code built on it) need, shipped with the package.

- LocalCluster (cluster.py): a MiniCluster of real processes, one per rank.
- FakeClock (clock.py): time that moves only when a test says so.
- RecordingSender (comm.py): an overlay `send` that passes every message through the real envelope codec
  (protocol.md §2.3) and keeps it for the test to read.
- temp_journal / flushed (journal.py): the broker's real sqlite journal in a test's directory.
- builders (builders.py): jobspecs, job records and node resources with sensible defaults.
- SimulatedCluster (ranksim.py): a real rank 0 with thousands of simulated worker ranks in a few processes.
- until_true (waiting.py): poll a condition inside an event loop, with a deadline.

Importing this package imports the whole stack (LocalCluster needs the launcher); test code only.
"""
from __future__ import annotations

from minicluster.testing.builders import job, jobspec, jobspec_wire, resources
from minicluster.testing.clock import FakeClock
from minicluster.testing.cluster import LocalCluster
from minicluster.testing.comm import RecordingSender
from minicluster.testing.journal import flushed, temp_journal
from minicluster.testing.waiting import until_true

__all__ = [
    "FakeClock", "LocalCluster", "RecordingSender", "flushed", "job", "jobspec", "jobspec_wire", "resources",
    "temp_journal", "until_true",
]
