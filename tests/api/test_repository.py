"""A model repository: several models in one process, routes by name, the default model, the
repository routes and their token, a broken search that leaves /classify serving, SIGHUP and
worker processes."""

from __future__ import annotations

import dataclasses
import shutil
import signal
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app
from service.model import Predictor
from service.model.artifact import manifest_digest
from service.model.search import catalogue_dir
from tests.api.conftest import server_process, worker_pids

TOKEN = "repository-token"


@pytest.fixture(scope="module")
def repository(tmp_path_factory, search_model_dir, text_model_dir):
    """digits (with search and catalogue), topics (text) and a directory that is no model."""
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(search_model_dir, root / "digits")
    shutil.copytree(text_model_dir, root / "topics")
    (root / "notes").mkdir()
    (root / ".digits.tmp-1234").mkdir()  # a trainer's staging directory: never a model
    return root


def _client(repository, **overrides) -> TestClient:
    settings = Settings(_env_file=None, model_repository=repository, **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


def _error(response, status):
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_one_process_serves_every_model_of_the_repository_by_name(repository, digits):
    with _client(repository, default_model="digits") as client:
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert sorted(listed) == ["digits", "notes", "topics"]
        assert listed["digits"]["state"] == listed["topics"]["state"] == "ready"
        assert listed["digits"]["version"] == manifest_digest(repository / "digits")
        assert listed["topics"]["input"]["accepts_texts"] is True
        assert listed["notes"]["state"] == "failed"
        assert "manifest.json is missing" in listed["notes"]["reason"]

        image = digits.X_test[:1].reshape(1, 8, 8).tolist()
        by_name = client.post("/v1/models/digits/classify", json={"instances": image})
        default = client.post("/classify", json={"instances": image})
        assert by_name.json() == default.json()
        assert by_name.headers["x-model-version"] == listed["digits"]["version"]
        text = client.post("/v1/models/topics/classify", json={"texts": ["court judge jury"]})
        assert text.json()["predictions"][0]["label"] == "law"
        assert text.json()["model_version"] == manifest_digest(repository / "topics")

        found = client.post("/v1/models/digits/search", json={"class": "7", "top_k": 3})
        assert found.json() == client.post("/search", json={"class": "7", "top_k": 3}).json()
        assert client.get("/v1/models/digits/atoms/1").status_code == 200
        assert _error(client.post("/v1/models/topics/search", json={"class": "law"}), 404)
        assert (
            "no model named 'other'"
            in _error(client.post("/v1/models/other/classify", json={"instances": image}), 404)[
                "message"
            ]
        )
        assert (
            "failed to load"
            in _error(client.post("/v1/models/notes/classify", json={"instances": image}), 503)[
                "message"
            ]
        )


def test_the_default_model_is_the_setting_or_the_only_one(repository, tmp_path, digits):
    image = digits.X_test[:1].reshape(1, 8, 8).tolist()
    with _client(repository, default_model="topics") as client:
        assert client.post("/classify", json={"texts": ["rocket moon"]}).json()["model"] == "topics"
    with _client(repository, default_model="nope") as client:
        assert "the default model 'nope'" in _error(client.get("/readyz"), 503)["message"]
        assert _error(client.post("/classify", json={"instances": image}), 404)
    with _client(repository) as client:  # several models, none named the default
        assert "ready" in client.get("/readyz").json()["detail"]
        assert (
            "set DEFAULT_MODEL"
            in _error(client.post("/classify", json={"instances": image}), 404)["message"]
        )
    only = tmp_path / "only"
    shutil.copytree(repository / "digits", only / "digits")
    with _client(only) as client:
        assert client.post("/classify", json={"instances": image}).json()["model"] == "digits"


def test_a_model_copied_in_place_loads_once_its_files_are_complete(tmp_path, digits_model_dir):
    repository = tmp_path / "repository"
    (repository / "digits").mkdir(parents=True)
    files = sorted(p.name for p in digits_model_dir.iterdir())
    late = "coef.npy"
    for name in files:
        if name != late:  # a copy still under way: the manifest is there, one array is not
            shutil.copy2(digits_model_dir / name, repository / "digits" / name)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(repository, admin_token=TOKEN) as client:
        (listed,) = client.post("/v2/repository/index", headers=auth).json()
        assert listed["state"] == "failed"
        assert late in listed["reason"]
        shutil.copy2(digits_model_dir / late, repository / "digits" / late)
        (listed,) = client.post("/v2/repository/index", headers=auth).json()
        assert listed["state"] == "ready"
        assert listed["version"] == manifest_digest(digits_model_dir)


def test_an_update_never_takes_search_away_unless_loaded_explicitly(tmp_path, search_model_dir):
    repository = tmp_path / "repository"
    shutil.copytree(search_model_dir, repository / "digits")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(repository, admin_token=TOKEN) as client:
        served = client.post("/search", json={"class": "7", "top_k": 3})
        assert served.json()["search_version"] == manifest_digest(
            catalogue_dir(repository / "digits")
        )
        # The model retrained (its search model retired with it) but not yet re-indexed.
        Predictor.load(search_model_dir).save(repository / "digits", overwrite=True)
        (listed,) = client.post("/v2/repository/index", headers=auth).json()
        assert listed["state"] == "ready"
        assert listed["version"] == served.json()["model_version"]
        assert "has no search model" in listed["reason"]
        assert client.post("/search", json={"class": "7", "top_k": 3}).json() == served.json()
        # An explicit load takes it all the same.
        assert client.post("/v2/repository/models/digits/load", headers=auth).status_code == 200
        assert _error(client.post("/search", json={"class": "7"}), 404)


@pytest.mark.parametrize("route", ["index", "models/digits/load", "models/digits/unload"])
def test_repository_routes_need_the_admin_token(repository, route):
    with _client(repository) as client:
        disabled = _error(client.post(f"/v2/repository/{route}"), 403)
        assert "set ADMIN_TOKEN" in disabled["message"]
    with _client(repository, admin_token=TOKEN) as client:
        missing = client.post(f"/v2/repository/{route}")
        assert _error(missing, 401)["type"] == "unauthorized"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = {"Authorization": f"Bearer {TOKEN}x"}
        assert _error(client.post(f"/v2/repository/{route}", headers=wrong), 401)
        basic = {"Authorization": f"Basic {TOKEN}"}
        assert _error(client.post(f"/v2/repository/{route}", headers=basic), 401)
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post(f"/v2/repository/{route}", headers=right).status_code == 200


def test_unload_index_and_load(repository, digits):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    image = digits.X_test[:1].reshape(1, 8, 8).tolist()
    with _client(repository, admin_token=TOKEN, default_model="digits") as client:
        assert client.post("/v2/repository/models/topics/unload", headers=auth).status_code == 200
        assert (
            "unloaded on request"
            in _error(client.post("/v1/models/topics/classify", json={"texts": ["x"]}), 503)[
                "message"
            ]
        )
        # A rescan leaves a model unloaded on request alone.
        index = client.post("/v2/repository/index", headers=auth).json()
        states = {m["name"]: (m["state"], m["version"]) for m in index}
        assert states["topics"] == ("unloaded", None)
        assert states["digits"] == ("ready", manifest_digest(repository / "digits"))
        ready = client.post("/v2/repository/index", headers=auth, json={"ready": True}).json()
        assert [m["name"] for m in ready] == ["digits"]
        assert client.post("/v2/repository/models/topics/load", headers=auth).status_code == 200
        assert client.post("/v1/models/topics/classify", json={"texts": ["x"]}).status_code == 200
        assert _error(client.post("/v2/repository/models/ghost/load", headers=auth), 404)
        assert client.post("/classify", json={"instances": image}).status_code == 200


def test_a_broken_catalogue_leaves_classify_serving(tmp_path, search_model_dir, digits):
    broken = tmp_path / "digits"
    shutil.copytree(search_model_dir, broken)
    (ids,) = (catalogue_dir(broken) / "shards").glob("*/ids.npy")
    ids.write_bytes(b"\x93NUMPY broken")
    image = digits.X_test[:1].reshape(1, 8, 8).tolist()
    with TestClient(create_app(Settings(_env_file=None, model_dir=broken))) as client:
        assert client.get("/readyz").status_code == 200
        assert client.post("/classify", json={"instances": image}).status_code == 200
        problem = _error(client.post("/search", json={"class": "7"}), 503)["message"]
        assert "search not available" in problem
        assert "ids.npy" in problem
        info = client.get("/v1/models/digits").json()
        assert info["search"] is None
        assert "ids.npy" in info["search_problem"]


def _new_version(predictor, path, revision: int) -> str:
    metadata = {**predictor.metadata, "revision": revision}
    dataclasses.replace(predictor, metadata=metadata).save(path, overwrite=True)
    return manifest_digest(path)


def _answers_with(server, image, version: str, timeout: float = 60.0) -> None:
    """Wait until 20 requests in a row, each on a new connection, answer with ``version``."""
    url = server.url
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while in_a_row < 20:
        answer = httpx.post(f"{url}/classify", json={"instances": image})
        assert answer.status_code == 200, answer.text
        in_a_row = in_a_row + 1 if answer.headers["x-model-version"] == version else 0
        if time.monotonic() > deadline:
            pytest.fail(f"no answer with version {version[:12]}; the log:\n{server.log()}")


@pytest.mark.slow
def test_sighup_reloads_a_replaced_model(tmp_path, digits_fit, digits):
    path = tmp_path / "digits"
    first = _new_version(digits_fit.predictor, path, 0)
    image = digits.X_test[:1].reshape(1, 8, 8).tolist()
    with server_process(path) as server:
        answer = httpx.post(f"{server.url}/classify", json={"instances": image})
        assert answer.json()["model_version"] == first
        second = _new_version(digits_fit.predictor, path, 1)
        server.process.send_signal(signal.SIGHUP)
        _answers_with(server, image, second)


@pytest.mark.slow
def test_worker_processes_serve_the_repository_and_reload_on_sighup(
    tmp_path, digits_model_dir, text_model_dir, digits, digits_fit, digits_predictor
):
    images = digits.X_test[:3]
    served = tmp_path / "served"
    shutil.copytree(digits_model_dir, served / "digits")
    shutil.copytree(text_model_dir, served / "topics")
    expected = digits_predictor.decision_function(images)
    settings = {"MODEL_REPOSITORY": str(served), "DEFAULT_MODEL": "digits", "WORKERS": "2"}
    with server_process(**settings) as server:
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2
        # Ready means one worker answered; the update below is meant for two started workers.
        _wait_for_log(server, "Application startup complete.", 2)
        for _ in range(10):
            body = httpx.post(
                f"{server.url}/classify",
                json={"instances": images.reshape(3, 8, 8).tolist(), "top_k": 10},
            ).json()
            for prediction, row in zip(body["predictions"], expected, strict=True):
                scores = {e["label"]: e["score"] for e in prediction["top_k"]}
                served_scores = np.array([scores[c] for c in digits_predictor.classes])
                np.testing.assert_allclose(served_scores, row, rtol=1e-12, atol=1e-12)
            assert body["model_version"] == manifest_digest(served / "digits")

        # SIGHUP to the supervisor reaches every worker: each one loads the new version itself
        # (uvicorn alone would restart them), and none of them is restarted.
        newer = _new_version(digits_fit.predictor, served / "digits", 1)
        server.process.send_signal(signal.SIGHUP)
        _answers_with(server, images[:1].reshape(1, 8, 8).tolist(), newer)
        _wait_for_log(server, f"with version {newer[:12]}", 2)
        assert sorted(worker_pids(server.process.pid)) == sorted(workers)


def _wait_for_log(server, text: str, times: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.log().count(text) < times:
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} not {times} times in the log:\n{server.log()}")
        time.sleep(0.1)
