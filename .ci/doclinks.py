#!/usr/bin/env python3
"""Check that the relative links of the docs resolve: the file exists and the anchor names one of its headings.

    python3 .ci/doclinks.py            # README.md, CONTRIBUTING.md, docs/*.md, examples/**/README.md, and the
                                       # `name.md#anchor` references in the code (broker, worker, minicluster, ...)
    python3 .ci/doclinks.py FILE...    # just these

Markdown links `[text](path#anchor)` are checked in the markdown files; a plain reference `docs/x.md#anchor` in
any checked file (a docstring, a comment, prose) is looked for next to that file, then at the top of the tree,
then in docs/. Exits 1 listing each bad one as `file:line: target: why`. An anchor is matched against GitHub's
heading slugs: lowercase, punctuation dropped but for '-' and '_', each space a '-', the second heading with the
same slug gets '-1', the third '-2'. Markdown links inside code (fenced blocks, `spans`) and links with a scheme are
not checked.
Standard library only: .ci/gates runs it before anything is installed but Python.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+).*?\1")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
REFERENCE = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)#([\w-]*\w)")
CODE_DIRS = ("broker", "worker", "minicluster", "tests", "benchmarks", "scripts")
NOT_CHECKED = {"tests/unit/test_doclinks.py"}  # this check's own test: its fixtures are bad on purpose


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = "".join(c for c in text.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, with their numbers (from 1)."""
    lines, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append((number, line))
    return lines


def anchors(text: str) -> set[str]:
    """Every anchor a file offers: its headings' slugs (duplicates numbered as GitHub does) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of each relative link in the prose, code spans left out."""
    out = []
    for number, line in prose_lines(text):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not SCHEME.match(target):
                out.append((number, target))
    return out


def references(text: str) -> list[tuple[int, str]]:
    """(line, `name.md#anchor`) of each plain reference, markdown link targets left out (links() has those)."""
    return [(number, f"{file}#{anchor}") for number, line in enumerate(text.splitlines(), 1)
            for file, anchor in REFERENCE.findall(re.sub(r"\]\([^)]*\)", "]", line))]


def why_bad(dest: Path, anchor: str, cache: dict[Path, set[str]]) -> str | None:
    """Why a link to dest#anchor does not resolve, or None when it does."""
    if not dest.exists():
        return "no such file"
    if not anchor or dest.suffix != ".md":
        return None
    if dest not in cache:
        cache[dest] = anchors(dest.read_text())
    return None if anchor in cache[dest] else "no heading with that anchor"


def bad_links(path: Path) -> list[str]:
    """`file:line: target: why` for each link or reference in the file at path that does not resolve."""
    bad = []
    cache: dict[Path, set[str]] = {}
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    text = path.read_text()
    for number, target in links(text) if path.suffix == ".md" else []:
        file_part, _, anchor = target.partition("#")
        why = why_bad((path.parent / file_part).resolve() if file_part else path.resolve(), anchor, cache)
        if why:
            bad.append(f"{name}:{number}: {target}: {why}")
    for number, target in references(text):
        file_part, _, anchor = target.partition("#")
        places = [path.parent / file_part, ROOT / file_part, ROOT / "docs" / file_part]
        why = why_bad(next((p for p in places if p.exists()), places[0]).resolve(), anchor, cache)
        if why:
            bad.append(f"{name}:{number}: {target}: {why}")
    return bad


def checked_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "examples").glob("**/README.md"))]
    files += [f for d in CODE_DIRS for f in sorted((ROOT / d).rglob("*.py"))
              if f.relative_to(ROOT).as_posix() not in NOT_CHECKED]
    return [f for f in files if f.exists()]


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or checked_files()
    bad = [line for f in files for line in bad_links(f)]
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} doc link(s) do not resolve", file=sys.stderr)
        return 1
    print(f"doc links resolve in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
