"""model/text.py: what users typed is shown as text, never as terminal commands."""
from __future__ import annotations

from minicluster.model.text import control_character, printable


def test_printable_escapes_what_a_terminal_would_obey_and_keeps_the_rest() -> None:
    assert printable("\033]0;x\007\033[2J") == "\\033]0;x\\007\\033[2J"
    assert printable("nul\0 del\x7f c1\x9b tab\t nl\n") == "nul\\000 del\\177 c1\\233 tab\\011 nl\\012"
    assert printable("bidi\u202eevil\u2028") == "bidi\\u202eevil\\u2028"
    assert printable("plain é 日本 [bold] a\\b") == "plain é 日本 [bold] a\\b"


def test_control_character_names_the_first_c0_or_del() -> None:
    assert control_character("ok name-1.2") is None
    assert control_character("é日本\u202e") is None  # shown escaped, but not refused in a name
    assert control_character("a\tb\0") == "\\011"
    assert control_character("x\x7f") == "\\177"
