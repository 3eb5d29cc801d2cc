"""API fixtures: an in-process client for error paths, a real uvicorn process for the main path."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from benchmarks.serving import ServerNotReady, child_pids
from benchmarks.serving import server_process as start_server
from service.api import Settings, create_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_client(digits_model_dir):
    """Build a TestClient (lifespan run) for settings overrides of the digits model."""
    clients = []

    def make(**overrides) -> TestClient:
        settings = Settings(_env_file=None, model_dir=digits_model_dir, **overrides)
        client = TestClient(create_app(settings), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()


@contextlib.contextmanager
def serving(model_dir: Path | None = None, **settings: str):
    """``python -m service.api`` in its own process on a free localhost port; yields its URL.

    ``settings`` are more environment variables, e.g. ``MODEL_REPOSITORY``."""
    with server_process(model_dir, **settings) as server:
        yield server.url


@contextlib.contextmanager
def server_process(
    model_dir: Path | None = None, probe: dict[str, typing.Any] | None = None, **settings: str
):
    """As :func:`serving`, yielding the :class:`benchmarks.serving.ServerProcess`. With
    ``TLS_CERT_FILE`` the URL is https, and ``probe`` the httpx options (``verify``, ``cert``)
    that its readiness is polled with."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "MODEL_REPOSITORY")},
        "MAX_BATCH_SIZE": "50",
        "ACCESS_LOG": "false",
        **({} if model_dir is None else {"MODEL_DIR": str(model_dir)}),
        **settings,
    }
    try:
        with start_server(
            [sys.executable, "-m", "service.api"],
            env,
            ready_timeout=60,
            new_session=False,
            probe=probe,
        ) as server:
            yield server
    except ServerNotReady as error:
        pytest.fail(str(error))


def refused_start(model_dir: Path, **settings: str) -> subprocess.CompletedProcess:
    """``python -m service.api`` serving ``model_dir`` with ``settings`` (and no PATH), which
    must stop at start: its run, exit status and output (it is given 120 s)."""
    run = subprocess.run(
        [sys.executable, "-m", "service.api"],
        cwd=REPO,
        env={"MODEL_DIR": str(model_dir), "PATH": "", **settings},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0, run.stderr
    return run


def key_file(directory: Path, *lines: str) -> Path:
    """An API_KEYS_FILE in ``directory``: a comment, then ``lines``."""
    path = directory / "keys.txt"
    path.write_text("\n".join(["# keys of the test", *lines, ""]))
    return path


def worker_pids(supervisor: int) -> list[int]:
    """Processes started by ``supervisor`` through multiprocessing (uvicorn's workers)."""
    return child_pids(supervisor, b"spawn_main")


@pytest.fixture(scope="module")
def protocol_repository(tmp_path_factory, digits_model_dir, text_model_dir):
    """A repository for the protocol's tests: digits (images), topics (texts), and notes, a
    directory that fails to load."""
    root = tmp_path_factory.mktemp("protocol-repository")
    shutil.copytree(digits_model_dir, root / "digits")
    shutil.copytree(text_model_dir, root / "topics")
    (root / "notes").mkdir()
    return root


@pytest.fixture(scope="module")
def live_server(digits_model_dir):
    """The digits model served by a real server process."""
    with serving(digits_model_dir) as url:
        yield url


@pytest.fixture(scope="module")
def text_live_server(text_model_dir):
    """The synthetic three-topic text model served by a real server process."""
    with serving(text_model_dir) as url:
        yield url


def read_until_closed(sock: socket.socket, bound: float = 20.0) -> bytes:
    """Everything the server sends on ``sock`` until it closes the connection; fails the test
    if it holds the connection longer than ``bound`` seconds."""
    sock.settimeout(bound)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server still holds the connection after {bound} s")
    finally:
        sock.close()
    return received


@pytest.fixture(scope="module")
def bof_live_server(bof_model_dir):
    """The glyphs model (bags of visual words beside pixels) served by a real server process."""
    with serving(bof_model_dir) as url:
        yield url


def answered(http, path: str, body: dict, failures: list[str]):
    """``http.post(path, json=body)`` when it answers 200, else None with what went wrong
    appended to ``failures`` (a load test's client goes on)."""
    try:
        response = http.post(path, json=body)
    except Exception as error:  # httpx's, or a closed connection
        failures.append(f"{path}: {error!r}")
        return None
    if response.status_code != 200:
        failures.append(f"{path}: {response.status_code} {response.text[:200]}")
        return None
    return response
