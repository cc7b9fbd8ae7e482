"""Hostile jobspecs for fuzzing (issue 10): any map a client can send, huge, nested and NUL-laden.

Only what msgpack carries: no lone surrogates (the client socket's decoder refuses invalid UTF-8 before any
jobspec is read), nesting well under msgpack's own limit, and at most a few MB per spec (a frame is 16 MiB).
"""
from __future__ import annotations

from hypothesis import strategies as st

from minicluster.model import jobspec as jobspec_model

FIELDS = sorted(jobspec_model.Jobspec.__dataclass_fields__)
_CHARS = st.sampled_from("a/{}=:,-.0\0 é") | st.characters(blacklist_categories=["Cs"])
TEXT = st.text(alphabet=_CHARS, max_size=40)
HUGE = st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "\0", "{", "9", "a=b,", "0-"]),
                 st.sampled_from([1000, 100_000, 1_000_000]))
SCALAR = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True)
          | TEXT | HUGE | st.binary(max_size=20))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                     max_leaves=12)
SPEC = st.fixed_dictionaries({"argv": st.lists(TEXT | HUGE, max_size=3) | VALUE},
                             optional={name: VALUE for name in FIELDS if name != "argv"})
# One field gone wrong in an otherwise good spec: reaches the checks behind the first ones.
FIELD_NAMES = st.sampled_from(["env", "requires", "resources", "dependencies", "on_exit", "array", "output",
                               "cwd", "stdin", "ntasks", "time_limit", "success_indexes"])


def nested(depth: int) -> list:
    """A list nested `depth` deep."""
    root: list = []
    inner = root
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return root
