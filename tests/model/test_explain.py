"""Explanations: each basis item's contribution to a class's score, exact for every measure
kind and normalisation, against the features computed the unfolded way (normalise, project,
then the SVM's weights), and the one-batch answers of several requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.model import InvalidInputError, Predictor
from service.model.answers import ClassifyCall
from service.model.features import NORMALIZATIONS, expand
from service.model.inputs.spec import InputSpec
from training.data.datasets import Dataset
from training.fitting import fit_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "previous-layout"
# Contributions are summed in another order than the scores' product: a few ulps of the
# scores' magnitude (about 1).
TOLERANCE = 1e-9


def _images(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three classes of 6 x 6 grey images: a bright square in a class's corner, with noise."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for label, (row, column) in enumerate([(0, 0), (0, 3), (3, 0)]):
        for _ in range(n_per_class):
            image = rng.random((6, 6)) * 0.3
            image[row : row + 3, column : column + 3] += 1.0
            X.append(image.ravel())
            y.append(label)
    return np.asarray(X), np.asarray(y)


def _dense_dataset() -> Dataset:
    X_train, y_train = _images(12, 0)
    X_test, y_test = _images(4, 1)
    return Dataset("squares", InputSpec("grid", (6, 6, 1)), X_train, y_train, X_test, y_test)


MEASURES = {
    "linear": "linear",
    "rbf": "rbf(gamma=1)",
    "grid": "rigid(1)",
    "several": "rbf(gamma=0.5) + linear",
}


@pytest.fixture(scope="module")
def dense_dataset() -> Dataset:
    return _dense_dataset()


def _reference(predictor: Predictor, items) -> tuple[np.ndarray, np.ndarray]:
    """Each basis item's contribution to each class, shape (n, K, M, B), and the scores, the
    unfolded way: u = (raw - offset) / scale per feature, the features u P (Nystroem) or u,
    each class's score features . coef + intercept; item j of measure m adds u_mj (P_m w_m)_j."""
    measures = predictor.inputs.bind(predictor.specs)
    n_measures, n_basis = len(predictor.specs), predictor.n_basis
    affine = expand(
        items, predictor.inputs.basis_items, measures, predictor.feature_offset,
        predictor.feature_scale,
    )  # fmt: skip
    u = affine.reshape(len(affine), n_measures, n_basis)
    w = predictor.coef.reshape(len(predictor.classes), n_measures, n_basis)
    if predictor.feature_projection is not None:
        w = np.einsum("mij,kmj->kmi", predictor.feature_projection, w)  # P_m w_m
        features = np.einsum("nmi,mij->nmj", u, predictor.feature_projection)
    else:
        features = u
    scores = features.reshape(len(u), -1) @ predictor.coef.T + predictor.intercept
    return np.einsum("nmj,kmj->nkmj", u, w), scores


def _check_explanations(predictor: Predictor, X, items) -> None:
    contributions, scores = _reference(predictor, items)
    n_basis = predictor.n_basis
    explanations = predictor.explain(X, k=n_basis)
    assert np.allclose(predictor.decision_function(X), scores, rtol=0, atol=TOLERANCE)
    for i, explanation in enumerate(explanations):
        c = predictor.classes.index(explanation.label)
        assert c == int(np.argmax(scores[i]))
        assert explanation.score == pytest.approx(scores[i, c], abs=TOLERANCE)
        assert explanation.intercept == predictor.intercept[c]
        # Every item named once; with the intercept they make the score, and the shares 1.
        assert sorted(item.basis_index for item in explanation.items) == list(range(n_basis))
        total = sum(item.contribution for item in explanation.items)
        assert explanation.rest == pytest.approx(0.0, abs=TOLERANCE)
        assert explanation.intercept + total == pytest.approx(scores[i, c], abs=TOLERANCE)
        assert sum(item.share for item in explanation.items) == pytest.approx(1.0, abs=1e-6)
        values = [item.contribution for item in explanation.items]
        assert values == sorted(values, reverse=True)
        for item in explanation.items:
            expected = contributions[i, c, :, item.basis_index]
            assert np.allclose(item.measures, expected, rtol=0, atol=TOLERANCE)
            assert item.contribution == pytest.approx(expected.sum(), abs=TOLERANCE)
            assert item.label == predictor.classes[predictor.basis_labels[item.basis_index]]
        # The top k are the k largest, and the rest is what the others add.
        top = predictor.explain(X[i : i + 1], k=3)[0]
        assert [item.basis_index for item in top.items] == [
            item.basis_index for item in explanation.items[:3]
        ]
        assert top.intercept + sum(t.contribution for t in top.items) + top.rest == pytest.approx(
            scores[i, c], abs=TOLERANCE
        )


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("measure", list(MEASURES))
def test_contributions_add_up_to_the_score_on_dense_measures(dense_dataset, measure, normalization):
    fit = fit_dataset(
        dense_dataset, "squares", similarity=MEASURES[measure], basis_per_class=4,
        normalization=normalization,
    )  # fmt: skip
    predictor = fit.predictor
    X = dense_dataset.X_test
    _check_explanations(predictor, X, predictor.inputs.prepare(predictor.inputs.batch(X)))
    # Ids are the training rows the basis was drawn from.
    assert predictor.basis_ids is not None
    rows = dense_dataset.X_train[predictor.basis_ids]
    basis = predictor.inputs.prepare(predictor.inputs.batch(rows))
    assert np.allclose(basis, predictor.inputs.basis_items)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("measure", ["sensing1(n=150)", "sensing0 + linear"])
def test_contributions_add_up_to_the_score_on_document_measures(
    text_dataset, measure, normalization
):
    fit = fit_dataset(
        text_dataset, "topics", similarity=measure, basis_per_class=5, min_df=1,
        normalization=normalization,
    )  # fmt: skip
    predictor = fit.predictor
    documents = predictor.encode_texts(list(text_dataset.X_test[:6]))
    _check_explanations(predictor, documents, predictor.inputs.prepare(documents))


def test_artifacts_without_ids_explain_by_index(tmp_path, dense_dataset):
    predictor = Predictor.load(FIXTURES / "wine-v1")
    assert predictor.basis_ids is None
    X = np.random.default_rng(0).normal(size=(2, predictor.input_spec.n_features))
    explanation = predictor.explain(X, k=2)[0]
    assert [item.id for item in explanation.items] == [None, None]
    # An artifact written with ids keeps them, and one without them loads as before.
    fit = fit_dataset(dense_dataset, "squares", similarity="rbf", basis_per_class=2)
    fit.predictor.save(tmp_path / "with-ids")
    loaded = Predictor.load(tmp_path / "with-ids")
    assert loaded.basis_ids.tolist() == fit.predictor.basis_ids.tolist()


def test_explain_in_classify_names_ids_and_refuses_a_negative_count(digits_predictor, digits):
    instance = digits.X_test[0].reshape(8, 8).tolist()
    (answer,) = digits_predictor.classify([instance], 3, explain=4)
    explanation = answer.explanation
    assert explanation.label == answer.label
    assert explanation.score == answer.ranked[0][1]
    assert len(explanation.items) == 4
    ids = digits_predictor.basis_ids
    assert [item.id for item in explanation.items] == [
        int(ids[item.basis_index]) for item in explanation.items
    ]
    (plain,) = digits_predictor.classify([instance], 3)
    assert plain.explanation is None
    assert plain.ranked == answer.ranked
    with pytest.raises(InvalidInputError, match="explain"):
        digits_predictor.classify([instance], 3, explain=-1)


def test_one_batch_of_several_requests_answers_each_as_alone(digits_predictor, digits):
    images = digits.X_test[:7].reshape(7, 8, 8)
    calls = [
        ClassifyCall(instances=images[:3].tolist(), top_k=2),
        ClassifyCall(instances=[[[1.0, 2.0]]], top_k=3),  # malformed: fails alone
        ClassifyCall(instances=images[3:4].tolist(), top_k=5, explain=3),
        ClassifyCall(instances=images[4:7].tolist(), top_k=0),  # top_k < 1: fails alone
    ]
    outcomes = digits_predictor.classify_many(calls)
    assert isinstance(outcomes[1], InvalidInputError)
    assert isinstance(outcomes[3], InvalidInputError)
    for call, outcome in zip(calls[::2], outcomes[::2], strict=True):
        alone = digits_predictor.classify(call.instances, call.top_k, explain=call.explain)
        assert [a.label for a in outcome] == [a.label for a in alone]
        for together, single in zip(outcome, alone, strict=True):
            assert np.allclose(together.scores, single.scores, rtol=0, atol=TOLERANCE)
            assert [c for c, _ in together.ranked] == [c for c, _ in single.ranked]
            if call.explain:
                assert [i.basis_index for i in together.explanation.items] == [
                    i.basis_index for i in single.explanation.items
                ]
