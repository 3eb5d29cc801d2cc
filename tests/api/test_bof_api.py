"""A bof model (images as bags of visual words on a pyramid, beside pixels) through a real
server: raw images in, the same scores as the model computes in process, on /classify and the
Open Inference Protocol; the model's description names both transforms."""

import httpx
import numpy as np
import pytest


def test_classify_answers_raw_images_with_the_in_process_scores(bof_live_server, bof_fit, glyphs):
    images = glyphs.X_test[:7].reshape(7, 32, 32)
    response = httpx.post(
        f"{bof_live_server}/classify",
        json={"instances": images.tolist(), "top_k": 10},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    expected = bof_fit.predictor.decision_function(glyphs.X_test[:7])
    classes = bof_fit.predictor.classes
    for prediction, row in zip(response.json()["predictions"], expected, strict=True):
        assert prediction["label"] == classes[int(row.argmax())]
        scores = {entry["label"]: entry["score"] for entry in prediction["top_k"]}
        for label, score in zip(classes, row, strict=True):
            assert scores[label] == pytest.approx(float(score), rel=1e-9, abs=1e-12)


def test_open_inference_protocol_answers_alike(bof_live_server, bof_fit, glyphs):
    images = glyphs.X_test[10:13].reshape(3, 32, 32, 1)
    body = {
        "inputs": [
            {"name": "input", "shape": [3, 32, 32, 1], "datatype": "FP64", "data": images.tolist()}
        ]
    }
    response = httpx.post(f"{bof_live_server}/v2/models/glyphs/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    expected = bof_fit.predictor.decision_function(glyphs.X_test[10:13])
    labels = outputs["label"]["data"]
    assert labels == [bof_fit.predictor.classes[int(i)] for i in expected.argmax(axis=1)]
    scores = np.asarray(outputs["scores"]["data"]).reshape(outputs["scores"]["shape"])
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-12)


def test_model_description_names_the_bof_transform(bof_live_server):
    info = httpx.get(f"{bof_live_server}/v1/models").json()["models"][0]
    bof = "bof(patch=8, step=4, words=24, levels=1, single=0)"
    assert [m["transform"] for m in info["measures"]] == [bof, "pixels"]


def test_values_too_large_for_the_transform_are_a_422(bof_live_server, glyphs):
    image = glyphs.X_test[0].reshape(32, 32).copy()
    image[::3, ::3] = 1e300
    response = httpx.post(f"{bof_live_server}/classify", json={"instances": [image.tolist()]})
    assert response.status_code == 422
    assert "too large for the transform bof" in response.json()["error"]["message"]
