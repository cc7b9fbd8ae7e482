"""Tables as a pipe gets them (minicluster/cli/format.py plain_text): laid out as rich lays out the same table,
which is the reference here, for the table shapes the commands print and cells with markup, escaped user text,
wide characters and empty columns."""
from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from minicluster.cli import format as fmt


def rich_text(table: fmt.Table) -> str:
    """What print_table wrote before it laid tables out itself: rich's layout, plain, trailing blanks stripped."""
    console = Console(width=1024, color_system=None, record=True, file=io.StringIO())
    console.print(table)
    return "".join(line.rstrip() + "\n" for line in console.export_text().splitlines())


WORDS = ["up", "down", "lost", "x", "node-17", "[bold]not markup[/]", "✓ wide 漢字", "", "a b  c", "-", "12345"]


@pytest.mark.parametrize("seed", range(40))
def test_plain_text_is_rich_layout(seed: int) -> None:
    rng = random.Random(seed)
    headers = rng.sample(["ID", "RANK", "NAME", "STATE", "HOST", "NODES", "REASON", "NTASKS"], rng.randrange(1, 7))
    table = fmt.table(*headers)
    for _ in range(rng.randrange(0, 12)):
        cells = []
        for _ in headers:
            word = rng.choice(WORDS)
            styled = fmt.styled(rng.choice(["up", "down", "lost"]), fmt.RANK_STYLE)
            cells.append(rng.choice([fmt.shown(word), styled, str(rng.randrange(10 ** rng.randrange(1, 6)))]))
        table.add_row(*cells)
    assert fmt.plain_text(table) == rich_text(table)


def test_the_commands_tables_are_rich_layout() -> None:
    ranks = [{"rank": r, "hostname": f"n{r}", "state": "up" if r % 3 else "drained",
              "reason": "" if r % 3 else "[x] hw",
              "cores_total": 64, "cores_free": r, "gpus_total": 0, "gpus_free": 0, "memory_mb_total": 4096,
              "memory_mb_free": 100 * r, "properties": {"zone": "a"} if r % 2 else {}} for r in range(25)]
    table = fmt.resources_table(ranks)
    assert fmt.plain_text(table) == rich_text(table)
    rows = [{"rank": r, "state": "up", "pid": 100 + r, "hostname": f"h{r}", "endpoint": f"tcp://h{r}:5000",
             "since": 1000.0 + r} for r in range(12)]
    table = fmt.status_table(rows, 2000.0)
    assert fmt.plain_text(table) == rich_text(table)
