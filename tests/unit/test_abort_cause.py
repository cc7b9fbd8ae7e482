"""The cause rank 0 names for an MPI job that aborted (broker/abortcause.py, protocol.md §2.8 "Aborts")."""

import pytest

from broker.abortcause import AbortSettlement

CAUSE_7 = (3, "task 7 on rank 3 called abort(3)")
REACTION_3 = (14, "task 3 on rank 1 called abort(14)")
EXIT_7 = (4, "task 7 on rank 3 exited with status 4")
EXIT_3 = (14, "task 3 on rank 1 exited with status 14")


def settle(*seen: tuple[str, int, float, tuple[int, str]]) -> tuple[int, str]:
    settlement = AbortSettlement()
    for kind, task, when, cause in seen:
        getattr(settlement, kind)(task, when, cause)
    return settlement.cause()


@pytest.mark.parametrize(("seen", "named"), [
    # A peer's reaction reaches rank 0 first, the real abort after it: the earlier stamp wins.
    ([("abort", 3, 10.2, REACTION_3), ("abort", 7, 10.1, CAUSE_7)], CAUSE_7),
    # The reacting peer's exit arrives before the real abort: still the earliest.
    ([("abort", 3, 10.2, REACTION_3), ("exit", 3, 10.25, EXIT_3), ("abort", 7, 10.1, CAUSE_7)], CAUSE_7),
    # A task's own abort precedes its exit even when the worker stamped the abort later.
    ([("exit", 7, 10.0, EXIT_7), ("abort", 7, 10.3, CAUSE_7), ("abort", 3, 10.2, REACTION_3)], CAUSE_7),
    # A crash (exit, no abort) before the peers' reactions names the exit.
    ([("abort", 3, 10.2, REACTION_3), ("exit", 7, 10.1, EXIT_7)], EXIT_7),
    # A tie between an abort and another task's exit goes to the abort.
    ([("exit", 3, 10.1, EXIT_3), ("abort", 7, 10.1, CAUSE_7)], CAUSE_7),
    # The first report of a task counts; a repeat does not move its time.
    ([("abort", 7, 10.1, CAUSE_7), ("abort", 7, 9.0, REACTION_3), ("abort", 3, 10.0, REACTION_3)], REACTION_3),
])
def test_the_earliest_cause_is_named(seen: list[tuple[str, int, float, tuple[int, str]]],
                                     named: tuple[int, str]) -> None:
    assert settle(*seen) == named
