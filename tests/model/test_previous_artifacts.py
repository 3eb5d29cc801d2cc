"""Artifacts written by an earlier layout of the code load and answer as they did then."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.model import Predictor
from service.model.search import SearchIndex, SearchQuery

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "previous-layout"
EXPECTED = json.loads((PREVIOUS / "expected.json").read_text())


@pytest.fixture
def artifacts(tmp_path) -> Path:
    """A copy: loading must not need to write, but a test must never change the fixture."""
    copy = tmp_path / "previous-layout"
    shutil.copytree(PREVIOUS, copy)
    return copy


def test_dense_model_of_two_spaces_answers_as_before(artifacts):
    expected = EXPECTED["digits-v1"]
    predictor = Predictor.load(artifacts / "digits-v1")
    X = np.asarray(expected["instances"])
    scores = predictor.decision_function(X)
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-9, atol=1e-12)
    assert predictor.predict(X).tolist() == expected["labels"]


@pytest.mark.parametrize("name", ["default-v1", "wine-v1"])
def test_default_and_per_feature_models_answer_as_before(artifacts, name):
    """The default configuration (Nystroem, its projection folded into the weights at load)
    and a per-feature normalised model of two measures."""
    expected = EXPECTED[name]
    predictor = Predictor.load(artifacts / name)
    scores = predictor.decision_function(np.asarray(expected["instances"]))
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-9, atol=1e-12)


def test_search_model_and_catalogue_answer_as_before(artifacts):
    predictor = Predictor.load(artifacts / "digits-v1")
    index = SearchIndex.load(artifacts / "digits-v1", predictor)
    result = index.run(SearchQuery(class_label="7", top_k=5))
    expected = EXPECTED["digits-v1"]["search_class_7_top5"]
    assert [item for item, _ in result.items] == [item for item, _ in expected]
    np.testing.assert_allclose(
        [score for _, score in result.items], [score for _, score in expected], rtol=1e-6
    )


def test_text_model_answers_as_before(artifacts):
    expected = EXPECTED["text-v1"]
    predictor = Predictor.load(artifacts / "text-v1")
    scores = predictor.decision_function(predictor.encode_texts(expected["texts"]))
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-9, atol=1e-12)
