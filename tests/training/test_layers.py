"""training/'s rooms stand on floors, each importing only its own and those below (issue 33):
a default fit runs straight down and back up, and the estimator never imports the selection
that wraps it. Read from the code's imports, as a reviewer would."""

import ast
from pathlib import Path

import pytest

TRAINING = Path(__file__).resolve().parents[2] / "training"
# Each room of training/ and its floor: a room imports rooms of lower floors (and its own)
# only. The selection and the /search model's build share a floor and never import each other.
FLOORS = {
    "data": 1,
    "cluster": 2,
    "estimator": 3,
    "selection": 4,
    "retrieval": 4,
    "fitting": 5,
    "evaluation": 6,
    "cli": 7,
}


def _room(module: str) -> str | None:
    """The room of a dotted module name under training (None: the package's face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "training" else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module of training that ``path`` imports, at any depth of its code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("training"):
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("training")]
    return found


def _modules() -> list[Path]:
    return sorted(
        path
        for path in TRAINING.rglob("*.py")
        if path.parent != TRAINING or path.stem not in ("__init__", "__main__")
    )


def test_every_room_has_a_floor():
    rooms = {path.stem if path.parent == TRAINING else path.parent.name for path in _modules()}
    assert rooms == set(FLOORS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(TRAINING)))
def test_a_room_imports_only_its_own_floor_and_those_below(path):
    own = path.stem if path.parent == TRAINING else path.parent.name
    for line, module in _imports(path):
        room = _room(module)
        assert room is not None, f"{path.name}:{line} imports the package's face ({module})"
        if room == own:
            continue
        assert FLOORS[room] < FLOORS[own], (
            f"{path.relative_to(TRAINING)}:{line} imports {module}: {room} (floor "
            f"{FLOORS[room]}) is not below {own} (floor {FLOORS[own]})"
        )


def test_the_estimator_imports_nothing_of_its_selection():
    for path in (TRAINING / "estimator").glob("*.py"):
        imported = {_room(module) for _, module in _imports(path)}
        assert "selection" not in imported, path.name
        assert "fitting" not in imported, path.name
