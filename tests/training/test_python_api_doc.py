"""The Python API's documentation runs as printed: docs/python-api.md's code blocks are executed,
and the first one prints what its comment says."""

import contextlib
import io
import re
from pathlib import Path

from service.model import Predictor

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def _code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_five_line_example_runs_as_printed(tmp_path, monkeypatch):
    example, *rest = _code_blocks()
    lines = [line for line in example.splitlines() if line.strip()]
    assert len(lines) <= 6, "the example should stay short"
    printed = re.search(r"# (accuracy \d+\.\d+%)", example)
    assert printed, "the example shows no printed accuracy"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(example, str(DOC), "exec"), namespace)
    assert output.getvalue().strip() == printed.group(1)
    saved = Predictor.load(tmp_path / "models" / "my-digits")
    assert saved.name == "my-digits"
    for block in rest:  # the later examples run after it, in its namespace
        exec(compile(block, str(DOC), "exec"), namespace)
