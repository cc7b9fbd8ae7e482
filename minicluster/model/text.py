"""Quoting a client's values in messages: never more than a bounded prefix of them. No I/O."""
from __future__ import annotations


def brief(text: str, limit: int = 60) -> str:
    """`text` quoted for an error message, cut at `limit` characters: messages never echo unbounded input."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def cut(text: str, limit: int = 200) -> str:
    """`text` as it is when short, else its first `limit` characters and an ellipsis."""
    return text if len(text) <= limit else f"{text[:limit]}…"
