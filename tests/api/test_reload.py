"""Updates without downtime, through a real server process serving a model repository.

Concurrent clients classify while one model is replaced ten times (by the trainer's atomic
writer, picked up by polling) and another is added and removed. No request may fail, and every
answer must equal, row for row, the in-process answer of one version: never a mix. The same for
searches while whole versions (model, search model and catalogue) are swapped in.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time

import httpx
import numpy as np
import pytest

from service.model import Predictor
from service.model.artifact import manifest_digest
from service.model.artifact_writing import exchange_paths
from service.model.search import SearchIndex, SearchQuery, catalogue_dir
from tests.api.conftest import serving
from training.cli.main import main
from training.fitting import fit_dataset

pytestmark = pytest.mark.slow

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def other_digits_version(digits):
    """A second version of the digits model: other scores for the same inputs."""
    config = dict(similarity="linear", basis_per_class=10)
    return fit_dataset(digits, "digits", diagnostics=False, **config).predictor


def _write(predictor, path, revision: int) -> str:
    """Write a version (distinct even when the arrays repeat) and return its version id."""
    metadata = {**predictor.metadata, "revision": revision}
    dataclasses.replace(predictor, metadata=metadata).save(path, overwrite=True)
    return manifest_digest(path)


def _models(url: str) -> dict[str, dict]:
    return {m["name"]: m for m in httpx.get(f"{url}/v1/models").json()["models"]}


def _wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _scores(answer: dict, classes) -> np.ndarray:
    rows = []
    for prediction in answer["predictions"]:
        by_label = {entry["label"]: entry["score"] for entry in prediction["top_k"]}
        rows.append([by_label[c] for c in classes])
    return np.array(rows)


def test_replacing_models_under_load_fails_no_request_and_never_mixes_versions(
    tmp_path, digits, digits_fit, other_digits_version, text_model_dir
):
    repository = tmp_path / "repository"
    versions = [digits_fit.predictor, other_digits_version]
    X = digits.X_test[:6]
    instances = X.reshape(len(X), 8, 8).tolist()
    expected = [v.decision_function(X) for v in versions]
    assert not np.allclose(expected[0], expected[1], atol=1e-3)
    classes = versions[0].classes
    written = {_write(versions[0], repository / "digits", 0): 0}

    failures: list[str] = []
    answers: list[tuple[str, str, dict]] = []
    stop = threading.Event()

    def client(path: str) -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                try:
                    response = http.post(f"{url}{path}", json={"instances": instances, "top_k": 10})
                except httpx.HTTPError as error:
                    failures.append(f"{path}: {error!r}")
                    continue
                if response.status_code != 200:
                    failures.append(f"{path}: {response.status_code} {response.text[:200]}")
                    continue
                answers.append((path, response.headers["x-model-version"], response.json()))

    with serving(
        MODEL_REPOSITORY=str(repository),
        DEFAULT_MODEL="digits",
        RELOAD_INTERVAL_S="0.1",
        ADMIN_TOKEN=TOKEN,
    ) as url:
        threads = [
            threading.Thread(target=client, args=(path,))
            for path in ("/classify", "/v1/models/digits/classify") * 2
        ]
        for thread in threads:
            thread.start()
        try:
            for revision in range(1, 11):
                time.sleep(0.3)
                version = _write(versions[revision % 2], repository / "digits", revision)
                written[version] = revision % 2
                _wait_for(
                    lambda v=version: _models(url)["digits"]["version"] == v,
                    f"revision {revision} to be served",
                )
                if revision == 3:  # a model is added...
                    # Copied beside the repository's models, then renamed in: a scan never
                    # sees half a model.
                    shutil.copytree(text_model_dir, repository / ".topics.staging")
                    (repository / ".topics.staging").rename(repository / "topics")
                    _wait_for(
                        lambda: _models(url).get("topics", {}).get("state") == "ready",
                        "the text model to load",
                    )
                    topics = httpx.post(
                        f"{url}/v1/models/topics/classify", json={"texts": ["rocket orbit"]}
                    )
                    assert topics.json()["predictions"][0]["label"] == "space"
                if revision == 7:  # ...and removed
                    retired = tmp_path / "retired-topics"
                    (repository / "topics").rename(retired)
                    _wait_for(lambda: "topics" not in _models(url), "the text model to go")
                    gone = httpx.post(
                        f"{url}/v1/models/topics/classify", json={"texts": ["rocket orbit"]}
                    )
                    assert gone.status_code == 404
        finally:
            stop.set()
            for thread in threads:
                thread.join()

    assert failures == []
    served_versions = {version for _, version, _ in answers}
    assert len(served_versions) >= 8, "the clients saw too few of the versions"
    for path, version, answer in answers:
        assert answer["model_version"] == version
        assert version in written, f"{path} answered with an unknown version {version}"
        scores = _scores(answer, classes)
        # The whole batch comes from the one version the answer names: never a mix.
        np.testing.assert_allclose(scores, expected[written[version]], rtol=1e-9, atol=1e-9)


def test_a_broken_version_is_refused_while_the_old_one_keeps_serving(tmp_path, digits_fit, digits):
    repository = tmp_path / "repository"
    predictor = digits_fit.predictor
    good = _write(predictor, repository / "digits", 0)
    one = {"instances": digits.X_test[:1].reshape(1, 8, 8).tolist()}
    with serving(MODEL_REPOSITORY=str(repository), ADMIN_TOKEN=TOKEN) as url:
        # A tampered copy is put in place by rename, as a (faulty) deployment would.
        staging = repository / ".digits.staging"
        shutil.copytree(repository / "digits", staging)
        (staging / "coef.npy").write_bytes(b"\x93NUMPY tampered")
        if not exchange_paths(staging, repository / "digits"):
            pytest.skip("this kernel cannot exchange two directories atomically")
        refused = httpx.post(f"{url}/v2/repository/models/digits/load", headers=AUTH)
        assert refused.status_code == 409
        assert "checksum" in refused.json()["error"]["message"]
        listed = _models(url)["digits"]
        assert listed["state"] == "ready"
        assert listed["version"] == good
        assert "refused" in listed["reason"]
        assert "coef.npy" in listed["reason"]
        answer = httpx.post(f"{url}/classify", json=one)
        assert answer.status_code == 200
        assert answer.headers["x-model-version"] == good

        # A good version afterwards is taken.
        shutil.rmtree(staging)
        newer = _write(predictor, repository / "digits", 1)
        loaded = httpx.post(f"{url}/v2/repository/models/digits/load", headers=AUTH)
        assert loaded.status_code == 200, loaded.text
        assert loaded.headers["x-model-version"] == newer != good
        assert _models(url)["digits"]["reason"] is None
        assert httpx.post(f"{url}/classify", json=one).headers["x-model-version"] == newer


@pytest.fixture(scope="module")
def search_versions(tmp_path_factory, search_model_dir, other_digits_version):
    """Two complete versions of a model with its search model and catalogue, ready to swap in."""
    root = tmp_path_factory.mktemp("versions")
    shutil.copytree(search_model_dir, root / "a")
    other_digits_version.save(root / "b")
    assert main(["dictionary", "--model", str(root / "b"), "--quiet"]) == 0
    assert main(["index", "--model", str(root / "b"), "--quiet"]) == 0
    return [root / "a", root / "b"]


def test_search_answers_come_from_one_version_while_versions_swap(tmp_path, search_versions):
    query = SearchQuery(class_label="7", top_k=5)
    expected = {}
    for path in search_versions:
        index = SearchIndex.load(path, Predictor.load(path))
        versions = (manifest_digest(path), manifest_digest(catalogue_dir(path)))
        expected[versions] = index.run(query).items
    assert len(expected) == 2
    repository = tmp_path / "repository"
    shutil.copytree(search_versions[0], repository / "digits")

    answers, failures = [], []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                response = http.post(f"{url}/search", json={"class": "7", "top_k": 5})
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                answers.append(response.json())

    with serving(MODEL_REPOSITORY=str(repository), RELOAD_INTERVAL_S="0.1") as url:
        threads = [threading.Thread(target=client) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for swap in range(1, 7):
                time.sleep(0.3)
                source = search_versions[swap % 2]
                staging = repository / ".digits.staging"
                shutil.copytree(source, staging)
                if not exchange_paths(staging, repository / "digits"):
                    pytest.skip("this kernel cannot exchange two directories atomically")
                shutil.rmtree(staging)
                version = manifest_digest(source)
                _wait_for(
                    lambda v=version: _models(url)["digits"]["version"] == v,
                    f"swap {swap} to be served",
                )
        finally:
            stop.set()
            for thread in threads:
                thread.join()

    assert failures == []
    seen = set()
    for answer in answers:
        versions = (answer["model_version"], answer["search_version"])
        assert versions in expected, f"an answer from an unknown pair of versions: {versions}"
        seen.add(versions)
        items = [(hit["id"], hit["score"]) for hit in answer["results"]]
        assert [i for i, _ in items] == [i for i, _ in expected[versions]]
        np.testing.assert_allclose(
            [s for _, s in items], [s for _, s in expected[versions]], rtol=1e-6
        )
    assert seen == set(expected)
