"""The predictor against an independent scikit-learn pipeline, and its top-k and batch logic."""

import dataclasses

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.svm import SVC, LinearSVC

from service.model import (
    ArtifactIntegrityError,
    BasisExpansion,
    BatchTooLargeError,
    InputNormalizer,
    InputSpec,
    InvalidInputError,
    Predictor,
    parse_specs,
)
from service.model.transforms import InputTransform
from training.datasets import Dataset
from training.fit import FitConfig, fit_besvm


def test_default_model_is_at_least_as_accurate_as_a_kernel_svm_on_digits(digits_fit, digits):
    normalizer = InputNormalizer().fit(digits.X_train)
    svc = SVC(kernel="rbf", gamma=1.0, C=1.0).fit(
        normalizer.transform(digits.X_train), digits.y_train
    )
    svc_accuracy = (svc.predict(normalizer.transform(digits.X_test)) == digits.y_test).mean()
    accuracy = (digits_fit.predictor.predict(digits.X_test) == digits.y_test).mean()
    assert svc_accuracy == pytest.approx(0.966, abs=0.002)
    assert accuracy >= svc_accuracy


def test_scores_equal_a_scikit_learn_pipeline_of_the_same_steps(digits_fit, digits):
    pipeline = make_pipeline(
        InputNormalizer(),
        BasisExpansion("rbf(gamma=1)", n_basis_per_class=25, normalization="nystroem(square)"),
        LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0),
    ).fit(digits.X_train, digits.y_train)
    expected = pipeline.decision_function(digits.X_test)
    actual = digits_fit.predictor.decision_function(digits.X_test)
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(
        digits_fit.predictor.predict(digits.X_test), pipeline.predict(digits.X_test)
    )


def test_two_classes_score_and_predict_like_linear_svc(digits):
    keep_train = np.isin(digits.y_train, ["3", "8"])
    keep_test = np.isin(digits.y_test, ["3", "8"])
    binary = Dataset(
        "3-vs-8",
        digits.input_spec,
        digits.X_train[keep_train],
        digits.y_train[keep_train],
        digits.X_test[keep_test],
        digits.y_test[keep_test],
    )
    predictor = fit_besvm(binary, FitConfig(basis_per_class=10), name="b").predictor
    assert predictor.classes == ("3", "8")
    pipeline = make_pipeline(
        InputNormalizer(),
        BasisExpansion(n_basis_per_class=10, normalization="nystroem(square)"),
        LinearSVC(dual="auto", max_iter=10_000, random_state=0),
    ).fit(binary.X_train, binary.y_train)
    scores = predictor.decision_function(binary.X_test)
    np.testing.assert_allclose(scores[:, 1], pipeline.decision_function(binary.X_test), rtol=1e-9)
    np.testing.assert_allclose(scores[:, 0], -scores[:, 1])
    np.testing.assert_array_equal(predictor.predict(binary.X_test), pipeline.predict(binary.X_test))


def test_top_k_is_sorted_best_first_and_clipped(digits_predictor, digits):
    scores = digits_predictor.decision_function(digits.X_test[:50])
    order, top = digits_predictor.top_k(scores, 3)
    np.testing.assert_array_equal(order, np.argsort(-scores, axis=1)[:, :3])
    np.testing.assert_array_equal(top, np.sort(scores, axis=1)[:, ::-1][:, :3])
    order, _ = digits_predictor.top_k(scores, 100)
    assert order.shape == (50, 10)
    with pytest.raises(InvalidInputError):
        digits_predictor.top_k(scores, 0)


def test_classify_answers_labels_and_ranked_scores(digits_predictor, digits):
    images = digits.X_test[:4].reshape(4, 8, 8).tolist()
    answers = digits_predictor.classify(images, top_k=2)
    scores = digits_predictor.decision_function(digits.X_test[:4])
    for answer, row in zip(answers, scores, strict=True):
        label, ranked = answer.label, answer.ranked
        assert answer.known_words is None
        assert label == digits_predictor.classes[int(row.argmax())]
        assert [c for c, _ in ranked] == [digits_predictor.classes[i] for i in np.argsort(-row)[:2]]
        assert ranked[0][1] == pytest.approx(row.max())


def test_classify_refuses_a_batch_over_the_limit(digits_predictor, digits):
    with pytest.raises(BatchTooLargeError, match="limit is 2"):
        digits_predictor.classify(digits.X_test[:3].reshape(3, 8, 8), top_k=1, max_batch_size=2)


def test_flat_inputs_of_the_wrong_width_are_refused(digits_predictor):
    with pytest.raises(InvalidInputError, match=r"\(n, 64\)"):
        digits_predictor.decision_function(np.zeros((2, 63)))


@pytest.fixture(scope="module")
def hog_nystroem_fit(digits):
    config = FitConfig(
        similarities="rbf(gamma=1) + rigid(1)",
        transform="hog(2, 6)",
        basis_per_class=4,
        normalization="nystroem(flip)",
    )
    return fit_besvm(digits, config, name="hog")


def test_transform_and_projection_score_like_the_steps_done_by_hand(hog_nystroem_fit, digits):
    from skimage.feature import hog

    def hog_cells(X):
        return np.stack(
            [
                hog(
                    image.reshape(8, 8),
                    orientations=6,
                    pixels_per_cell=(2, 2),
                    cells_per_block=(1, 1),
                    block_norm="L2-Hys",
                    feature_vector=False,
                ).ravel()
                for image in X
            ]
        )

    pipeline = make_pipeline(
        InputNormalizer(),
        BasisExpansion(
            "rbf(gamma=1) + rigid(1)",
            n_basis_per_class=4,
            normalization="nystroem(flip)",
            grid_shape=(4, 4, 6),
        ),
        LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0),
    ).fit(hog_cells(digits.X_train), digits.y_train)
    expected = pipeline.decision_function(hog_cells(digits.X_test[:50]))
    predictor = hog_nystroem_fit.predictor
    np.testing.assert_allclose(
        predictor.decision_function(digits.X_test[:50]), expected, rtol=1e-8, atol=1e-8
    )
    assert predictor.grid_shape == (4, 4, 6)
    assert predictor.feature_projection.shape == (2, 40, 40)


def test_transform_and_projection_survive_the_artifact(hog_nystroem_fit, digits, tmp_path):
    hog_nystroem_fit.predictor.save(tmp_path / "m")
    manifest = (tmp_path / "m" / "manifest.json").read_text()
    assert '"transform": "hog(cell_size=2, orientations=6)"' in manifest
    assert '"normalization": "nystroem(flip)"' in manifest
    loaded = Predictor.load(tmp_path / "m")
    assert loaded.transform == hog_nystroem_fit.predictor.transform
    np.testing.assert_array_equal(
        loaded.decision_function(digits.X_test[:20]),
        hog_nystroem_fit.predictor.decision_function(digits.X_test[:20]),
    )
    # Clients send raw 8x8 images, as for any digits model.
    answer = loaded.classify([digits.X_test[0].reshape(8, 8).tolist()], top_k=2)[0]
    assert answer.label == answer.ranked[0][0]


def test_a_projection_with_the_wrong_normalization_is_inconsistent(hog_nystroem_fit):
    with pytest.raises(ArtifactIntegrityError, match="feature_projection"):
        dataclasses.replace(hog_nystroem_fit.predictor, normalization="besvm")
    with pytest.raises(ArtifactIntegrityError, match="feature_projection"):
        dataclasses.replace(hog_nystroem_fit.predictor, feature_projection=None)


def test_a_grid_measure_without_a_grid_is_inconsistent(digits_fit):
    with pytest.raises(ArtifactIntegrityError, match="not a grid"):
        dataclasses.replace(
            digits_fit.predictor,
            input_spec=InputSpec("vector", (64,)),
            transform=InputTransform("none"),
            specs=parse_specs("rigid(1)"),
        )
