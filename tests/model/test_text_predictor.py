"""Bag-of-words models end to end: fit on texts, predict from texts, counts or CSR alike, the
artifact round trip, empty documents, and the intercept folding of sparse training."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.svm import LinearSVC

from service.model import ArtifactIntegrityError, InvalidInputError, Predictor
from service.model.inputs.spec import InputSpec
from training.estimator.solver import training_design


def test_a_text_model_learns_the_topics(text_fit, text_dataset):
    predictor = text_fit.predictor
    assert predictor.input_spec == InputSpec("counts", (predictor.vocabulary.size,))
    assert predictor.normalization == "besvm"  # sensing1 is indefinite
    accuracy = (predictor.predict(text_dataset.X_test) == text_dataset.y_test).mean()
    assert accuracy > 0.9


def test_texts_counts_and_csr_give_the_same_scores(text_fit, text_dataset):
    predictor = text_fit.predictor
    texts = list(text_dataset.X_test[:6])
    counts = predictor.vocabulary.encode(texts)
    pairs = [
        {"indices": counts.getrow(i).indices.tolist(), "counts": counts.getrow(i).data.tolist()}
        for i in range(len(texts))
    ]
    from_texts = predictor.decision_function(texts)
    np.testing.assert_array_equal(predictor.decision_function(counts), from_texts)
    np.testing.assert_array_equal(
        predictor.decision_function(predictor.validate(pairs)), from_texts
    )
    by_text = predictor.classify(texts=texts, top_k=2)
    by_counts = predictor.classify(pairs, top_k=2)
    assert by_text == by_counts
    assert [a.known_words for a in by_text] == counts.sum(axis=1).A1.astype(int).tolist()


def test_a_text_with_no_known_word_is_answered_as_an_empty_document(text_fit):
    predictor = text_fit.predictor
    answers = predictor.classify(texts=["", "zzz qqq xyzzy", "The of."], top_k=3)
    assert [a.known_words for a in answers[:2]] == [0, 0]
    assert answers[0] == answers[1]
    empty = predictor.decision_function(sp.csr_matrix((1, predictor.input_spec.shape[0])))
    assert answers[0].ranked[0][1] == pytest.approx(float(empty.max()))


def test_text_requests_are_checked(text_fit, digits_predictor):
    predictor = text_fit.predictor
    with pytest.raises(InvalidInputError, match="either instances or texts"):
        predictor.classify([{"indices": [], "counts": []}], texts=["x"])
    with pytest.raises(InvalidInputError, match="either instances or texts"):
        predictor.classify()
    with pytest.raises(InvalidInputError, match="the batch is empty"):
        predictor.classify(texts=[])
    with pytest.raises(InvalidInputError, match="word index"):
        predictor.classify([{"indices": [predictor.input_spec.shape[0]], "counts": [1]}])
    with pytest.raises(InvalidInputError, match="not text: send instances"):
        digits_predictor.classify(texts=["a seven"])


def test_the_artifact_round_trip_is_exact_and_plain_data(text_fit, text_dataset, tmp_path):
    predictor = text_fit.predictor
    path = predictor.save(tmp_path / "topics")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["input"] == {"kind": "counts", "shape": [predictor.vocabulary.size]}
    assert manifest["vocabulary"]["size"] == predictor.vocabulary.size
    assert "basis" not in manifest["arrays"]
    assert "input_mean" not in manifest["arrays"]
    vocabulary = np.load(path / manifest["arrays"]["vocabulary"]["file"], allow_pickle=False)
    assert vocabulary.dtype.kind == "U"
    loaded = Predictor.load(path)
    assert loaded.vocabulary.terms == predictor.vocabulary.terms
    np.testing.assert_array_equal(
        loaded.decision_function(text_dataset.X_test),
        predictor.decision_function(text_dataset.X_test),
    )


def test_a_tampered_document_basis_is_refused(text_fit, tmp_path):
    path = text_fit.predictor.save(tmp_path / "topics")
    manifest = json.loads((path / "manifest.json").read_text())
    indptr_file = path / manifest["arrays"]["basis_indptr"]["file"]
    indptr = np.load(indptr_file)
    indptr[-1] += 1
    np.save(indptr_file, indptr)
    with pytest.raises(ArtifactIntegrityError):
        Predictor.load(path)


def test_sparse_training_folds_the_shift_into_the_intercept_exactly():
    rng = np.random.default_rng(0)
    features = np.where(rng.random((300, 40)) < 0.1, rng.normal(size=(300, 40)), 0.0) + 0.5
    y = (features[:, :5].sum(axis=1) > 2.6).astype(int) + (features[:, 5] > 0.6)
    design, shift, columns = training_design(features.copy())
    assert sp.issparse(design)
    assert columns is None
    np.testing.assert_array_equal(shift, 0.5)
    svm = LinearSVC(dual="auto", max_iter=10_000).fit(design, y)
    folded = svm.intercept_ - svm.coef_ @ shift
    np.testing.assert_allclose(
        features @ svm.coef_.T + folded, svm.decision_function(design), rtol=1e-10, atol=1e-10
    )
    features = np.random.default_rng(1).normal(size=(50, 4))
    dense, no_shift, every_column = training_design(features.copy())
    assert every_column is None
    np.testing.assert_array_equal(dense, features)  # dense features are trained on as they are
    np.testing.assert_array_equal(no_shift, 0.0)
