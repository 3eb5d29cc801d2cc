"""Error paths of the API: every bad request gets a 4xx with a message, never a 500."""

import json

import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app

SEVEN = [[0.0] * 8] * 8


def _error(response, status):
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["message"]
    return body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"instances": []}, "the batch is empty"),
        ({"instances": [[1.0, 2.0]]}, r"instances[0] has shape [2], expected [8, 8, 1] or [8, 8]"),
        ({"instances": [SEVEN, [[0.0] * 8] * 7]}, "instances[1] has shape [7, 8]"),
        ({"instances": [[["x"] * 8] * 8]}, "must hold only numbers, got strings"),
        ({"instances": [[[None] * 8] * 8]}, "null or mixed values"),
        ({"instances": [[[0.0] * 8] * 7 + [[0.0] * 7]]}, "instances[0] is ragged"),
        ({"instances": [[[0.0] * 8] * 7 + [[0.0] * 3 + [[1]] + [0.0] * 4]]}, "is ragged"),
        ({"instances": "seven"}, "instances: Input should be a valid array"),
        ({}, "send either instances or texts"),
        ({"instances": [SEVEN], "top_k": 0}, "top_k must be at least 1, got 0"),
        ({"instances": [SEVEN], "top_k": "many"}, "top_k: Input should be a valid integer"),
        ({"instances": [SEVEN], "extra": 1}, "extra: Extra inputs are not permitted"),
    ],
)
def test_bad_classify_bodies_get_422_with_a_message(client, body, message):
    assert message in _error(client.post("/classify", json=body), 422)["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"instances": [[[NaN, 0, 0, 0, 0, 0, 0, 0]' + b", [0, 0, 0, 0, 0, 0, 0, 0]" * 7 + b"]]}",
        b'{"instances": [[' + b"[1e999, 0, 0, 0, 0, 0, 0, 0]," * 7 + b"[0, 0, 0, 0, 0, 0, 0, 0]]]}",
    ],
)
def test_non_finite_numbers_get_422(client, raw):
    # NaN (which Python's json writes) and numbers beyond float64 are read, then refused.
    response = client.post("/classify", content=raw, headers={"content-type": "application/json"})
    assert "contains NaN or infinity" in _error(response, 422)["message"]


@pytest.mark.parametrize(
    ("raw", "message"), [(b'{"instances": [', "not valid JSON"), (b"", "the body is empty")]
)
def test_malformed_json_gets_400(client, raw, message):
    response = client.post("/classify", content=raw, headers={"content-type": "application/json"})
    body = _error(response, 400)
    assert body["type"] == "bad_request"
    assert message in body["message"]


def test_a_batch_over_the_limit_gets_413(make_client):
    client = make_client(max_batch_size=2)
    body = _error(client.post("/classify", json={"instances": [SEVEN] * 3}), 413)
    assert body["type"] == "batch_too_large"
    assert client.post("/classify", json={"instances": [SEVEN] * 2}).status_code == 200


def test_a_body_over_the_byte_limit_gets_413_declared_or_streamed(make_client):
    client = make_client(max_request_bytes=2048)
    big = json.dumps({"instances": [SEVEN] * 20}).encode()
    assert len(big) > 2048
    body = _error(
        client.post("/classify", content=big, headers={"content-type": "application/json"}), 413
    )
    assert "2,048 bytes" in body["message"]

    def chunks():
        for start in range(0, len(big), 500):
            yield big[start : start + 500]

    streamed = client.post(
        "/classify", content=chunks(), headers={"content-type": "application/json"}
    )
    assert _error(streamed, 413)["type"] == "request_too_large"


def test_without_a_model_the_service_is_alive_but_not_ready(tmp_path):
    settings = Settings(_env_file=None, model_dir=tmp_path / "missing")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert "no model artifact" in _error(ready, 503)["message"]
        assert ready.headers["retry-after"] == "5"
        assert (
            _error(client.post("/classify", json={"instances": [SEVEN]}), 503)["type"]
            == "not_ready"
        )
        (listed,) = client.get("/v1/models").json()["models"]
        assert listed["state"] == "failed"
        assert listed["version"] is None
        assert "no model artifact" in listed["reason"]
        assert _error(client.get("/v1/models/missing"), 503)["type"] == "not_ready"


def test_a_tampered_model_is_not_served(digits_model_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(digits_model_dir, broken)
    (broken / "coef.npy").write_bytes(b"\x93NUMPY garbage")
    with TestClient(create_app(Settings(_env_file=None, model_dir=broken))) as client:
        assert "checksum" in _error(client.get("/readyz"), 503)["message"]


def test_unknown_routes_models_and_methods(client):
    assert _error(client.get("/nope"), 404)["type"] == "not_found"
    assert "no model named 'other'" in _error(client.get("/v1/models/other"), 404)["message"]
    assert _error(client.get("/classify"), 405)["type"] == "method_not_allowed"


def test_top_k_defaults_and_clips(client):
    body = client.post("/classify", json={"instances": [SEVEN]}).json()
    assert len(body["predictions"][0]["top_k"]) == 3
    body = client.post("/classify", json={"instances": [SEVEN], "top_k": 50}).json()
    assert len(body["predictions"][0]["top_k"]) == 10


@pytest.mark.parametrize(
    "raw",
    [
        b"null",
        b"[]",
        b"42",
        b'"x"',
        b'{"instances": null}',
        b'{"instances": [null]}',
        b'{"instances": [[]]}',
        b'{"instances": [{}]}',
        b'{"instances": [[[[[[1]]]]]]}',
        b'{"instances": [' + b"1," * 1000 + b"1]}",
        b'{"instances": [[[1e308]]]}',
        b'{"instances": [[[' + b"9" * 500 + b"]]]}",
        b"\xff\xfe",
        b'{"top_k": -1}',
    ],
)
def test_odd_bodies_never_cause_a_500(client, raw):
    response = client.post("/classify", content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["message"]


def test_openapi_documents_examples_and_error_responses(client):
    spec = client.get("/openapi.json").json()
    classify = spec["paths"]["/classify"]["post"]
    assert {"413", "422", "503"} <= classify["responses"].keys()
    schema = spec["components"]["schemas"]["ClassifyRequest"]
    assert schema["examples"][0]["instances"]


def test_answers_stay_small_whatever_the_request(client):
    huge = "x" * 1_000_000
    for response in (
        client.post("/classify", json={"instances": [None] * 5000}),
        client.post("/classify", json={"texts": [1] * 5000}),
        client.post("/classify", json={"texts": [huge]}),
        client.get(f"/v1/models/{'m' * 50_000}"),
    ):
        assert 400 <= response.status_code < 500
        assert len(response.content) < 10_000, response.status_code
    details = client.post("/classify", json={"texts": [1] * 5000}).json()["error"]
    assert len(details["details"]) == 21
    assert details["details"][-1]["problem"].startswith("and ")


def test_method_not_allowed_says_which_are(client):
    response = client.request("TRACE", "/healthz")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
