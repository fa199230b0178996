"""Every results table in README.md and docs/ is rendered from benchmarks/results/*.json
(benchmarks/render_docs.py): a block that differs from what the JSON gives, a marker naming no
block, or a results table outside the markers fails here."""

from pathlib import Path

import pytest

from benchmarks.render_docs import (
    BLOCKS,
    ROOT,
    UnknownBlock,
    doc_files,
    render_text,
    unrendered_tables,
)


@pytest.fixture(scope="module")
def cache() -> dict[str, str]:
    return {}


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_rendered_blocks_match_the_json(path: Path, cache):
    text = path.read_text()
    assert render_text(text, path, cache) == text, (
        f"{path.name}: a rendered block differs from benchmarks/results/*.json; run "
        "python -m benchmarks.render_docs")


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_results_tables_are_inside_markers(path: Path):
    assert unrendered_tables(path.read_text()) == []


def test_a_changed_number_is_caught(cache):
    readme = ROOT / "README.md"
    text = readme.read_text()
    start = text.index("<!-- rendered: headline-goal -->")
    end = text.index("<!-- /rendered -->", start)
    block = text[start:end]
    i = next(i for i, c in enumerate(block) if c.isdigit() and block[i - 1] in " +")
    changed = text[:start + i] + str((int(block[i]) + 1) % 10) + text[start + i + 1:]
    assert changed != text
    assert render_text(changed, readme, cache) == text


def test_a_marker_naming_no_block_fails():
    with pytest.raises(UnknownBlock, match="no-such-block"):
        render_text("<!-- rendered: no-such-block -->\nx\n<!-- /rendered -->\n",
                    ROOT / "README.md")


def test_a_numeric_table_outside_markers_is_found_and_allowed_tables_are_not():
    results = "| task | accuracy |\n|---|---|\n| SST-2 | 71.4 |\n"
    option = "| command | what it does |\n|---|---|\n| `rapt tune --epochs 3` | tunes |\n"
    fenced = "```\n" + results + "```\n"
    assert unrendered_tables(results) == ["| task | accuracy |"]
    assert unrendered_tables(option + fenced) == []
    inside = "<!-- rendered: defaults -->\n" + results + "<!-- /rendered -->\n"
    assert unrendered_tables(inside) == []


def test_every_block_is_used_somewhere():
    text = "".join(p.read_text() for p in doc_files())
    assert [n for n in BLOCKS if f"<!-- rendered: {n} -->" not in text] == []


def test_readme_links_point_at_files():
    """The README is not part of the site's build, so its relative links are checked here."""
    import re

    text = (ROOT / "README.md").read_text()
    targets = {m[1].split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)
               if "://" not in m[1]}
    assert sorted(t for t in targets if t and not (ROOT / t).exists()) == []
