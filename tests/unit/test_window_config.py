"""`dispatch_window_grace` (protocol.md §2.10): what the config accepts, from a mapping and from config.toml."""
from __future__ import annotations

from pathlib import Path

import pytest

from minicluster.config import ConfigError, from_mapping, load


@pytest.mark.parametrize("value", [0, 0.5, 1, 30.0, float("inf")])
def test_a_number_of_seconds_is_accepted(value: float) -> None:
    assert from_mapping({"dispatch_window_grace": value}).dispatch_window_grace == value


@pytest.mark.parametrize("value", [-1, -0.1, float("nan")])
def test_a_negative_grace_is_a_clear_error(value: float) -> None:
    with pytest.raises(ConfigError, match=r"dispatch_window_grace must be a number from 0 to inf, got"):
        from_mapping({"dispatch_window_grace": value})


@pytest.mark.parametrize("value", ["1s", True])
def test_anything_but_a_number_names_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match="dispatch_window_grace must be float"):
        from_mapping({"dispatch_window_grace": value})


def test_config_toml_sets_it(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("dispatch_window_grace = 3\n")
    assert load(path).dispatch_window_grace == 3.0
