"""The output file template (protocol.md §3.4): `{id}`, `{task}` and `{index}` are substituted, nothing else.

An explicit substitution, not `str.format`: a template is the user's text, and a format string would let it ask
for field widths, attributes or conversions the worker then computes (`{id:70000000}` builds 70 MB). Any other
brace is refused at submit (`check`), so a template the broker accepted always expands. No I/O.
"""
from __future__ import annotations

import re

from minicluster.model.text import brief

PLACEHOLDERS = ("{id}", "{task}", "{index}")
# PATH_MAX on Linux; a longer path cannot be opened anyway.
MAX_PATH_BYTES = 4096
_PLACEHOLDER = re.compile(r"(\{id\}|\{task\}|\{index\})")


class TemplateError(ValueError):
    """The template has a brace that is not one of PLACEHOLDERS, or cannot be a path."""


def check(template: str) -> None:
    """Raise TemplateError unless `template` is a path whose only braces are the placeholders."""
    if "\0" in template:
        raise TemplateError(f"{brief(template)} contains a NUL byte")
    if len(template.encode(errors="surrogatepass")) > MAX_PATH_BYTES:
        raise TemplateError(f"{brief(template)} is longer than {MAX_PATH_BYTES} bytes")
    for literal in _PLACEHOLDER.split(template)[::2]:
        brace = min((i for i in (literal.find("{"), literal.find("}")) if i >= 0), default=-1)
        if brace >= 0:
            raise TemplateError(f"{brief(literal[brace:], 20)} in {brief(template)} is not a placeholder; "
                                f"use {', '.join(PLACEHOLDERS)} (no other braces)")


def expand(template: str, job: int, task: int, index: int) -> str:
    """The path for one task; TemplateError for a template `check` refuses."""
    check(template)
    values = {"{id}": str(job), "{task}": str(task), "{index}": str(index)}
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], template)
