"""The documentation's shape: the README is a short guide, every link resolves, every command
in the pages users follow is marked as run by the example test or says why it is not."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.docs import markdown

DOCUMENTS = markdown.documents()
IDS = [str(p.relative_to(markdown.ROOT)) for p in DOCUMENTS]


def test_the_readme_is_a_short_guide():
    lines = markdown.README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"
    text = markdown.README.read_text()
    for command in ("make run", "make test"):
        assert command in text
    assert "(docs/README.md)" in text, "the README links to the map of the docs"


def test_every_page_is_on_the_map():
    mapped = {
        markdown.DOCS / unquote(target) for _, target in markdown.links(markdown.DOCS / "README.md")
    }
    pages = {
        path
        for path in markdown.DOCS.rglob("*.md")
        if path.name != "README.md" or path.parent != markdown.DOCS
    }
    # The generated reports are reached through the results page, not the map.
    pages = {p for p in pages if "reports" not in p.relative_to(markdown.DOCS).parts}
    assert pages - mapped == set(), "docs/README.md does not list these pages"


@pytest.mark.parametrize("document", DOCUMENTS, ids=IDS)
def test_every_relative_link_resolves(document: Path):
    broken = []
    for line, target in markdown.links(document):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / unquote(path)).resolve() if path else document
        if not resolved.exists():
            broken.append(f"{document.name}:{line}: {target} (no {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in markdown.anchors(resolved):
            broken.append(f"{document.name}:{line}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    "document", [d for d in DOCUMENTS if markdown.must_be_marked(d)], ids=lambda p: p.name
)
def test_every_command_is_run_or_says_why_not(document: Path):
    found = markdown.blocks(document)
    for i, block in enumerate(found):
        if block.runnable:
            assert block.kind in ("example", "not-run"), (
                f"{block.where}: mark the block <!-- example --> (run by tests/docs/"
                "test_examples.py) or <!-- not-run: why -->"
            )
        if block.kind == "not-run":
            assert block.options, f"{block.where}: say why it is not run"
        if block.kind == "output":
            before = found[i - 1].kind if i > 0 else None
            assert before == "example", f"{block.where}: an output block follows its example"
        if block.kind == "example":
            markdown.server_of(block)  # its settings parse


def test_the_output_comparison_can_fail():
    answer = '{"label": "7", "score": 0.7966267304146161, "model_version": "' + "a" * 64 + '"}'
    shown = '{"label": "7", "score": 0.7966, "model_version": "' + "b" * 64 + '"}'
    assert markdown.differences(answer, shown) == []
    assert markdown.differences(answer.replace("0.7966", "0.7986"), shown)
    assert markdown.differences(answer.replace('"7"', '"1"'), shown)
    assert markdown.differences(answer.replace("a" * 64, "v1"), shown)
    assert markdown.differences("accuracy 97.11%\n", "accuracy 97.11%") == []
    assert markdown.differences("accuracy 96.11%\n", "accuracy 97.11%")
    assert markdown.differences("[b'7' b'5']", "[b'7' b'4']")
