"""Odd files in a model repository (issue 22): a manifest that is a FIFO, a symbolic link to a
device or a sparse file of a gigabyte; a directory whose name is not UTF-8; symbolic links
leading out of the repository. Each is refused with its reason, in bounded time and memory,
while the other models serve, and the server still rescans and shuts down.

Real server processes on real directories; the only thing timed is a bound on a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from service.api.registry import ModelRegistry, ModelState
from service.api.repository import Repository
from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

TOKEN = "files-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Only to turn a hang into a failure.
WAIT_S = 30.0


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
        * 1024
    )


def _models(url: str) -> dict[str, dict]:
    response = httpx.get(f"{url}/v1/models", timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return {model["name"]: model for model in response.json()["models"]}


def _rescan(url: str) -> dict[str, dict]:
    response = httpx.post(f"{url}/v2/repository/index", headers=AUTH, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return {model["name"]: model for model in response.json()}


def _with_manifest(source: Path, target: Path, make_manifest) -> None:
    """A copy of the model at ``source`` whose manifest ``make_manifest(path)`` makes."""
    shutil.copytree(source, target)
    (target / "manifest.json").unlink()
    make_manifest(target / "manifest.json")


def _sparse_gigabyte(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(2**30)


@pytest.fixture
def repository(tmp_path, digits_model_dir) -> Path:
    root = tmp_path / "models"
    shutil.copytree(digits_model_dir, root / "digits")
    return root


def test_a_fifo_for_a_manifest_does_not_stop_the_server_from_starting(repository, digits_model_dir):
    """Defect 6: a FIFO as manifest.json before start: the server never listened."""
    _with_manifest(digits_model_dir, repository / "fifo", os.mkfifo)
    with server_process(MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits") as server:
        models = _models(server.url)
        assert models["digits"]["state"] == "ready"
        assert models["fifo"]["state"] == "failed"
        assert "a FIFO, not a regular file" in models["fifo"]["reason"]


def test_manifests_that_never_end_are_refused_and_the_server_still_stops(
    repository, digits_model_dir
):
    """Defect 6: a manifest linked to /dev/zero hung the rescan (95% CPU, every later rescan
    blocked, SIGTERM never ended the process); a sparse manifest of 1 GiB added 2.3 GiB."""
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", ADMIN_TOKEN=TOKEN
    ) as server:
        before = _rss(server.process.pid)
        _with_manifest(digits_model_dir, repository / "zero", lambda p: p.symlink_to("/dev/zero"))
        _with_manifest(digits_model_dir, repository / "sparse", _sparse_gigabyte)
        _with_manifest(digits_model_dir, repository / "fifo", os.mkfifo)
        for _ in range(2):  # a rescan after it is not blocked either
            models = _rescan(server.url)
        assert models["digits"]["state"] == "ready"
        assert "outside the repository" in models["zero"]["reason"]
        assert "more than the" in models["sparse"]["reason"]
        assert "a FIFO" in models["fifo"]["reason"]
        assert _rss(server.process.pid) - before < 100 * 2**20
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=WAIT_S) == 0


def test_a_directory_whose_name_is_not_utf8_is_skipped_once_with_a_reason(
    repository, digits_model_dir
):
    """Defect 7: such a directory made GET /v1/models and the rescans answer 500 for everyone."""
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", ADMIN_TOKEN=TOKEN
    ) as server:
        shutil.copytree(digits_model_dir, os.fsdecode(bytes(repository) + b"/bad\xffname"))
        for _ in range(3):
            assert set(_rescan(server.url)) == {"digits"}
            assert set(_models(server.url)) == {"digits"}
        log = server.log()
    skipped = [json.loads(line)["message"] for line in log.splitlines() if "not UTF-8" in line]
    assert len(skipped) == 1, skipped
    assert r"'bad\udcffname'" in skipped[0]


def test_symbolic_links_out_of_the_repository_are_refused_unless_allowed(
    repository, digits_model_dir, tmp_path
):
    """Defect 12: a symbolic link in the repository to a model outside it was loaded and
    served. Refused by default (with the reason), served with ALLOW_EXTERNAL_SYMLINKS; links
    that stay inside the repository are served either way."""
    outside = tmp_path / "outside"
    shutil.copytree(digits_model_dir, outside)
    (repository / "elsewhere").symlink_to(outside)
    (repository / "alias").symlink_to(repository / "digits")
    file_link = repository / "file-link"
    shutil.copytree(digits_model_dir, file_link)
    (file_link / "coef.npy").unlink()
    (file_link / "coef.npy").symlink_to(outside / "coef.npy")
    settings = {"MODEL_REPOSITORY": str(repository), "DEFAULT_MODEL": "digits"}
    with server_process(**settings) as server:
        models = _models(server.url)
        assert models["alias"]["state"] == "ready"
        for name in ("elsewhere", "file-link"):
            assert models[name]["state"] == "failed"
            assert "outside the repository" in models[name]["reason"]
            assert "ALLOW_EXTERNAL_SYMLINKS" in models[name]["reason"]
    with server_process(**settings, ALLOW_EXTERNAL_SYMLINKS="true") as server:
        models = _models(server.url)
        assert {models[name]["state"] for name in models} == {"ready"}


def test_loading_is_bounded_in_time(repository):
    """A version whose loading takes longer than LOAD_TIMEOUT_S is refused with the reason,
    and the rescans after it go on."""

    async def scenario():
        registry = ModelRegistry(Repository(repository), load_timeout_s=0.001)
        entry = await registry.load("digits", path=repository / "digits", force=False)
        assert entry.state == ModelState.FAILED
        assert "took longer than 0.001 s (LOAD_TIMEOUT_S)" in entry.reason
        registry.load_timeout_s = WAIT_S
        assert (await registry.load("digits")).state == ModelState.READY

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))
