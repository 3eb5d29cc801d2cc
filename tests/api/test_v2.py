"""The Open Inference Protocol (KServe V2 REST) through a real server process: tritonclient's
HTTP client, the protocol's JSON examples sent raw, and the error paths in the protocol's shape.
Scores are compared with the model library's own answers, computed here from the artifact."""

from __future__ import annotations

import json
import socket

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.model.artifact import manifest_digest
from tests.api.conftest import read_until_closed, server_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repository(protocol_repository):
    return protocol_repository


@pytest.fixture(scope="module")
def url(repository):
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", ADMIN_TOKEN="token"
    ) as server:
        yield server.url


@pytest.fixture
def client(url):
    client = triton.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=30)
    yield client
    client.close()


def _protocol_error(response: httpx.Response, status: int) -> str:
    """The message of a protocol error: ``{"error": "message"}`` and nothing else."""
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"], body
    assert isinstance(body["error"], str), body
    return body["error"]


# -- health and metadata -----------------------------------------------------------------------


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "besvm"
    assert metadata["version"]
    assert metadata["extensions"] == ["model_repository"]


def test_model_metadata_names_the_tensors_and_classes(client, repository, digits_predictor):
    version = manifest_digest(repository / "digits")
    metadata = client.get_model_metadata("digits")
    assert metadata["name"] == "digits"
    assert metadata["versions"] == [version]
    assert metadata["platform"] == "besvm"
    measures = [{"similarity": name, "transform": "pixels"} for name in ["rbf(gamma=1)"]]
    assert digits_predictor.similarity_names == ["rbf(gamma=1)"]
    assert metadata["inputs"] == [
        {
            "name": "input",
            "datatype": "FP64",
            "shape": [-1, 8, 8, 1],
            "parameters": {"measures": measures},
        }
    ]
    outputs = {output["name"]: output for output in metadata["outputs"]}
    assert outputs["label"] == {"name": "label", "datatype": "BYTES", "shape": [-1]}
    assert outputs["scores"]["datatype"] == "FP64"
    assert outputs["scores"]["shape"] == [-1, len(digits_predictor.classes)]
    assert outputs["scores"]["parameters"]["classes"] == list(digits_predictor.classes)
    assert set(outputs) == {"label", "scores", "top_k_labels", "top_k_scores", "explanation"}
    assert client.get_model_metadata("digits", model_version=version) == metadata

    text = client.get_model_metadata("topics")
    assert [{k: v for k, v in t.items() if k != "parameters"} for t in text["inputs"]] == [
        {"name": "text", "datatype": "BYTES", "shape": [-1]}
    ]
    assert {m["transform"] for m in text["inputs"][0]["parameters"]["measures"]} == {"none"}


def test_model_readiness(client, repository):
    assert client.is_model_ready("digits")
    assert client.is_model_ready("topics")
    version = manifest_digest(repository / "digits")
    assert client.is_model_ready("digits", model_version=version)
    assert not client.is_model_ready("digits", model_version="0" * 64)
    assert not client.is_model_ready("notes")  # failed to load
    assert not client.is_model_ready("nothing")


# -- inference with tritonclient ----------------------------------------------------------------


@pytest.mark.parametrize("binary_data", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_tritonclient_infer_equals_the_library(
    client, repository, digits, digits_predictor, datatype, binary_data
):
    images = (
        digits.X_test[:12]
        .reshape(12, 8, 8, 1)
        .astype(np.float32 if datatype == "FP32" else np.float64)
    )
    tensor = triton.InferInput("input", list(images.shape), datatype)
    tensor.set_data_from_numpy(images, binary_data=binary_data)
    outputs = [
        triton.InferRequestedOutput("scores", binary_data=False),
        triton.InferRequestedOutput("label", binary_data=False),
    ]
    result = client.infer("digits", [tensor], outputs=outputs, request_id="req-7")

    # The reference: the model loaded from its artifact, on the values the client sent.
    expected = digits_predictor.decision_function(images.reshape(12, -1).astype(np.float64))
    scores = result.as_numpy("scores")
    assert scores.dtype == np.float64
    assert scores.shape == (12, len(digits_predictor.classes))
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)
    labels = [
        label.decode() if isinstance(label, bytes) else label for label in result.as_numpy("label")
    ]
    assert labels == [digits_predictor.classes[i] for i in expected.argmax(axis=1)]
    assert np.mean(np.array(labels) == digits.y_test[:12]) > 0.8

    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_name"] == "digits"
    assert response["model_version"] == manifest_digest(repository / "digits")
    assert [output["name"] for output in response["outputs"]] == ["scores", "label"]


def test_tritonclient_infer_without_requested_outputs(client, digits, digits_predictor):
    images = digits.X_test[:3].reshape(3, 8, 8, 1)
    tensor = triton.InferInput("input", [3, 8, 8, 1], "FP64")
    tensor.set_data_from_numpy(images)
    result = client.infer("digits", [tensor])
    names = [output["name"] for output in result.get_response()["outputs"]]
    assert names == ["label", "scores"]
    np.testing.assert_allclose(
        result.as_numpy("scores"), digits_predictor.decision_function(digits.X_test[:3]), rtol=1e-12
    )


def test_top_k_adds_the_best_classes_best_first(client, digits, digits_predictor):
    images = digits.X_test[:4].reshape(4, 8, 8, 1)
    tensor = triton.InferInput("input", [4, 8, 8, 1], "FP64")
    tensor.set_data_from_numpy(images, binary_data=False)
    result = client.infer("digits", [tensor], parameters={"top_k": 3})
    expected = digits_predictor.decision_function(digits.X_test[:4])
    best = np.argsort(-expected, axis=1)[:, :3]
    labels = result.as_numpy("top_k_labels")
    assert labels.shape == (4, 3)
    assert [
        [label.decode() if isinstance(label, bytes) else label for label in row] for row in labels
    ] == [[digits_predictor.classes[i] for i in row] for row in best]
    np.testing.assert_allclose(
        result.as_numpy("top_k_scores"), np.take_along_axis(expected, best, axis=1), rtol=1e-12
    )
    assert result.as_numpy("scores").shape == (4, 10)  # all K, whatever top_k


def test_tritonclient_reports_protocol_errors(client):
    tensor = triton.InferInput("input", [1, 8, 8, 1], "FP64")
    tensor.set_data_from_numpy(np.zeros((1, 8, 8, 1)), binary_data=False)
    with pytest.raises(InferenceServerException, match="no model named 'nothing'") as raised:
        client.infer("nothing", [tensor])
    assert raised.value.status() == "404"
    wrong = triton.InferInput("input", [1, 64], "FP64")
    wrong.set_data_from_numpy(np.zeros((1, 64)), binary_data=False)
    with pytest.raises(InferenceServerException, match=r"expected \[-1, 8, 8, 1\]") as raised:
        client.infer("digits", [wrong])
    assert raised.value.status() == "400"


# -- the protocol's JSON examples, sent raw --------------------------------------------------------


def _infer(url: str, model: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


def _output(body: dict, name: str) -> dict:
    (output,) = [o for o in body["outputs"] if o["name"] == name]
    return output


def test_json_nested_and_flat_data_answer_alike(url, digits, digits_predictor):
    images = digits.X_test[20:22].reshape(2, 8, 8)
    nested = {
        "id": "42",
        "inputs": [
            {"name": "input", "shape": [2, 8, 8], "datatype": "FP64", "data": images.tolist()}
        ],
    }
    flat = {
        "inputs": [
            {
                "name": "input",
                "shape": [2, 8, 8, 1],
                "datatype": "FP32",
                "data": images.ravel().tolist(),
            }
        ],
        "outputs": [{"name": "scores"}],
    }
    integers = {
        "inputs": [
            {
                "name": "input",
                "shape": [2, 64],
                "datatype": "INT64",
                "data": images.astype(int).ravel().tolist(),
            }
        ]
    }
    answered = _infer(url, "digits", nested)
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert body["id"] == "42"
    assert body["model_name"] == "digits"
    assert answered.headers["x-model-version"] == body["model_version"]
    expected = digits_predictor.decision_function(digits.X_test[20:22])
    scores = _output(body, "scores")
    assert scores["datatype"] == "FP64"
    assert scores["shape"] == [2, 10]
    np.testing.assert_allclose(np.reshape(scores["data"], (2, 10)), expected, rtol=1e-12)
    label = _output(body, "label")
    assert label == {
        "name": "label",
        "datatype": "BYTES",
        "shape": [2],
        "data": [digits_predictor.classes[i] for i in expected.argmax(axis=1)],
    }

    flat_body = _infer(url, "digits", flat).json()
    assert "id" not in flat_body
    assert [o["name"] for o in flat_body["outputs"]] == ["scores"]
    assert _output(flat_body, "scores") == scores  # digits are exact in float32
    # Whole numbers in an integer datatype: refused with shape [2, 64] (not the model's shape).
    assert "expected [-1, 8, 8, 1] or [-1, 8, 8]" in _protocol_error(
        _infer(url, "digits", integers), 400
    )
    integers["inputs"][0]["shape"] = [2, 8, 8, 1]
    assert _output(_infer(url, "digits", integers).json(), "scores") == scores
    # 2.0 is an integer to JSON (Schema): top_k 2.
    ranked = _infer(url, "digits", {**nested, "parameters": {"top_k": 2.0}}).json()
    assert _output(ranked, "top_k_labels")["shape"] == [2, 2]


def test_json_bytes_texts_for_the_text_model(url, text_fit):
    predictor = text_fit.predictor
    texts = ["The rocket left orbit for the moon.", "A court, a judge and a jury.", "qwerty"]
    body = {
        "id": "t",
        "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}],
        "parameters": {"top_k": 2},
    }
    answered = _infer(url, "topics", body)
    assert answered.status_code == 200, answered.text
    outputs = answered.json()["outputs"]
    assert [o["name"] for o in outputs] == ["label", "scores", "top_k_labels", "top_k_scores"]
    expected = predictor.decision_function(texts)
    K = len(predictor.classes)
    np.testing.assert_allclose(
        np.reshape(_output(answered.json(), "scores")["data"], (3, K)), expected, rtol=1e-12
    )
    labels = _output(answered.json(), "label")["data"]
    assert labels[:2] == ["space", "law"]
    assert labels == [predictor.classes[i] for i in expected.argmax(axis=1)]
    assert _output(answered.json(), "top_k_labels")["shape"] == [3, 2]
    # [n, 1] is the same batch of texts.
    body["inputs"][0].update(shape=[3, 1], data=[[t] for t in texts])
    assert _infer(url, "topics", body).json()["outputs"] == outputs


def test_text_model_tritonclient_bytes(client, text_fit):
    texts = np.array([b"court judge jury", b"rocket orbit"], dtype=np.object_)
    for binary_data in (False, True):
        tensor = triton.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(texts, binary_data=binary_data)
        result = client.infer(
            "topics", [tensor], outputs=[triton.InferRequestedOutput("label", binary_data=False)]
        )
        labels = [
            label.decode() if isinstance(label, bytes) else label
            for label in result.as_numpy("label")
        ]
        assert labels == ["law", "space"]


# -- errors ------------------------------------------------------------------------------------


IMAGE = [0.0] * 64


def _image(inputs: dict | None = None, **request) -> dict:
    """An image request to the digits model, its one tensor and the request changed."""
    tensor = {"name": "input", "shape": [1, 8, 8, 1], "datatype": "FP64", "data": IMAGE}
    return {"inputs": [{**tensor, **(inputs or {})}], **request}


def _text(**tensor) -> dict:
    return {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"], **tensor}]
    }


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        ("digits", _image({"datatype": "BYTES"}), "datatype 'BYTES'"),
        ("digits", _image({"datatype": "BOOL"}), "FP64 or FP32"),
        ("digits", _image({"data": IMAGE[:63]}), "63 values; shape [1, 8, 8, 1] takes 64"),
        ("digits", _image({"shape": [2, 8, 8, 1]}), "64 values; shape [2, 8, 8, 1] takes 128"),
        ("digits", _image({"shape": [1, 4, 16]}), "has shape [1, 4, 16]"),
        ("digits", _image({"shape": [1, 64]}), "expected [-1, 8, 8, 1] or [-1, 8, 8]"),
        ("digits", _image({"shape": []}), "has shape []"),
        ("digits", _image({"shape": [-1, 8, 8, 1]}), "shape[0]: Input should be greater than"),
        ("digits", _image({"shape": ["1", 8, 8, 1]}), "shape[0]: Value error, must be an integer"),
        ("digits", _image({"data": ["a"] * 64}), "only numbers"),
        ("digits", _image({"data": [[1, 2], [3]]}), "ragged"),
        ("digits", _image({"datatype": "INT32", "data": [0.5] * 64}), "whole numbers"),
        ("digits", _image({"datatype": "UINT8", "data": [256] * 64}), "out of the range of UINT8"),
        ("digits", _image({"datatype": "FP32", "data": [1e39] * 64}), "out of the range of FP32"),
        ("digits", _image({"data": None}), "has no data"),
        ("digits", _image({"name": "image"}), "unknown input 'image'"),
        ("digits", {"inputs": []}, "one input"),
        ("digits", _image({"shape": [0, 8, 8, 1], "data": []}), "the batch is empty"),
        ("digits", _image(outputs=[{"name": "probabilities"}]), "unknown output 'probabilities'"),
        (
            "digits",
            _image(outputs=[{"name": "label", "parameters": {"classification": 3}}]),
            "classification extension is not supported",
        ),
        ("digits", _image(parameters={"top_k": "3"}), "parameters.top_k: Value error"),
        ("digits", _image(parameters={"top_k": True}), "parameters.top_k: Value error"),
        ("digits", _image(parameters={"top_k": 2.5}), "parameters.top_k"),
        ("digits", _image(parameters={"top_k": 0}), "parameters.top_k"),
        ("digits", {"input": []}, "inputs: Field required"),
        ("topics", _text(datatype="FP32", data=[1.0]), "reads texts: BYTES"),
        ("topics", _text(shape=[2]), "1 texts; shape [2] takes 2"),
        ("topics", _text(shape=[1, 2]), "expected [-1] or [-1, 1]"),
        ("topics", _text(data=[7]), "only strings"),
    ],
)
def test_bad_requests_get_a_400_saying_why(url, model, body, message):
    assert message in _protocol_error(_infer(url, model, body), 400)


def test_a_batch_over_the_limit_is_a_413(url):
    body = _image({"shape": [51, 8, 8, 1], "data": IMAGE * 51})
    assert "limit is 50" in _protocol_error(_infer(url, "digits", body), 413)


def test_malformed_json_is_a_400(url):
    response = httpx.post(
        f"{url}/v2/models/digits/infer",
        content=b'{"inputs": [',
        headers={"content-type": "application/json"},
    )
    assert "not valid JSON" in _protocol_error(response, 400)


def test_unknown_and_not_ready_models(url):
    ok = {"inputs": [{"name": "input", "shape": [1, 8, 8, 1], "datatype": "FP64", "data": IMAGE}]}
    assert "no model named 'nothing'" in _protocol_error(_infer(url, "nothing", ok), 404)
    assert "no model named" in _protocol_error(httpx.get(f"{url}/v2/models/nothing"), 404)
    assert "no model named" in _protocol_error(httpx.get(f"{url}/v2/models/nothing/ready"), 404)
    not_ready = _protocol_error(_infer(url, "notes", ok), 503)
    assert "failed to load" in not_ready
    assert "failed to load" in _protocol_error(httpx.get(f"{url}/v2/models/notes/ready"), 503)
    assert "failed to load" in _protocol_error(httpx.get(f"{url}/v2/models/notes"), 503)
    version = httpx.get(f"{url}/v2/models/digits").json()["versions"][0]
    pinned = httpx.post(f"{url}/v2/models/digits/versions/{version}/infer", json=ok)
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["model_version"] == version
    stale = httpx.post(f"{url}/v2/models/digits/versions/{'0' * 64}/infer", json=ok)
    assert "serves version" in _protocol_error(stale, 404)
    # Unknown routes and methods under the protocol's prefix answer in its shape too.
    _protocol_error(httpx.get(f"{url}/v2/models/digits/explain"), 404)
    _protocol_error(httpx.delete(f"{url}/v2/health/live"), 405)


def test_repository_routes_keep_the_services_error_shape(url):
    response = httpx.post(f"{url}/v2/repository/index")
    assert response.status_code == 401
    assert set(response.json()["error"]) >= {"type", "message"}


def test_the_openapi_document_describes_the_protocol(url):
    document = httpx.get(f"{url}/openapi.json").json()
    paths = document["paths"]
    for path in (
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{name}",
        "/v2/models/{name}/ready",
    ):
        assert "get" in paths[path]
    infer = paths["/v2/models/{name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/InferRequest"
    )
    assert set(infer["responses"]) >= {"200", "400", "404", "413", "503"}
    assert "InferRequest" in document["components"]["schemas"]


def test_a_body_over_the_limit_is_a_413_in_the_protocols_shape(make_client):
    client = make_client(max_request_bytes=2048)
    body = {"inputs": [{"name": "input", "shape": [1, 8, 8, 1], "datatype": "FP64", "data": IMAGE}]}
    padded = {**body, "id": "x" * 4000}
    assert "larger than the limit" in _protocol_error(
        client.post("/v2/models/digits/infer", json=padded), 413
    )
    # The same limit on our own routes keeps their shape.
    own = client.post("/classify", json={"instances": [IMAGE], "texts": ["x" * 4000]})
    assert own.status_code == 413
    assert own.json()["error"]["type"] == "request_too_large"


def test_a_server_that_is_not_ready_says_so(digits_model_dir):
    from fastapi.testclient import TestClient

    from service.api import Settings, create_app

    # Before its lifespan has run, the app has no model loaded.
    app = create_app(Settings(_env_file=None, model_dir=digits_model_dir))
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/v2/health/live").json() == {"live": True}
    _protocol_error(client.get("/v2/health/ready"), 503)
    assert client.get("/v2/health/ready").headers["retry-after"]


def test_a_non_ascii_digit_in_the_header_length_is_a_400(url):
    # "²" passes str.isdigit but not int(): it was a 500. Sent raw, as a client may.
    body = b'{"inputs": []}'
    host, port = url.removeprefix("http://").split(":")
    request = (
        b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Inference-Header-Content-Length: \xb2\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
    ) + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = read_until_closed(sock)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "inference-header-content-length must be" in json.loads(payload)["error"].lower()


def test_malformed_json_says_why_in_the_protocol_shape(url):
    deep = b"[" * 100_000 + b"]" * 100_000
    response = httpx.post(f"{url}/v2/models/digits/infer", content=deep, timeout=30)
    assert "nested deeper than 201 levels" in _protocol_error(response, 400)
