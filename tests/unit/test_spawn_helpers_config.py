"""`spawn_helpers` (docs/architecture.md, "Spawn helpers"): what the config accepts, and how many helpers `auto`
gives a rank."""
from __future__ import annotations

import pytest

from minicluster.config import ConfigError, from_mapping
from worker.helpers import helper_count


@pytest.mark.parametrize("value", ["auto", 0, 1, 8])
def test_a_number_or_auto_is_accepted(value: int | str) -> None:
    assert from_mapping({"spawn_helpers": value}).spawn_helpers == value


@pytest.mark.parametrize("value", ["2", "many", -1, 257, True, 2.5])
def test_anything_else_is_a_clear_error(value: object) -> None:
    with pytest.raises(ConfigError, match='spawn_helpers must be "auto" or a number of helpers per rank'):
        from_mapping({"spawn_helpers": value})


@pytest.mark.parametrize(("cores", "helpers"), [(1, 0), (2, 0), (15, 0), (16, 1), (31, 1), (64, 4), (128, 8)])
def test_auto_gives_small_nodes_none_and_one_per_16_cores_above(cores: int, helpers: int) -> None:
    assert helper_count("auto", cores) == helpers
    assert helper_count(3, cores) == 3
