"""``explain`` through the routes: /classify's explanation, the protocol's ``explanation``
output (REST here, gRPC in tests/api/test_batching.py's real server), equal to the model
library's, and the limits on it."""

from __future__ import annotations

import json

import pytest

TOLERANCE = 1e-9


def _library(predictor, image, k):
    (answer,) = predictor.classify([image], 3, explain=k)
    return answer.explanation.as_dict()


def _assert_same(got: dict, expected: dict) -> None:
    assert got["label"] == expected["label"]
    assert got["score"] == pytest.approx(expected["score"], abs=TOLERANCE)
    assert got["intercept"] == expected["intercept"]
    assert [i["basis_index"] for i in got["items"]] == [i["basis_index"] for i in expected["items"]]
    assert [i["id"] for i in got["items"]] == [i["id"] for i in expected["items"]]
    total = sum(i["contribution"] for i in got["items"])
    assert got["intercept"] + total + got["rest"] == pytest.approx(got["score"], abs=TOLERANCE)


def test_classify_explains_each_prediction(client, digits, digits_predictor):
    images = digits.X_test[:2].reshape(2, 8, 8).tolist()
    answer = client.post("/classify", json={"instances": images, "explain": 4})
    assert answer.status_code == 200
    for image, prediction in zip(images, answer.json()["predictions"], strict=True):
        explanation = prediction["explanation"]
        assert explanation["label"] == prediction["label"]
        assert len(explanation["items"]) == 4
        _assert_same(explanation, _library(digits_predictor, image, 4))
    plain = client.post("/classify", json={"instances": images}).json()["predictions"]
    assert all("explanation" not in p for p in plain)


@pytest.mark.parametrize(("explain", "status"), [(-1, 422), (101, 422), ("3", 422), (0, 200)])
def test_classify_refuses_a_bad_explain(client, digits, explain, status):
    image = digits.X_test[0].reshape(8, 8).tolist()
    answer = client.post("/classify", json={"instances": [image], "explain": explain})
    assert answer.status_code == status, answer.text


def test_the_protocol_answers_an_explanation_output(client, digits, digits_predictor):
    image = digits.X_test[3].reshape(8, 8)
    tensor = {"name": "input", "shape": [1, 8, 8], "datatype": "FP64",
              "data": image.ravel().tolist()}  # fmt: skip
    body = {"inputs": [tensor], "parameters": {"explain": 3}}
    answer = client.post("/v2/models/digits/infer", json=body).json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert list(outputs) == ["label", "scores", "explanation"]
    explanation = outputs["explanation"]
    assert explanation["datatype"] == "BYTES"
    assert explanation["shape"] == [1]
    got = json.loads(explanation["data"][0])
    _assert_same(got, _library(digits_predictor, image.tolist(), 3))
    # Asked for by name, without the parameter: five items.
    body = {"inputs": [tensor], "outputs": [{"name": "explanation"}]}
    answer = client.post("/v2/models/digits/infer", json=body).json()
    (output,) = answer["outputs"]
    assert len(json.loads(output["data"][0])["items"]) == 5
    body = {"inputs": [tensor], "parameters": {"explain": 0}}
    assert client.post("/v2/models/digits/infer", json=body).status_code == 400
