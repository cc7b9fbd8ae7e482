"""The text id-set (protocol.md §1) used by arrays, ranks and free-core listings."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from minicluster.model.idset import IdSet, IdSetError


def test_parse_ranges_lists_and_steps() -> None:
    ids = IdSet.parse("1-5,8,10-20:5")
    assert list(ids) == [1, 2, 3, 4, 5, 8, 10, 15, 20]
    assert len(ids) == 9 and str(ids) == "1-5,8,10-20:5"
    assert ids[5] == 8 and ids[8] == 20 and ids.ordinal(15) == 7
    assert 15 in ids and 14 not in ids


@pytest.mark.parametrize("text", ["", " 1", "1-x", "5-1", "1-3,2", "-1", "1:0", "1-4:0"])
def test_bad_text_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(IdSetError) as info:
        IdSet.parse(text)
    assert repr(text) in str(info.value) or text == ""


def test_huge_sets_stay_compact() -> None:
    ids = IdSet.parse("0-99999999")
    assert len(ids) == 100_000_000 and ids[99_999_999] == 99_999_999


@given(st.sets(st.integers(0, 500)))
def test_from_ints_round_trips_through_text(values: set[int]) -> None:
    ids = IdSet.from_ints(values)
    assert list(ids) == sorted(values)
    assert (IdSet.parse(str(ids)) == ids) if values else str(ids) == ""
    for n, value in enumerate(sorted(values)):
        assert ids[n] == value and ids.ordinal(value) == n
