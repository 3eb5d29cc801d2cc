"""The Python API's documentation runs as printed: the README's example and
docs/using/python-api.md's
code blocks are executed, and the first one prints what its comment says."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from service.model import Predictor

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "using" / "python-api.md"
README = ROOT / "README.md"


def _code_blocks(path: Path = DOC) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL)


def _readme_example() -> str:
    (example,) = [b for b in _code_blocks(README) if "BasisExpandingSVC" in b]
    return example


def test_the_readme_shows_the_same_example():
    assert _readme_example() == _code_blocks(DOC)[0]


@pytest.mark.parametrize("document", [README, DOC], ids=["README", "docs"])
def test_the_five_line_example_runs_as_printed(tmp_path, monkeypatch, document):
    example, *rest = [_readme_example()] if document == README else _code_blocks(document)
    lines = [line for line in example.splitlines() if line.strip()]
    assert len(lines) <= 6, "the example should stay short"
    printed = re.search(r"# (accuracy \d+\.\d+%)", example)
    assert printed, "the example shows no printed accuracy"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(example, str(document), "exec"), namespace)
    assert output.getvalue().strip() == printed.group(1)
    saved = Predictor.load(tmp_path / "models" / "my-digits")
    assert saved.name == "my-digits"
    for block in rest:  # the later examples run after it, in its namespace
        exec(compile(block, str(DOC), "exec"), namespace)
