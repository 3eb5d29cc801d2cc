"""The main path through a real uvicorn server process: training -> artifact -> HTTP."""

import httpx
import numpy as np
import pytest


def test_health_and_readiness(live_server):
    assert httpx.get(f"{live_server}/healthz").json() == {"status": "ok", "detail": None}
    ready = httpx.get(f"{live_server}/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


def test_http_scores_equal_the_in_process_predictor(live_server, digits_predictor, digits):
    images = digits.X_test[:40].reshape(40, 8, 8)
    response = httpx.post(
        f"{live_server}/classify", json={"instances": images.tolist(), "top_k": 10}, timeout=30
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "digits"
    expected = digits_predictor.decision_function(digits.X_test[:40])
    for prediction, row in zip(body["predictions"], expected, strict=True):
        by_label = {entry["label"]: entry["score"] for entry in prediction["top_k"]}
        served = np.array([by_label[c] for c in digits_predictor.classes])
        np.testing.assert_allclose(served, row, rtol=1e-12, atol=1e-12)
        assert prediction["label"] == digits_predictor.classes[int(row.argmax())]
    labels = [p["label"] for p in body["predictions"]]
    assert np.mean(np.array(labels) == digits.y_test[:40]) > 0.9


def test_model_metadata(live_server, digits_predictor):
    body = httpx.get(f"{live_server}/v1/models").json()
    (model,) = body["models"]
    assert model["name"] == "digits"
    assert model["classes"] == [str(d) for d in range(10)]
    assert model["input"] == {
        "kind": "grid",
        "shape": [8, 8, 1],
        "spec": "grid(8, 8, 1)",
        "accepts_texts": False,
    }
    assert model["vocabulary"] is None
    assert model["transform"] == "pixels"
    assert model["similarities"] == digits_predictor.similarity_names
    assert model["normalization"] == digits_predictor.normalization
    assert model["basis_size"] == digits_predictor.n_basis == 250
    for name in digits_predictor.similarity_names:
        assert 0.0 <= model["diagnostics"][name]["ngrat"] < 1.0
    assert model["created"].endswith("Z")
    one = httpx.get(f"{live_server}/v1/models/digits").json()
    assert one == model


def test_batch_limit_from_the_environment(live_server, digits):
    images = digits.X_test[:51].reshape(51, 8, 8).tolist()
    response = httpx.post(f"{live_server}/classify", json={"instances": images})
    assert response.status_code == 413
    assert "limit is 50" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/docs", "/openapi.json"])
def test_docs_are_served(live_server, path):
    assert httpx.get(f"{live_server}{path}").status_code == 200
