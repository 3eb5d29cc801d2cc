"""The documentation as the tests read it: its code blocks with their markers, its links and
headings, and the comparison of an example's printed output with what the docs print.

A code block is marked by an HTML comment on the line before its opening fence (a blank line
between them is allowed); readers of the rendered page do not see it:

- ``<!-- example -->``: run the block (``sh`` and ``bash`` with ``bash -e -o pipefail``,
  ``python`` with this interpreter) in the document's scratch directory, where ``.venv`` is
  the repository's. Blocks of one document run in order, in one directory, so that a block
  can use what the one before made.
- ``<!-- example server -->``, ``<!-- example server=NAME VAR=value ... -->``: the same, against
  a server the test starts (``localhost:8000`` and gRPC's ``localhost:8081`` in the block are
  rewritten to its ports). Servers of one name and settings are shared; each serves its own
  copy of the digits model that ``make run`` trains, with its search model and catalogue, as
  ``make run`` does (``MODEL_REPOSITORY``, ``DEFAULT_MODEL=digits``), with ``ADMIN_TOKEN=s3cret``
  and a gRPC port unless the marker's settings say otherwise; ``MODEL_DIR=path`` serves the
  page's own model instead. Relative paths in the settings are the scratch directory's files.
- ``<!-- output -->``: what the example before it prints, compared with what it printed.
- ``<!-- not-run: why -->``: a block the test does not run, and why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# Blocks in these languages are commands or code: each must be marked, run or not.
RUNNABLE = frozenset({"sh", "bash", "shell", "console", "python", "py"})
# The pages whose runnable blocks must all be marked (how-it-works and measurements show the
# commands that made their figures, which take minutes to hours).
MARKED = (README, DOCS / "README.md", DOCS / "using", DOCS / "operating", DOCS / "reference")

_FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(example|output|not-run)\b:?(.*?)-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # of the opening fence, from 1
    language: str
    text: str
    kind: str | None  # "example", "output", "not-run", or None: unmarked
    options: str  # what the marker says after its kind

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE


@dataclasses.dataclass(frozen=True)
class Server:
    """The server an example runs against: its name and its settings (environment)."""

    name: str
    settings: tuple[tuple[str, str], ...]


def documents() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def must_be_marked(path: Path) -> bool:
    return any(path == place or place in path.parents for place in MARKED)


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of ``path``, in order, each with the marker before it."""
    lines = path.read_text().splitlines()
    found = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        start = index
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].strip() == fence.group(1)),
            len(lines),
        )
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = _MARKER.match(lines[previous].strip()) if previous >= 0 else None
        found.append(
            Block(
                path=path,
                line=start + 1,
                language=fence.group(2).lower(),
                text="\n".join(lines[start + 1 : end]) + "\n",
                kind=marker.group(1) if marker else None,
                options=marker.group(2).strip() if marker else "",
            )
        )
        index = end + 1
    return found


def examples(path: Path) -> list[tuple[Block, Block | None]]:
    """The examples of ``path`` in order, each with the output block that follows it, if any."""
    found = blocks(path)
    pairs = []
    for i, block in enumerate(found):
        if block.kind == "example":
            after = found[i + 1] if i + 1 < len(found) else None
            pairs.append((block, after if after is not None and after.kind == "output" else None))
    return pairs


def server_of(block: Block) -> Server | None:
    """The server an example's marker asks for (``server``, ``server=NAME``, then settings)."""
    words = shlex.split(block.options)
    if not words or not words[0].startswith("server"):
        return None
    name = words[0].partition("=")[2] or "main"
    settings = []
    for word in words[1:]:
        variable, equals, value = word.partition("=")
        if not equals or not variable.isupper():
            raise ValueError(f"{block.where}: {word!r} is not a VARIABLE=value setting")
        settings.append((variable, value))
    return Server(name, tuple(sorted(settings)))


# -- links and headings ------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _outside_code(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` outside fenced code blocks, with their numbers."""
    out = []
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None:
            if line.strip() == fence:
                fence = None
        else:
            out.append((number, line))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image in ``path``, outside code."""
    found = []
    for number, line in _outside_code(path):
        for match in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            found.append((number, match.group(1) or match.group(2)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.lower()
    kept = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN"
    )  # letters and digits of any script, spaces, hyphens, underscores
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _outside_code(path):
        heading = _HEADING.match(line)
        if heading:
            base = slug(re.sub(r"`", "", heading.group(2)))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


# -- printed output ----------------------------------------------------------------------------

# Floats printed in the docs come from a model trained on another machine, or are rounded:
# equal within 1e-4, relative or absolute. Models trained with other thread counts differ by up
# to 7.7e-6 relative in their coefficients (the solver stops within its tolerance of the
# optimum), and numbers rounded to four decimals by at most 5e-5.
TOLERANCE = 1e-4
# Fields that differ from run to run: a version is the sha256 of a manifest that records when
# it was written, a cursor carries the version; they are compared by their shape only.
PER_RUN = frozenset({"model_version", "search_version", "version", "next_cursor", "created"})
_SHA256 = re.compile(r"\b[0-9a-f]{64}\b")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def json_values(text: str) -> list | None:
    """The JSON values written one after another in ``text`` (curl prints answers without a
    newline), or None if it is not such a sequence."""
    decoder = json.JSONDecoder()
    values = []
    index = 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index == len(text):
            return values or None
        try:
            value, index = decoder.raw_decode(text, index)
        except ValueError:
            return None
        values.append(value)


def differences(printed: str, expected: str) -> list[str]:
    """How ``printed`` differs from what a document shows (``expected``): nothing when they
    are the same JSON values (or text) up to :data:`TOLERANCE` and per-run fields."""
    got, want = json_values(printed), json_values(expected)
    if got is not None and want is not None:
        found: list[str] = []
        _compare(got, want, "", found)
        return found
    return _compare_text(printed, expected)


def _same_number(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _compare(got, want, where: str, found: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            found.append(
                f"{where or 'the answer'}: keys {sorted(got)}, the docs show {sorted(want)}"
            )
        for key in want.keys() & got.keys():
            if key in PER_RUN:
                if type(got[key]) is not type(want[key]) or (
                    isinstance(want[key], str)
                    and bool(_SHA256.fullmatch(want[key])) != bool(_SHA256.fullmatch(got[key]))
                ):
                    found.append(f"{where}.{key}: {got[key]!r} is not shaped as {want[key]!r}")
                continue
            _compare(got[key], want[key], f"{where}.{key}", found)
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            found.append(f"{where or 'the answer'}: {len(got)} items, the docs show {len(want)}")
        for i, (a, b) in enumerate(zip(got, want, strict=False)):  # lengths checked above
            _compare(a, b, f"{where}[{i}]", found)
    elif _is_number(want) and _is_number(got):
        if not _same_number(got, want):
            found.append(f"{where}: {got!r}, the docs show {want!r}")
    elif got != want or type(got) is not type(want):
        found.append(f"{where or 'the answer'}: {got!r}, the docs show {want!r}")


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _compare_text(printed: str, expected: str) -> list[str]:
    def tokens(text: str) -> list[str]:
        text = _SHA256.sub("<sha256>", " ".join(text.split()))
        return [part for part in _NUMBER.split(text)], _NUMBER.findall(text)

    got_words, got_numbers = tokens(printed)
    want_words, want_numbers = tokens(expected)
    if got_words != want_words or len(got_numbers) != len(want_numbers):
        return [f"printed:\n{printed}\nthe docs show:\n{expected}"]
    return [
        f"{a}, the docs show {b} (in {printed.strip()!r})"
        for a, b in zip(got_numbers, want_numbers, strict=True)
        if not _same_number(float(a), float(b))
    ]


def errors_in(printed: str) -> list:
    """The error answers (``{"error": ...}``) among the JSON values an example printed."""
    values = json_values(printed) or []
    return [v for v in values if isinstance(v, dict) and "error" in v]
