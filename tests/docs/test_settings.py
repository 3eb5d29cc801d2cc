"""docs/reference/settings.md lists every setting of service/api/settings.py, and no other, with
its default: the page cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.api import Settings
from tests.docs import markdown

PAGE = markdown.DOCS / "reference" / "settings.md"


def _table(title_row: str) -> dict[str, str]:
    """variable -> the first `value` of its default cell, of the table after ``title_row``."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(title_row)
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        variable, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
        name = re.fullmatch(r"`([A-Z0-9_]+)`", variable)
        assert name, f"{PAGE.name}: {variable!r} is not one `VARIABLE`"
        first = re.match(r"`([^`]*)`", default)
        rows[name.group(1)] = first.group(1) if first else default
    return rows


def _documented(value):
    """A field's default as the page writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list) and not value:
        return "empty"
    if isinstance(value, Path):
        return str(value)
    return value


SETTINGS = _table("| variable | default | meaning |")


def test_every_setting_is_documented_and_nothing_else():
    fields = {name.upper() for name in Settings.model_fields}
    assert set(SETTINGS) - fields == set(), "documented, but not a setting"
    assert fields - set(SETTINGS) == set(), "settings missing from docs/reference/settings.md"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_the_documented_default_is_the_settings(name):
    field = Settings.model_fields[name]
    default = field.get_default(call_default_factory=True)
    shown, expected = SETTINGS[name.upper()], _documented(default)
    if isinstance(expected, int | float):
        assert float(shown) == expected, (
            f"{name.upper()}: the page says {shown}, the code {expected}"
        )
    else:
        assert shown == expected, f"{name.upper()}: the page says {shown}, the code {expected}"


def test_the_variables_read_outside_the_settings_are_used():
    """Each is read by our code, or set by the image for the library that reads it (numba)."""
    rows = PAGE.read_text().split("## Read outside the settings", 1)[1].split("\n## ", 1)[0]
    sources = [
        *(markdown.ROOT / "service").rglob("*.py"),
        *(markdown.ROOT / "training").rglob("*.py"),
        markdown.ROOT / "Dockerfile",
    ]
    code = "\n".join(path.read_text() for path in sources)
    for variable in re.findall(r"^\| `([A-Z0-9_]+)`", rows, re.MULTILINE):
        assert variable in code, f"{variable} is documented, and nothing reads it"
