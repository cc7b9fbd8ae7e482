"""Bad input found by issue 24's review: each refused with one line naming what was wrong (pure parts)."""
from __future__ import annotations

import pytest

from minicluster.model import jobspec, restree
from minicluster.model.jobterms import InvalidJobspec
from minicluster.proto import frames


def spec(**fields: object) -> dict[str, object]:
    return {"argv": ["true"], "env": {}, "cwd": "/tmp", **fields}


@pytest.mark.parametrize("levels", [17, 500, 5000])
def test_a_deep_resource_tree_is_refused_in_both_spellings(levels: int) -> None:
    text = "node[1]>" * (levels - 1) + "core[1]"
    with pytest.raises(restree.TreeError, match="deeper than 16 levels") as caught:
        restree.parse(text)
    assert len(str(caught.value)) < 300  # the message quotes the text cut short
    vertex: dict[str, object] = {"type": "core", "count": 1}
    for _ in range(levels - 1):
        vertex = {"type": "node", "count": 1, "with": [vertex]}
    with pytest.raises(restree.TreeError, match="deeper than 16 levels"):
        restree.from_wire([vertex])


def test_sixteen_levels_still_parse() -> None:
    assert restree.parse("node[1]>" * 15 + "core[1]")


def test_a_count_of_thousands_of_digits_is_a_tree_error() -> None:
    with pytest.raises(restree.TreeError, match="count too large"):
        restree.parse("node[" + "9" * 5000 + "]")


def test_ntasks_must_be_a_multiple_of_tasks_per_node() -> None:
    with pytest.raises(InvalidJobspec, match="ntasks=1 is not a multiple of tasks_per_node=3"):
        jobspec.from_wire(spec(tasks_per_node=3))
    assert jobspec.from_wire(spec(ntasks=6, tasks_per_node=3)).tasks_per_node == 3


def test_a_bad_queue_name_is_quoted_once() -> None:
    with pytest.raises(InvalidJobspec) as caught:
        jobspec.from_wire(spec(queue="q\x1b]0;x"))
    assert str(caught.value).startswith("queue: 'q\\x1b]0;x' is not a queue name")


@pytest.mark.parametrize("c", ["\x80", "\x9b", "\x9f"])
def test_a_job_name_may_hold_no_c1_control_character(c: str) -> None:
    with pytest.raises(InvalidJobspec, match="control character"):
        jobspec.from_wire(spec(name=f"a{c}b"))
    assert jobspec.from_wire(spec(name="a\xa0é")).name == "a\xa0é"  # just past C1: printable


@pytest.mark.parametrize("message, where", [
    ({"op": "submit", "jobspec": {"argv": ["true", "x\udcff"]}}, "jobspec.argv[1] 'x\\\\xff'"),
    ({"op": "submit", "jobspec": {"env": {"A\udcff": "1"}}}, "a key of jobspec.env 'A\\\\xff'"),
    ({"op": "update", "name": "\udcfe"}, "name '\\\\xfe'"),
])
def test_a_string_that_is_not_utf8_is_named(message: dict[str, object], where: str) -> None:
    with pytest.raises(frames.NotText) as caught:
        frames.pack_request(message)
    assert str(caught.value).startswith(f"{where} is not valid UTF-8")
