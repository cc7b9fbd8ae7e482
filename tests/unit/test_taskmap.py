"""TaskMap (broker/taskmap.py): array element -> task as runs, against the plain list it stands for."""
from __future__ import annotations

from array import array

import pytest

from broker.taskmap import TaskMap


def test_runs_read_as_one_sequence() -> None:
    tasks = TaskMap([array("I", [1, 4]), range(7, 10)])
    assert len(tasks) == 5 and list(tasks) == [1, 4, 7, 8, 9]
    assert [tasks[e] for e in range(5)] == [1, 4, 7, 8, 9] and tasks[-1] == 9
    with pytest.raises(IndexError):
        tasks[5]


def test_extend_head_and_tail_match_a_list() -> None:
    tasks, plain = TaskMap([range(3)]), [0, 1, 2]
    for more in ([5], [6, 8], []):
        tasks.extend(more)
        plain.extend(more)
    assert list(tasks) == plain and len(tasks) == len(plain)
    for cut in range(len(plain) + 1):
        assert list(tasks.head(cut)) == plain[:cut] and tasks.tail(cut) == plain[cut:]
    assert not TaskMap() and not TaskMap([range(0), array("I")])


def test_a_huge_run_costs_nothing_to_hold_or_index() -> None:
    tasks = TaskMap([array("I", [3]), range(10, 10**8)])
    assert len(tasks) == 10**8 - 9 and tasks[10**8 - 10] == 10**8 - 1
    assert tasks.tail(len(tasks) - 2) == [10**8 - 2, 10**8 - 1]
