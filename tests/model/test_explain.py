"""Explanations: each basis item's contribution to a class's score, exact for every measure
kind and normalisation, against the features computed the unfolded way (normalise, project,
then the SVM's weights), and the one-batch answers of several requests."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from service.model import InvalidInputError, Predictor, scoring, threads
from service.model.answers import ClassifyCall
from service.model.features import NORMALIZATIONS, expand
from service.model.inputs.spec import InputSpec
from training import BasisExpandingSVC
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


def _scored_in_blocks(monkeypatch, rows: int) -> list[int]:
    """Blocks of ``rows`` rows whatever their width; the sizes of the blocks scored, in order."""
    monkeypatch.setattr(scoring, "SCORES_BLOCK_ROWS", rows)
    monkeypatch.setattr(scoring, "SCORES_BLOCK_MAX_BYTES", sys.maxsize)
    sizes, computed = [], scoring.raw_similarities

    def counted(items, basis, measures, out=None):
        sizes.append(len(items))
        return computed(items, basis, measures, out)

    monkeypatch.setattr(scoring, "raw_similarities", counted)
    return sizes


@pytest.mark.parametrize("measure", ["rbf", "several"])
def test_a_batch_scored_in_blocks_of_rows_has_the_unfolded_scores(
    dense_dataset, measure, monkeypatch
):
    """A batch wider than a block is scored block by block (12 items in blocks of 5, 5 and
    2), to the scores computed the unfolded way, in predictions and in the batched answers that
    ask for no explanation."""
    fit = fit_dataset(dense_dataset, "squares", similarity=MEASURES[measure], basis_per_class=4)
    predictor, X = fit.predictor, dense_dataset.X_test
    _, reference = _reference(predictor, predictor.inputs.prepare(predictor.inputs.batch(X)))
    sizes = _scored_in_blocks(monkeypatch, 5)
    assert np.allclose(predictor.decision_function(X), reference, rtol=0, atol=TOLERANCE)
    assert sizes == [5, 5, 2]
    images = X.reshape(-1, 6, 6).tolist()
    (answers,) = predictor.classify_many([ClassifyCall(instances=images, top_k=1)])
    assert np.allclose([a.scores for a in answers], reference, rtol=0, atol=TOLERANCE)
    assert sizes == [5, 5, 2] * 2


@pytest.fixture(scope="module")
def every_item_model():
    """200 breast cancer items, every one of them the basis of a kernel's own map."""
    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:200], y[:200]
    model = BasisExpandingSVC(
        similarity="rbf(gamma=0.25)", input_normalization="per-feature",
        normalization="nystroem(clip)", C=10.0, basis_per_class=200,
    ).fit(X, y)  # fmt: skip
    return model.predictor_, X, y


def test_a_kernel_map_on_every_item_scores_from_its_support_vectors(every_item_model, monkeypatch):
    """Every training item the basis under nystroem(clip): the folded weights are the kernel
    SVM's dual coefficients, zero but for rounding off its support vectors, which for the
    squared hinge are the items inside some class's margin (y f(x) < 1). The scores read those
    items only, and equal the unfolded ones; explanations still name every item."""
    predictor, X, y = every_item_model
    assert predictor.n_basis == 200
    bases = []
    computed = scoring.raw_similarities

    def counted(items, basis, measures, out=None):
        bases.append(basis)
        return computed(items, basis, measures, out)

    monkeypatch.setattr(scoring, "raw_similarities", counted)
    items = predictor.inputs.prepare(predictor.inputs.batch(X))
    _, reference = _reference(predictor, items)
    scores = predictor.decision_function(X)
    (read,) = bases
    assert len(read) < 100
    # What leaving the items out moved: their weights, at most 1e-9 of the largest each.
    assert np.allclose(scores, reference, rtol=0, atol=1e-7)
    signs = np.where(y[:, None].astype(str) == np.asarray(predictor.classes), 1.0, -1.0)
    inside = (signs * reference < 1 - 1e-6).any(axis=1)
    outside = (signs * reference > 1 + 1e-6).all(axis=1)
    assert (inside | outside).all()  # no item on a margin: every item is one or the other
    # The items read are the training items inside a margin, as prepared.
    assert {tuple(row) for row in read} == {tuple(row) for row in items[inside]}
    assert len(read) == inside.sum()
    (explanation,) = predictor.explain(X[:1], k=200)
    assert sorted(item.basis_index for item in explanation.items) == list(range(200))
    assert explanation.rest == pytest.approx(0.0, abs=1e-9)


def test_work_is_judged_light_by_the_items_the_scores_read(every_item_model, monkeypatch):
    """The data plane runs light work on the calling thread: scores read the support vectors
    only (fewer than 100 of 200 items), so a batch too heavy against every item is light
    against them; an explanation reads every item and is not."""
    predictor, X, _ = every_item_model
    read = []
    computed = scoring.raw_similarities

    def counted(items, basis, measures, out=None):
        read.append((len(basis), measures))
        return computed(items, basis, measures, out)

    monkeypatch.setattr(scoring, "raw_similarities", counted)
    predictor.decision_function(X[:1])
    ((in_use, (rbf,)),) = read
    # A batch between the two: light against the items in use, heavy against every item.
    limit = threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS / rbf.pair_work
    n_samples = int(limit / 200) + 1
    assert n_samples * in_use < limit <= n_samples * 200
    assert predictor.runs_serially(n_samples)
    assert not predictor.runs_serially(n_samples, explain=True)


def test_an_explanation_counts_the_measures_folded_into_weights_on_the_input():
    """A dense linear measure scores through one weight vector on the input (light at any
    batch), but an explanation computes its similarity to every basis item."""
    X, y = load_breast_cancer(return_X_y=True)
    model = BasisExpandingSVC(similarity="linear", normalization="besvm", basis_per_class=100).fit(
        X[:200], y[:200]
    )
    predictor = model.predictor_
    (linear,) = predictor.inputs.bind(predictor.specs)
    n_samples = int(threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS / linear.pair_work) + 1
    assert not linear.runs_serially(n_samples, predictor.n_basis)
    assert predictor.runs_serially(n_samples)
    assert not predictor.runs_serially(n_samples, explain=True)


def test_only_blocks_that_fit_the_bound_are_cut():
    """256 rows of 426 similarities (852 KiB) are a block; of 1,000 (2 MB) the batch is one."""

    def scorer(width: int) -> scoring.Scorer:
        return scoring.Scorer((), np.zeros((width, 2)), (), np.zeros(2))

    assert scorer(426).block_rows() == scoring.SCORES_BLOCK_ROWS == 256
    assert scorer(1000).block_rows() == sys.maxsize
    assert scoring.Scorer((), None, (), np.zeros(2)).block_rows() == sys.maxsize


def test_documents_scored_in_blocks_of_rows_have_the_unfolded_scores(text_dataset, monkeypatch):
    fit = fit_dataset(
        text_dataset, "topics", similarity="sensing0 + linear", basis_per_class=5, min_df=1
    )
    predictor = fit.predictor
    documents = predictor.encode_texts(list(text_dataset.X_test[:6]))
    _, reference = _reference(predictor, predictor.inputs.prepare(documents))
    sizes = _scored_in_blocks(monkeypatch, 4)
    assert np.allclose(predictor.decision_function(documents), reference, rtol=0, atol=TOLERANCE)
    assert sizes == [4, 2]


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
    assert [c for c, _ in plain.ranked] == [c for c, _ in answer.ranked]
    assert np.allclose([s for _, s in plain.ranked], [s for _, s in answer.ranked], atol=TOLERANCE)
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
