"""Request values, constraint parsing, id-sets and the allocation wire format."""
import itertools

import pytest

from broker.sched import Allocation, RankAlloc, Request, Slot, parse_constraint
from broker.sched import idset
from broker.sched.request import format_constraint


def test_parse_constraint_forms():
    assert parse_constraint("zone=a") == ("zone", frozenset({"a"}))
    assert parse_constraint(" gpu=h100|a100 ") == ("gpu", frozenset({"h100", "a100"}))
    assert parse_constraint("spot") == ("spot", frozenset())
    assert format_constraint(parse_constraint("gpu=h100|a100")) == "gpu=a100|h100"


@pytest.mark.parametrize("text, fragment", [
    ("", "empty constraint"),
    ("=a", "property name"),
    ("zone=", "value ''"),
    ("zone=a||b", "value ''"),
    ("9zone=a", "must start with a letter"),
    ("zone=a b", "value 'a b'"),
])
def test_parse_constraint_errors_are_clear(text, fragment):
    with pytest.raises(ValueError, match=fragment.replace("|", r"\|")):
        parse_constraint(text)


@pytest.mark.parametrize("fields, fragment", [
    ({"nslots": 0}, "nslots must be >= 1"),
    ({"cores_per_slot": 0}, "cores_per_slot"),
    ({"gpus_per_slot": -1}, "gpus_per_slot"),
    ({"nnodes": 3, "nslots": 2}, "exceeds nslots"),
    ({"nslots": 5, "slots_per_node": 2}, "not a multiple"),
    ({"nslots": 4, "slots_per_node": 2, "nnodes": 3}, "exceeds nslots|!= nslots"),
])
def test_request_validation(fields, fragment):
    with pytest.raises(ValueError, match=fragment):
        Request(**fields)


def test_node_counts_spread_evenly_like_flux():
    assert Request(nslots=8, nnodes=4).node_counts() == (2, 2, 2, 2)
    assert Request(nslots=5, nnodes=2).node_counts() == (3, 2)
    assert Request(nslots=6, slots_per_node=3).node_counts() == (3, 3)
    assert Request(nslots=6).node_counts() is None


def test_request_is_hashable_and_constraint_order_free():
    a = Request.from_strings(["zone=a", "spot"], nslots=2)
    b = Request.from_strings(["spot", "zone=a"], nslots=2)
    assert a == b and hash(a) == hash(b)


def test_idset_masks_and_iteration():
    mask = idset.to_mask([0, 5, 64, 1000])
    assert list(idset.iter_ascending(mask)) == [0, 5, 64, 1000]
    assert list(idset.iter_descending(mask)) == [1000, 64, 5, 0]
    assert idset.lowest(mask, 2) == ((0, 5), 0b100001)


@pytest.mark.parametrize("ids", [[], [0], [3], [0, 1, 2, 3], [1, 2, 5, 6, 7, 64], list(range(64)),
                                 [0, 2, 4, 6], [*range(10, 1000), 5000]])
def test_idset_runs_are_the_consecutive_ids(ids: list[int]) -> None:
    runs = list(idset.runs(idset.to_mask(ids)))
    assert [i for r in runs for i in r] == ids
    assert all(r.step == 1 and len(r) for r in runs)
    assert all(a.stop < b.start for a, b in itertools.pairwise(runs)), "maximal runs: a gap between each two"


def test_allocation_orders_ranks_and_tasks():
    alloc = Allocation({
        3: RankAlloc((Slot((4, 5), (1,), 100),)),
        1: RankAlloc((Slot((0,)), Slot((1,)))),
    }, exclusive=True)
    assert list(alloc) == [1, 3] and alloc.exclusive
    assert alloc == Allocation({1: alloc[1], 3: alloc[3]}, exclusive=True) != Allocation(dict(alloc.items()))
    assert [r for r, _ in alloc.task_slots()] == [1, 1, 3]
    assert alloc.nslots == 3 and alloc[3].cores == (4, 5) and alloc[3].gpus == (1,)
