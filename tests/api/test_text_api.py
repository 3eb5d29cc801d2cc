"""/classify on a bag-of-words model through a real server: texts, sparse counts, empty
documents, and every malformed request answered with a 422 that says what was wrong."""

import httpx
import numpy as np
import pytest


def test_texts_and_counts_are_answered_alike(text_live_server, text_fit):
    predictor = text_fit.predictor
    texts = ["The rocket left orbit for the moon.", "A court, a judge and a jury."]
    by_text = httpx.post(f"{text_live_server}/classify", json={"texts": texts, "top_k": 2})
    assert by_text.status_code == 200, by_text.text
    counts = predictor.vocabulary.encode(texts)
    instances = [
        {"indices": counts.getrow(i).indices.tolist(), "counts": counts.getrow(i).data.tolist()}
        for i in range(len(texts))
    ]
    by_counts = httpx.post(
        f"{text_live_server}/classify", json={"instances": instances, "top_k": 2}
    )
    assert by_counts.status_code == 200, by_counts.text
    assert by_text.json()["predictions"] == by_counts.json()["predictions"]
    predictions = by_text.json()["predictions"]
    assert [p["label"] for p in predictions] == ["space", "law"]
    expected = predictor.decision_function(texts)
    for prediction, row in zip(predictions, expected, strict=True):
        assert prediction["top_k"][0]["score"] == pytest.approx(float(row.max()), rel=1e-9)
    assert [p["known_words"] for p in predictions] == counts.sum(axis=1).A1.astype(int).tolist()


def test_a_text_with_no_known_word_is_still_answered(text_live_server):
    response = httpx.post(
        f"{text_live_server}/classify", json={"texts": ["", "qwerty uiop"], "top_k": 3}
    )
    assert response.status_code == 200, response.text
    first, second = response.json()["predictions"]
    assert first["known_words"] == second["known_words"] == 0
    assert first == second


def test_model_info_describes_the_vocabulary(text_live_server, text_fit):
    info = httpx.get(f"{text_live_server}/v1/models").json()["models"][0]
    size = text_fit.predictor.vocabulary.size
    assert info["input"] == {
        "kind": "counts",
        "shape": [size],
        "spec": f"counts({size})",
        "accepts_texts": True,
    }
    assert info["vocabulary"]["size"] == size
    assert info["vocabulary"]["lowercase"] is True
    assert info["similarities"] == ["sensing1(n=150)", "linear"]
    assert set(info["diagnostics"]) == {"sensing1(n=150)", "linear"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"texts": ["a"], "instances": [{"indices": [], "counts": []}]},
            "either instances or texts",
        ),
        ({"top_k": 2}, "either instances or texts"),
        ({"texts": []}, "the batch is empty"),
        ({"texts": ["fine", 7]}, "string"),
        ({"instances": [{"indices": [10**6], "counts": [1]}]}, "word index 1000000"),
        ({"instances": [{"indices": [0], "counts": [-1]}]}, "non-negative whole number"),
        ({"instances": [{"indices": [0, 1], "counts": [1]}]}, "2 indices but 1 counts"),
        ({"instances": [[0, 1, 2]]}, "exactly the keys indices and counts"),
        ({"texts": ["ok"], "top_k": 0}, "top_k must be at least 1"),
    ],
)
def test_malformed_text_requests_get_a_422_saying_why(text_live_server, body, message):
    response = httpx.post(f"{text_live_server}/classify", json=body)
    assert response.status_code == 422, response.text
    assert message in response.text


def test_texts_sent_to_an_image_model_are_refused(live_server):
    response = httpx.post(f"{live_server}/classify", json={"texts": ["seven"]})
    assert response.status_code == 422
    assert "not text: send instances" in response.json()["error"]["message"]


def test_the_text_batch_limit_applies(text_live_server):
    response = httpx.post(f"{text_live_server}/classify", json={"texts": ["moon"] * 51})
    assert response.status_code == 413
    assert "limit is 50" in response.json()["error"]["message"]


def test_a_long_document_is_answered(text_live_server):
    words = np.random.default_rng(0).choice(["moon", "star", "judge", "bread"], size=20_000)
    response = httpx.post(f"{text_live_server}/classify", json={"texts": [" ".join(words)]})
    assert response.status_code == 200
    assert response.json()["predictions"][0]["known_words"] == 20_000


def test_the_vocabulary_is_served_in_index_order(text_live_server, text_fit, live_server):
    vocabulary = text_fit.predictor.vocabulary
    body = httpx.get(f"{text_live_server}/v1/models/topics/vocabulary").json()
    assert body["terms"] == list(vocabulary.terms)
    assert body["size"] == vocabulary.size
    # A client can count words itself with it and send sparse counts.
    index = {term: i for i, term in enumerate(body["terms"])}
    counts = {index["moon"]: 2, index["rocket"]: 1}
    response = httpx.post(
        f"{text_live_server}/classify",
        json={"instances": [{"indices": list(counts), "counts": list(counts.values())}]},
    )
    assert response.json()["predictions"][0]["label"] == "space"
    missing = httpx.get(f"{text_live_server}/v1/models/other/vocabulary")
    assert missing.status_code == 404
    image = httpx.get(f"{live_server}/v1/models/digits/vocabulary")
    assert image.status_code == 404
    assert "has no vocabulary" in image.json()["error"]["message"]
