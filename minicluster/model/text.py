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


def printable(text: str) -> str:
    """`text` safe to show on a terminal: each control or other unprintable character (ESC, NUL, DEL, C1, bidi
    overrides, line separators) as a backslash escape, `\\033` for ESC as `ls -b` writes it (`\\u202e` beyond one
    byte), so that what a user named a job is seen, never obeyed. A backslash itself stays as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\{code:03o}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def control_character(text: str) -> str | None:
    """The first control character (C0: NUL to US, DEL, and C1: U+0080-U+009F, which some terminals obey as
    escapes) in `text`, escaped, or None: names refuse them."""
    for c in text:
        if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f:
            return _escaped(c)
    return None
