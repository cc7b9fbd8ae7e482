"""PMI-1 "simple" wire protocol codec.

Implements the message syntax of Flux RFC 13, sections "Wire Protocol",
"Error Handling" and the macros of "Protocol Definition": one request per
newline-terminated line made of ``key=value`` tuples, the first of which is
``cmd=NAME`` (or ``mcmd=NAME`` for the multi-line spawn request).

Pure: no I/O.  Every malformed input raises :class:`WireError`, a
``ValueError`` the server turns into a logged protocol error instead of
letting it escape.

Value handling.  MPICH 4+ clients escape a space inside a value as ``\\ ``
and unescape what they read, while older clients send RFC 13 ``string``
values (abort messages) with bare spaces.  Both are accepted: tokens are
split on unescaped spaces, escapes are kept verbatim so a value round-trips
byte for byte through put/get, and a token without ``=`` continues the
previous value.  :func:`unescape` gives the human-readable form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Bytes that are not UTF-8 must survive put -> get unchanged, so lines are
# decoded and encoded with the same lossless error handler.
ENCODING = "utf-8"
ERRORS = "surrogateescape"


class WireError(ValueError):
    """A request line that does not follow the PMI-1 wire syntax."""


@dataclass(frozen=True)
class Request:
    """One parsed request line."""

    cmd: str
    args: dict[str, str] = field(default_factory=dict)
    multi: bool = False  # True for ``mcmd=``: more lines follow until ``endcmd``

    def get_int(self, key: str) -> int:
        """The integer value of ``key``; WireError if missing or not an int."""
        raw = self.args.get(key)
        if raw is None:
            raise WireError(f"cmd={self.cmd}: missing {key}=")
        try:
            return int(raw)
        except ValueError:
            raise WireError(f"cmd={self.cmd}: {key}={raw!r} is not an integer") from None


def decode(raw: bytes) -> str:
    """Bytes from the socket to text, losslessly."""
    return raw.decode(ENCODING, ERRORS)


def encode(text: str) -> bytes:
    """Text back to the exact bytes it was decoded from."""
    return text.encode(ENCODING, ERRORS)


def _tokens(line: str) -> list[str]:
    """Split on spaces that are not escaped by a backslash; keep escapes."""
    tokens: list[str] = []
    current: list[str] = []
    chars = iter(line)
    for ch in chars:
        if ch == "\\":
            current.append(ch)
            current.append(next(chars, ""))
        elif ch == " ":
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


def parse_request(line: str) -> Request:
    """Parse one request line (the trailing newline is optional)."""
    line = line.rstrip("\r\n")
    if "\n" in line:
        raise WireError("more than one line given")
    tokens = _tokens(line)
    if not tokens:
        raise WireError("empty request line")
    args: dict[str, str] = {}
    last_key: str | None = None
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep:
            if last_key is None:
                raise WireError(f"request must start with cmd= or mcmd=, got {token[:40]!r}")
            args[last_key] += " " + token
            continue
        if not key:
            raise WireError(f"token with empty key: {token[:40]!r}")
        if key in args:
            raise WireError(f"duplicate key {key!r}")
        args[key] = value
        last_key = key
    first = tokens[0].partition("=")[0]
    if first not in ("cmd", "mcmd"):
        raise WireError(f"request must start with cmd= or mcmd=, got {tokens[0][:40]!r}")
    cmd = args.pop(first)
    if not cmd:
        raise WireError(f"{first}= has an empty command name")
    return Request(cmd=cmd, args=args, multi=first == "mcmd")


def format_response(cmd: str, **fields: object) -> str:
    """Build ``cmd=CMD k=v ...\\n``; values are sent as given (already escaped)."""
    parts = [f"cmd={cmd}"]
    for key, value in fields.items():
        text = str(value)
        if "\n" in text:
            raise WireError(f"response value for {key!r} contains a newline")
        parts.append(f"{key}={text}")
    return " ".join(parts) + "\n"


def unescape(value: str) -> str:
    """Undo backslash escapes, e.g. for logging an abort message."""
    out: list[str] = []
    chars = iter(value)
    for ch in chars:
        out.append(next(chars, "") if ch == "\\" else ch)
    return "".join(out)
