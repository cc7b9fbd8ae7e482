"""Run mpi4py's test suite in one MPI rank through its own runner (test/main.py), recording what unittest saw.

    python rank.py SUITE_TEST_DIR OUT_DIR [main.py's options...]

Each rank appends to OUT_DIR/rank-<world rank>.jsonl, line by line so that a run that aborts still tells where:
a `start` line per test, its `stop` with the seconds it took (none after TEST_LIMIT: the rank exits),
and at the end the ids that failed or erred and the counts (tests run, failures, errors, skips), with the rank's
wall and CPU seconds. Runs in the MPI's own python (no minicluster imports), as every rank of the job."""
import faulthandler
import json
import os
import sys
import time
import unittest


# A hang, not a slow test: test_rma's Accumulate tests took 30-120 s each on a loaded 2-core machine (pinned, two
# ranks to a CPU; unpinned since, they take seconds).
TEST_LIMIT = 300.0


class RecordingResult(unittest.TextTestResult):
    out = None

    def _write(self, **record):
        if RecordingResult.out is None:
            from mpi4py import MPI  # initialised by main.py before the first test

            path = os.path.join(sys.argv[2], f"rank-{MPI.COMM_WORLD.Get_rank()}.jsonl")
            RecordingResult.out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
        RecordingResult.out.write(json.dumps(record) + "\n")

    def startTest(self, test):
        self._started = time.monotonic()
        self._write(start=test.id())
        # A test that never returns (ranks polling for a peer that never comes) would hold the whole run until the
        # launch's own timeout: faulthandler's own thread (it needs no GIL, which a rank stuck inside MPI may hold)
        # prints where the rank is and ends it, so the job ends; the test is the one started and never stopped.
        faulthandler.dump_traceback_later(TEST_LIMIT, exit=True)
        super().startTest(test)

    def stopTest(self, test):
        faulthandler.cancel_dump_traceback_later()
        super().stopTest(test)
        self._write(stop=test.id(), seconds=round(time.monotonic() - self._started, 4))

    def stopTestRun(self):
        super().stopTestRun()
        cpu = os.times()
        self._write(done=True, run=self.testsRun, failures=[t.id() for t, _ in self.failures],
                    errors=[t.id() for t, _ in self.errors], skips=len(self.skipped),
                    unexpected_successes=[t.id() for t in self.unexpectedSuccesses],
                    wall=round(time.monotonic() - STARTED, 3), cpu=round(cpu.user + cpu.system, 3))


class RecordingRunner(unittest.TextTestRunner):
    resultclass = RecordingResult


STARTED = time.monotonic()

if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv[1])
    import main  # mpi4py's test/main.py

    main.TestProgram(module=None, argv=[os.path.join(sys.argv[1], "main.py"), *sys.argv[3:]],
                     testRunner=RecordingRunner)
