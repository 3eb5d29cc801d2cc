"""The trainer against a full disk and hostile input files (issue 22, defects 9 and 10): one line
and exit status 2, never a traceback, a SIGBUS or a gigabyte of memory; what a crashed writer
leaves is removed by the next.

A full disk is a real one: a tmpfs of a few MiB, mounted in a private mount namespace
(``unshare``), where the trainer runs as a child process; skipped where the system allows no
such namespace.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from service.model.search import read_catalogue
from service.model.search.layout import catalogue_dir, search_dir
from tests.api.conftest import REPO
from tests.namespaces import needs_namespaces
from training.cli.main import main

pytestmark = pytest.mark.slow


def _on_small_disk(tmp_path: Path, size: str, commands: str) -> subprocess.CompletedProcess:
    """Run ``commands`` (sh) with a tmpfs of ``size`` mounted at $DISK, in a private mount
    namespace; $PYTHON is this interpreter."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = f'mount -t tmpfs -o size={size} tmpfs "$DISK" && {commands}'
    return subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        cwd=REPO,
        env={**os.environ, "DISK": str(disk), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


@needs_namespaces
def test_index_on_a_full_disk_exits_2_with_one_line_and_leaves_nothing(search_model_dir, tmp_path):
    """Defect 9: ``index --force`` onto a full disk died of SIGBUS (exit 135, no message) and
    left search/.catalogue.tmp-* behind."""
    items = tmp_path / "items.npy"
    np.save(items, np.random.default_rng(0).uniform(0, 16, (40_000, 64)))
    check = (
        "import sys; from service.model import Predictor; "
        "from service.model.search import SearchIndex; m = sys.argv[1]; "
        "print('served', SearchIndex.load(m, Predictor.load(m)).catalogue.n_items)"
    )
    result = _on_small_disk(
        tmp_path,
        "4m",
        f'cp -r {search_model_dir} "$DISK/model" && '
        f'"$PYTHON" -m training index --model "$DISK/model" --items {items} --force --quiet; '
        'echo "exit $?"; ls -a "$DISK/model/search"; '
        f'"$PYTHON" -c "{check}" "$DISK/model"',
    )
    lines = result.stdout.splitlines()
    assert "exit 2" in lines, (result.stdout, result.stderr)
    error = result.stderr.strip().splitlines()
    assert len(error) == 1, result.stderr
    assert error[0].startswith("error: cannot write")
    assert "No space left on device" in error[0]
    assert not [name for name in lines if name.startswith(".catalogue.tmp-")]
    assert "served 797" in lines  # the catalogue in place is untouched


@needs_namespaces
def test_fit_on_a_full_disk_exits_2_with_one_line(tmp_path):
    """Defect 9: ``fit`` onto a full disk exited 1 with a traceback."""
    result = _on_small_disk(
        tmp_path,
        "200k",
        '"$PYTHON" -m training fit --similarity linear --basis-per-class 25 '
        '--out "$DISK/model" --quiet; echo "exit $?"; ls -a "$DISK"',
    )
    assert "exit 2" in result.stdout.splitlines(), (result.stdout, result.stderr)
    error = result.stderr.strip().splitlines()
    assert len(error) == 1, result.stderr
    assert error[0].startswith("error: cannot write")
    assert "No space left on device" in error[0] or "is the disk full?" in error[0]
    assert [name for name in result.stdout.splitlines() if name.startswith(".")] == [".", ".."]


def test_what_a_dead_writer_left_is_removed_by_the_next(search_model_dir, tmp_path):
    """Defect 9: later successful runs kept the staging directories of a crashed one; a
    writer at work (its staging directory locked) keeps its own."""
    model = tmp_path / "model"
    shutil.copytree(search_model_dir, model)
    dead = search_dir(model) / ".catalogue.tmp-dead0000"
    dead.mkdir()
    (dead / "projected.npy").write_bytes(b"half")
    alive = search_dir(model) / ".catalogue.tmp-alive000"
    alive.mkdir()
    lock = os.open(alive, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert main(["index", "--model", str(model), "--force", "--quiet"]) == 0
    finally:
        os.close(lock)
    assert not dead.exists()
    assert alive.exists()
    assert read_catalogue(catalogue_dir(model), search_dir(model)).n_items == 797


def _npz_with(path: Path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_an_npz_whose_header_claims_a_huge_array_exits_2(tmp_path, capsys):
    """Defect 10: a 348-byte .npz whose header claims a huge array: a MemoryError traceback."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**12, 64)}
    )
    claims = header.getvalue()  # the magic string and the header, and no data
    data = tmp_path / "claims.npz"
    _npz_with(data, {"X.npy": claims, "y.npy": _npy(np.zeros(3))})
    assert data.stat().st_size < 1000
    assert main(["fit", "--data", str(data), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "X.npy: its header claims shape (1000000000000, 64)" in error[0]


def test_a_deflate_bomb_npz_is_refused_before_it_is_inflated(tmp_path, capsys):
    """Defect 10: a 3 MB deflate bomb took 3.2 GB, then gave a misleading error."""
    data = tmp_path / "bomb.npz"
    np.savez_compressed(data, X=np.zeros((2**20, 10)), y=np.zeros(3))
    assert data.stat().st_size < 1_000_000
    assert main(["fit", "--data", str(data), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "X.npy inflates from" in error[0]
    assert "decompression bomb" in error[0]


def test_an_npz_of_python_objects_is_refused_as_such(tmp_path, capsys):
    data = tmp_path / "objects.npz"
    np.savez(data, X=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2))
    assert main(["fit", "--data", str(data), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "holds Python objects, which need pickle" in capsys.readouterr().err
