"""Traffic policies (aliases, canaries, shadows, promotion and rollback) through a real server
process under load, REST and gRPC, by the admin routes and by the traffic file; then the
file's and the routes' refusals in process."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import binom

from benchmarks.serving import free_port
from service.api import Settings, create_app
from service.model.artifact import manifest_digest
from tests.api.conftest import answered, server_process
from training.estimator import fit_dataset

pytestmark = pytest.mark.slow

TOKEN = "traffic-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CANARY_PERCENT = 10
CANARY_REQUESTS = 1200


@pytest.fixture(scope="module")
def versions(digits, digits_fit):
    """Three versions of the digits model: the default fit, a linear one (other scores), and
    a small linear one that predicts other labels for some images (the shadow)."""
    second = fit_dataset(
        digits, "digits", diagnostics=False, similarity="linear", basis_per_class=10
    )
    third = fit_dataset(digits, "digits", diagnostics=False, similarity="linear", basis_per_class=1)
    return [digits_fit.predictor, second.predictor, third.predictor]


@pytest.fixture(scope="module")
def repository(tmp_path_factory, versions):
    root = tmp_path_factory.mktemp("traffic-repository")
    for number, predictor in enumerate(versions, start=1):
        predictor.save(root / f"digits-{number}")
    _write_traffic(root, {"digits": {"model": "digits-1"}})
    return root


def _write_traffic(root, aliases) -> None:
    staging = root / ".traffic.json.writing"
    staging.write_text(json.dumps({"aliases": aliases}))
    os.replace(staging, root / "traffic.json")


@pytest.fixture(scope="module")
def batch(digits, versions):
    """Eight test images, three of which the shadow (version 3) labels otherwise than version 2
    does: every compared request adds exactly 3 disagreements and 5 agreements."""
    X = digits.X_test
    second, third = versions[1].predict(X), versions[2].predict(X)
    differ, agree = np.flatnonzero(second != third), np.flatnonzero(second == third)
    assert len(differ) >= 3
    chosen = np.concatenate([differ[:3], agree[:5]])
    return X[chosen]


def _scores(answer: dict, column: dict[str, int]) -> np.ndarray:
    """The answer's scores in the model's order of classes (its top_k holds them all)."""
    scores = np.full((len(answer["predictions"]), len(column)), np.nan)
    for row, prediction in enumerate(answer["predictions"]):
        for entry in prediction["top_k"]:
            scores[row, column[entry["label"]]] = entry["score"]
    return scores


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_alias_moves_canaries_shadows_and_rolls_back_under_load_without_a_failed_request(
    repository, versions, batch
):
    """The issue's acceptance: an alias moved from version 1 to 2 (by its file) under load,
    a 10% canary measured within binomial bounds, promoted, a shadow whose answers differ
    compared (its metric equal to the real differences), and a rollback; no request fails and
    every answer is the one of the version it names."""
    digests = [manifest_digest(repository / f"digits-{n}") for n in (1, 2, 3)]
    expected = {d: v.decision_function(batch) for d, v in zip(digests, versions, strict=True)}
    labels = {d: v.predict(batch).tolist() for d, v in zip(digests, versions, strict=True)}
    column = {label: index for index, label in enumerate(versions[0].classes)}
    instances = batch.reshape(len(batch), 8, 8).tolist()
    tensor = batch.reshape(len(batch), 8, 8, 1)

    failures: list[str] = []
    answers: Counter[str] = Counter()
    stop = threading.Event()

    def check(version: str, scores: np.ndarray | None, predicted: list[str], where: str) -> None:
        if version not in (digests[0], digests[1]):
            failures.append(f"{where}: answered by {version[:12]}")
        elif scores is not None and not np.allclose(scores, expected[version], atol=1e-9):
            failures.append(f"{where}: scores of no one version ({version[:12]})")
        elif predicted != labels[version]:
            failures.append(f"{where}: labels of no one version ({version[:12]})")
        answers[version] += 1

    def rest_client(path: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                response = answered(http, path, {"instances": instances, "top_k": 10}, failures)
                if response is None:
                    continue
                body = response.json()
                version = response.headers["x-model-version"]
                if body["model_version"] != version:
                    failures.append(f"{path}: body and header name other versions")
                predicted = [p["label"] for p in body["predictions"]]
                check(version, _scores(body, column), predicted, path)

    def grpc_client() -> None:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            while not stop.is_set():
                tensor_input = grpcclient.InferInput("input", list(tensor.shape), "FP64")
                tensor_input.set_data_from_numpy(tensor)
                try:
                    result = client.infer("digits", [tensor_input])
                except Exception as error:
                    failures.append(f"gRPC: {error!r}")
                    continue
                response = result.get_response()
                predicted = [x.decode() for x in result.as_numpy("label").tolist()]
                scores = result.as_numpy("scores")
                check(response.model_version, scores, predicted, "gRPC ModelInfer")

    grpc_port = free_port()
    with server_process(
        MODEL_REPOSITORY=str(repository),
        DEFAULT_MODEL="digits",
        ADMIN_TOKEN=TOKEN,
        RELOAD_INTERVAL_S="0.2",
        GRPC_PORT=str(grpc_port),
    ) as server:
        url = server.url
        admin = httpx.Client(base_url=url, headers=ADMIN, timeout=30)

        def served_by() -> str:
            return httpx.post(f"{url}/classify", json={"instances": instances}).headers[
                "x-model-version"
            ]

        assert served_by() == digests[0]
        threads = [
            threading.Thread(target=rest_client, args=(path,))
            for path in ("/classify", "/v1/models/digits/classify")
        ] + [threading.Thread(target=grpc_client)]
        for thread in threads:
            thread.start()
        try:
            # 1. The alias moves from version 1 to 2 by its file, picked up by a rescan.
            time.sleep(0.5)
            _write_traffic(repository, {"digits": {"model": "digits-2"}})
            _wait_for(lambda: served_by() == digests[1], "the file's move to version 2")
            listed = admin.get("/v2/repository/aliases").json()["aliases"]
            assert listed[0]["model"] == "digits-2"
            assert listed[0]["version"] == digests[1]
            assert listed[0]["previous"] is None  # a move by file says what the file says

            # 2. Back to version 1 with a 10% canary of version 2, by the admin route.
            policy = {"model": "digits-1", "canary": {"model": "digits-2", "percent": 10}}
            response = admin.put("/v2/repository/aliases/digits", json=policy)
            assert response.status_code == 200, response.text
            assert response.json()["canary"]["version"] == digests[1]
            with ThreadPoolExecutor(4) as pool, httpx.Client(timeout=30) as http:
                versions_seen = list(
                    pool.map(
                        lambda _: http.post(
                            f"{url}/v1/models/digits/classify", json={"instances": instances}
                        ).headers["x-model-version"],
                        range(CANARY_REQUESTS),
                    )
                )
            canaried = versions_seen.count(digests[1])
            assert versions_seen.count(digests[0]) + canaried == CANARY_REQUESTS
            # Two-sided bounds at 1e-6 of Binomial(n, 0.1): a correct split fails once in a
            # million runs.
            low, high = binom.ppf([5e-7, 1 - 5e-7], CANARY_REQUESTS, CANARY_PERCENT / 100)
            assert low <= canaried <= high, (canaried, low, high)

            # 3. Promote: version 2 answers everything, version 1 is kept as previous.
            promoted = admin.post("/v2/repository/aliases/digits/promote").json()
            assert promoted["model"] == "digits-2"
            assert promoted["previous"] == "digits-1"
            assert {served_by() for _ in range(20)} == {digests[1]}

            # 4. A shadow (version 3) of every request: compared, never answered; then off.
            assert _metric(url, "besvm_shadow_instances_total") == 0
            shadowed = {"model": "digits-2", "shadow": {"model": "digits-3", "percent": 100}}
            assert admin.put("/v2/repository/aliases/digits", json=shadowed).status_code == 200
            _wait_for(
                lambda: _metric(url, "besvm_shadow_instances_total") >= 50 * len(batch),
                "fifty shadowed requests compared",
            )
            unshadowed = admin.put("/v2/repository/aliases/digits", json={"model": "digits-2"})
            assert unshadowed.json()["shadow"] is None
            assert unshadowed.json()["previous"] == "digits-1"  # the model did not change
            counts: list[float] = []
            _wait_for(
                lambda: (
                    counts.append(_metric(url, "besvm_shadow_instances_total"))
                    or (len(counts) > 3 and counts[-1] == counts[-4])
                ),
                "the comparisons queued to finish",
            )

            # 5. Roll back: the previous model (version 1) answers again.
            rolled = admin.post("/v2/repository/aliases/digits/rollback").json()
            assert rolled["model"] == "digits-1"
            assert rolled["previous"] is None
            assert {served_by() for _ in range(20)} == {digests[0]}
            time.sleep(0.5)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        # Every request of the load, across the five steps, answered and consistent.
        assert not failures, failures[:5]
        assert answers[digests[0]] > 0
        assert answers[digests[1]] > 0
        assert digests[2] not in answers  # a shadow's answers are never returned

        # The agreement metric is the shadow's real differences: 3 of each request's 8 images.
        agreed = _metric(url, "besvm_shadow_instances_total", outcome="agree")
        disagreed = _metric(url, "besvm_shadow_instances_total", outcome="disagree")
        real = sum(a != b for a, b in zip(labels[digests[1]], labels[digests[2]], strict=True))
        assert real == 3
        compared = (agreed + disagreed) / len(batch)
        assert compared >= 50
        assert (agreed, disagreed) == (5 * compared, 3 * compared)
        assert _metric(url, "besvm_shadow_duration_seconds_count") == compared
        log = server.stop()
    assert "disagreed with" in log
    assert '"logger":"service.api.shadow"' in log


# -- refusals, in process ---------------------------------------------------------------------


def _client(root, **overrides) -> TestClient:
    settings = Settings(_env_file=None, model_repository=root, admin_token=TOKEN, **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


def _refused(response, status: int = 409) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


@pytest.fixture
def small_repository(tmp_path, repository):
    """Versions 1 and 2, a directory that fails to load, and no traffic file yet."""
    for number in (1, 2):
        shutil.copytree(repository / f"digits-{number}", tmp_path / f"digits-{number}")
    (tmp_path / "broken").mkdir()
    return tmp_path


def test_the_admin_routes_refuse_what_cannot_be_served_and_change_nothing(small_repository):
    with _client(small_repository) as client:
        put = client.put
        url = "/v2/repository/aliases/digits"
        assert client.get("/v2/repository/aliases").status_code == 401
        assert "not in the repository" in _refused(
            put(url, headers=ADMIN, json={"model": "digits-9"})
        )
        assert "failed to load" in _refused(put(url, headers=ADMIN, json={"model": "broken"}))
        assert "name of a model" in _refused(
            put("/v2/repository/aliases/digits-1", headers=ADMIN, json={"model": "digits-2"})
        )
        same = {"model": "digits-1", "canary": {"model": "digits-1", "percent": 5}}
        assert "own model" in _refused(put(url, headers=ADMIN, json=same))
        both = {
            "model": "digits-1",
            "canary": {"model": "digits-2", "percent": 5},
            "shadow": {"model": "digits-2", "percent": 5},
        }
        assert "canary's model" in _refused(put(url, headers=ADMIN, json=both))
        over = {"model": "digits-1", "canary": {"model": "digits-2", "percent": 101}}
        assert put(url, headers=ADMIN, json=over).status_code == 422
        assert _refused(put("/v2/repository/aliases/-x", headers=ADMIN, json=same), 422)
        assert not (small_repository / "traffic.json").exists()  # nothing was written
        assert _refused(client.post(f"{url}/promote", headers=ADMIN), 404)

        assert put(url, headers=ADMIN, json={"model": "digits-1"}).status_code == 200
        assert "no canary" in _refused(client.post(f"{url}/promote", headers=ADMIN))
        assert "neither a canary" in _refused(client.post(f"{url}/rollback", headers=ADMIN))
        # A request may name the canary's version: it is answered by the canary, undrawn.
        canary = {"model": "digits-1", "canary": {"model": "digits-2", "percent": 1}}
        served = put(url, headers=ADMIN, json=canary).json()
        image = np.zeros((1, 8, 8)).tolist()
        tensor = {
            "inputs": [{"name": "input", "shape": [1, 8, 8], "datatype": "FP64", "data": image}]
        }
        pinned = client.post(
            f"/v2/models/digits/versions/{served['canary']['version']}/infer", json=tensor
        )
        assert pinned.json()["model_name"] == "digits-2"
        assert client.post("/v2/models/digits/versions/abc/infer", json=tensor).status_code == 404
        # Metadata and readiness of an alias are its model's.
        assert client.get("/v1/models/digits").json()["name"] == "digits-1"
        assert client.get("/v2/models/digits/ready").status_code == 200
        assert client.delete(url, headers=ADMIN).json() == {"name": "digits", "removed": True}
        assert "aliases" not in _refused(client.post("/v1/models/digits/classify", json={}), 404)
        assert json.loads((small_repository / "traffic.json").read_text()) == {"aliases": {}}


def test_a_traffic_file_that_cannot_be_served_keeps_the_policies_in_force(small_repository):
    path = small_repository / "traffic.json"
    _write_traffic(small_repository, {"digits": {"model": "digits-1"}})
    with _client(small_repository) as client:
        assert (
            client.post(
                "/v1/models/digits/classify", json={"instances": [np.zeros((8, 8)).tolist()]}
            ).json()["model"]
            == "digits-1"
        )
        path.write_text("{not json")
        listed = client.post("/v2/repository/index", headers=ADMIN)
        assert listed.status_code == 200
        aliases = client.get("/v2/repository/aliases", headers=ADMIN).json()
        assert "is not JSON" in aliases["problem"]
        assert [a["model"] for a in aliases["aliases"]] == ["digits-1"]
        # A change by the routes is refused too while the file is broken: it would be lost.
        assert "is not JSON" in _refused(
            client.put("/v2/repository/aliases/digits", headers=ADMIN, json={"model": "digits-2"})
        )
        # An alias moved to a model that failed, beside one that may be served.
        _write_traffic(
            small_repository,
            {
                "digits": {"model": "broken"},
                "latest": {"model": "digits-2"},
                "digits-1": {"model": "digits-2"},
            },
        )
        client.post("/v2/repository/index", headers=ADMIN)
        aliases = client.get("/v2/repository/aliases", headers=ADMIN).json()
        assert aliases["problem"] is None
        served = {a["name"]: a for a in aliases["aliases"]}
        assert served["digits"]["model"] == "digits-1"
        assert "failed to load" in served["digits"]["reason"]
        assert served["latest"]["model"] == "digits-2"
        assert [r["name"] for r in aliases["refused"]] == ["digits-1"]


def test_aliases_need_a_repository_or_a_traffic_file(digits_model_dir, tmp_path):
    settings = Settings(_env_file=None, model_dir=digits_model_dir, admin_token=TOKEN)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        response = client.put("/v2/repository/aliases/x", headers=ADMIN, json={"model": "digits"})
        assert "MODEL_REPOSITORY" in _refused(response)
    traffic = tmp_path / "traffic.json"
    settings = Settings(
        _env_file=None, model_dir=digits_model_dir, admin_token=TOKEN, traffic_file=traffic
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        response = client.put("/v2/repository/aliases/x", headers=ADMIN, json={"model": "digits"})
        assert response.status_code == 200, response.text
        assert (
            client.post("/classify", json={"instances": [np.zeros((8, 8)).tolist()]}).status_code
            == 200
        )
        assert (
            client.post(
                "/v1/models/x/classify", json={"instances": [np.zeros((8, 8)).tolist()]}
            ).json()["model"]
            == "digits"
        )


def test_a_change_by_one_worker_reaches_every_worker(small_repository):
    """WORKERS=2: the worker that answers the admin route tells the supervisor (SIGHUP), which
    tells every worker to read the file: new connections, spread over both workers, all see
    the change, without waiting for a rescan (RELOAD_INTERVAL_S is 0)."""
    _write_traffic(small_repository, {"digits": {"model": "digits-1"}})
    digests = [manifest_digest(small_repository / f"digits-{n}") for n in (1, 2)]
    image = {"instances": [np.zeros((8, 8)).tolist()]}
    with server_process(
        MODEL_REPOSITORY=str(small_repository), ADMIN_TOKEN=TOKEN, WORKERS="2"
    ) as server:
        url = server.url

        def versions() -> set[str]:
            # A new connection each: the kernel spreads them over the workers.
            return {
                httpx.post(f"{url}/v1/models/digits/classify", json=image).headers[
                    "x-model-version"
                ]
                for _ in range(40)
            }

        assert versions() == {digests[0]}
        moved = httpx.put(
            f"{url}/v2/repository/aliases/digits", headers=ADMIN, json={"model": "digits-2"}
        )
        assert moved.status_code == 200, moved.text
        _wait_for(lambda: versions() == {digests[1]}, "every worker to serve version 2")
        # Both workers applied it (each logs the change once), not one that took every request.
        _wait_for(
            lambda: server.log().count("now: model 'digits-2'") == 2, "both workers' log lines"
        )
