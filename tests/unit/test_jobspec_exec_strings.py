"""What the worker hands to execve and open is checked at submit (protocol.md §3.4): NUL bytes, env names, the
output template with only `{id}`, `{task}`, `{index}`; every message is short whatever the input's size."""
from __future__ import annotations

import pytest

from minicluster.model import jobspec as jobspec_model
from minicluster.model import outputpath
from minicluster.testing.builders import jobspec_wire

REFUSED = [
    (dict(output="out{"), "output: '{' in 'out{' is not a placeholder"),
    (dict(output="out}"), "output: '}' in 'out}' is not a placeholder"),
    (dict(output="/x/{id:70000000}"), "'{id:70000000}' in '/x/{id:70000000}' is not a placeholder"),
    (dict(output="/x/{id.real}"), "is not a placeholder"),
    (dict(output="/x/{0}"), "is not a placeholder"),
    (dict(output="/x/{{id}}"), "is not a placeholder"),
    (dict(output="/x/a\0b"), "contains a NUL byte"),
    (dict(output="/" + "x" * 5000), "longer than 4096 bytes"),
    (dict(env={"A=B": "1"}), "env: 'A=B' is not a variable name"),
    (dict(env={"": "1"}), "env: '' is not a variable name"),
    (dict(env={"A\0": "1"}), "is not a variable name"),
    (dict(env={"A": "x\0y"}), "env: the value of 'A' contains a NUL byte"),
    (dict(env={"A": "x" * (1 << 20)}), "env: longer than"),
    (dict(cwd="/tmp/\0"), "cwd: '/tmp/\\x00' contains a NUL byte"),
    (dict(cwd="/" + "d" * 5000), "cwd: longer than 4096 bytes"),
]


@pytest.mark.parametrize("fields, message", REFUSED)
def test_refused_with_a_message_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(jobspec_model.InvalidJobspec) as info:
        jobspec_model.from_wire(jobspec_wire(**fields))
    assert message in str(info.value)
    assert len(str(info.value)) < 300


def test_nul_in_argv_is_refused() -> None:
    with pytest.raises(jobspec_model.InvalidJobspec, match=r"argument 1 .* contains a NUL byte"):
        jobspec_model.from_wire(jobspec_wire(["echo", "a\0b"]))


@pytest.mark.parametrize("wire", [
    {"argv": ["true"], "ntasks": "n" * 1_000_000},
    {"argv": ["true"], "x" * 1_000_000: 1},
    {"argv": ["true"], "cwd": "relative/" * 100_000},
    {"argv": ["true"], "mpi": "m" * 1_000_000},
    {"argv": ["true"], "dependencies": "afterok:" + "1" * 1_000_000},
    {"argv": ["true"], "output": "{" * 1_000_000},
])
def test_messages_never_echo_unbounded_input(wire: dict) -> None:
    with pytest.raises(jobspec_model.InvalidJobspec) as info:
        jobspec_model.from_wire(wire)
    assert 0 < len(str(info.value)) <= jobspec_model.MAX_MESSAGE + 20


def test_placeholders_are_substituted_and_nothing_else() -> None:
    template = "/out/{id}/t{task}-i{index}-{id}.log"
    jobspec_model.from_wire(jobspec_wire(output=template))
    assert outputpath.expand(template, 7, 2, 40) == "/out/7/t2-i40-7.log"
    assert outputpath.expand("/plain.log", 7, 2, 40) == "/plain.log"
    with pytest.raises(outputpath.TemplateError):
        outputpath.expand("/x/{id:>9}", 7, 2, 40)
