"""Bad input found by issue 24's review: each refused with one line naming what was wrong (pure parts)."""
from __future__ import annotations

import argparse
import dataclasses
import grp
import os
import re

import pytest

from minicluster import client, config
from minicluster.cli import usage
from minicluster.cli.submit import _submit_args
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
    ({"op": "submit", "jobspec": {"argv": ["true", "x\udcff"]}}, "jobspec.argv[1] 'x\\xff'"),
    ({"op": "submit", "jobspec": {"env": {"A\udcff": "1"}}}, "a key of jobspec.env 'A\\xff'"),
    ({"op": "update", "name": "\udcfe"}, "name '\\xfe'"),
])
def test_a_string_that_is_not_utf8_is_named(message: dict[str, object], where: str) -> None:
    with pytest.raises(frames.NotText) as caught:
        frames.pack_request(message)
    assert str(caught.value).startswith(f"{where} is not valid UTF-8")


def test_bulksubmit_names_a_string_that_is_not_utf8_before_sending() -> None:
    with pytest.raises(frames.NotText, match=r"jobspec.argv\[1\] '\\xff' is not valid UTF-8"):
        list(client._batches([spec(argv=["true", "\udcff"])]))


@pytest.mark.parametrize("key, value", [
    ("heartbeat_interval", 0.0), ("heartbeat_interval", float("nan")), ("lost_after", float("nan")),
    ("lost_after", -1.0), ("lost_after", float("inf")), ("unresponsive_after", 0.0), ("kill_grace", -0.5),
    ("output_cap", -1), ("port_base", 70_000), ("status_port", -1), ("fanout", 0), ("size", 0),
    ("dispatch_window_grace", float("nan")), ("default_time_limit", 0.0), ("purge_max_count", -3),
])
def test_a_number_out_of_its_range_is_refused_naming_key_value_and_range(key: str, value: float) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.from_mapping({key: value})
    least, most = config.NUMBER_RANGES[key]
    assert f"{key} must be a number from {least:g} to {most:g}, got {value!r}" in str(caught.value)


def test_every_numeric_key_has_a_range_and_the_defaults_are_in_it() -> None:
    numeric = {f.name for f in dataclasses.fields(config.InstanceConfig) if f.type in ("int", "float")}
    assert numeric == set(config.NUMBER_RANGES)
    assert config.from_mapping({"dispatch_window_grace": float("inf")}).dispatch_window_grace == float("inf")


def test_access_group_must_name_a_group_of_this_host() -> None:
    with pytest.raises(config.ConfigError, match="access_group 'nosuchgroup-mc' is not a group of this host"):
        config.from_mapping({"access_group": "nosuchgroup-mc"}).check_access_group()
    config.from_mapping({"access_group": grp.getgrgid(os.getgid()).gr_name}).check_access_group()
    config.from_mapping({}).check_access_group()


@pytest.mark.parametrize("argv, says", [
    (["-n", "٣"], "'٣' is not a number of tasks (digits 0-9)"),
    (["-n", "+5"], "'+5' is not a number of tasks"),
    (["-N", "1\n"], "'1\\n' is not a number of nodes"),
    (["--retries", "1_000"], "'1_000' is not a number of retries"),
    (["-n", " 5"], "' 5' is not a number of tasks"),
    (["-c", "-1"], "must be a number of cores from 1 to"),
    (["-n", "9" * 5000], "must be a number of tasks from 1 to 16777216, got 9999"),
    (["-t", "٣"], "bad time limit '٣'"),
    (["--mem", "٣G"], "bad memory size '٣G'"),
])
def test_integer_options_take_ascii_digits_only(argv: list[str], says: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:  # the quick parser hands an unsure line to argparse: same tables
        _submit_args([*argv, "true"], "mc-submit")
    err = capsys.readouterr().err
    assert caught.value.code == 2 and says in err and err.count("\n") == 1 and len(err) < 300, err


def test_plain_integers_still_parse() -> None:
    assert _submit_args(["-n", "4", "-N", "2", "--retries", "0", "true"], "mc-submit").ntasks == 4


@pytest.mark.parametrize("text, says", [
    ("99999999999999999999", "time '99999999999999999999' is not between 0 (1970-01-01) and 100000000000"),
    ("nan", "bad time 'nan'"), ("inf", "bad time 'inf'"), ("١٢", "bad time '١٢'"),
    ("1_000", "bad time '1_000'"),
])
def test_usage_times_name_what_was_typed(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        usage.when(text)
    assert str(caught.value).startswith(says)


def test_usage_times_still_read() -> None:
    assert usage.when("1700000000") == 1_700_000_000.0 and usage.when("7d") > 0


@pytest.mark.parametrize("values, says", [
    ({"socket": "rel.sock"}, "socket must be an absolute path, got 'rel.sock'"),
    ({"socket": "/tmp/" + "x" * 120}, "is longer than a unix socket's 107 bytes"),
    ({"state_dir": "/tmp/" + "x" * 100}, "is longer than a unix socket's 107 bytes"),
])
def test_the_broker_socket_path_is_checked_at_load(values: dict[str, object], says: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(says)):
        config.from_mapping(values)
