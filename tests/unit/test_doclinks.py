"""The doc-link check .ci/gates runs (.ci/doclinks.py): GitHub's heading slugs, and bad links and references found."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doclinks", ROOT / ".ci" / "doclinks.py")
assert _spec is not None and _spec.loader is not None
doclinks = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("doclinks", doclinks)
_spec.loader.exec_module(doclinks)

GUIDE = """# Guide

## How the Job ends: the exact rules
## Tier (e): a real node
## `mc start`, step by step
## Restart
## Restart

```sh
# not a heading: inside a fence
```
"""


def test_slugs_follow_githubs_rule() -> None:
    assert doclinks.slug("How the Job ends: the exact rules") == "how-the-job-ends-the-exact-rules"
    assert doclinks.slug("Tier (e): a real node") == "tier-e-a-real-node"
    assert doclinks.slug("`mc start`, step by step") == "mc-start-step-by-step"
    assert doclinks.slug("mpi4py's suite") == "mpi4pys-suite"
    assert doclinks.slug("snake_case and [a link](x.md)") == "snake_case-and-a-link"


def test_anchors_number_duplicates_and_skip_fences() -> None:
    found = doclinks.anchors(GUIDE)
    assert {"guide", "restart", "restart-1", "tier-e-a-real-node", "mc-start-step-by-step"} <= found
    assert "not-a-heading-inside-a-fence" not in found


def test_bad_links_and_references_are_listed(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text(GUIDE)
    (tmp_path / "index.md").write_text(
        "See [the rules](guide.md#how-the-job-ends-the-exact-rules), [again](guide.md#restart-1) and [top](#index).\n"
        "# Index\n"
        "Broken: [gone](guide.md#durability), [missing](nowhere.md), [self](#no-such).\n"
        "`[in code](nowhere.md)` and [a site](https://example.com/x.md#y) are not checked.\n"
        "Plain: guide.md#restart is fine, guide.md#tiers is not.\n")
    bad = doclinks.bad_links(tmp_path / "index.md")
    assert [line.split(": ", 1)[1] for line in bad] == [
        "guide.md#durability: no heading with that anchor",
        "nowhere.md: no such file",
        "#no-such: no heading with that anchor",
        "guide.md#tiers: no heading with that anchor",
    ]
    assert all(line.startswith(f"{tmp_path / 'index.md'}:3") for line in bad[:3])
    assert doclinks.main([str(tmp_path / "index.md")]) == 1
    assert doclinks.main([str(tmp_path / "guide.md")]) == 0


def test_the_trees_docs_resolve() -> None:
    assert [line for f in doclinks.checked_files() for line in doclinks.bad_links(f)] == []
