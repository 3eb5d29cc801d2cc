"""The predictor against an independent scikit-learn pipeline, and its top-k and batch logic."""

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC

from service.model import BasisExpansion, BatchTooLargeError, InputNormalizer, InvalidInputError
from training.datasets import Dataset
from training.fit import FitConfig, fit_besvm


def test_default_model_reaches_the_accuracy_target_on_digits(digits_fit, digits):
    accuracy = (digits_fit.predictor.predict(digits.X_test) == digits.y_test).mean()
    assert accuracy >= 0.94


def test_scores_equal_a_scikit_learn_pipeline_of_the_same_steps(digits_fit, digits):
    pipeline = make_pipeline(
        InputNormalizer(),
        BasisExpansion("rbf(gamma=1)", n_basis_per_class=25),
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
        BasisExpansion(n_basis_per_class=10),
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
    for (label, ranked), row in zip(answers, scores, strict=True):
        assert label == digits_predictor.classes[int(row.argmax())]
        assert [c for c, _ in ranked] == [digits_predictor.classes[i] for i in np.argsort(-row)[:2]]
        assert ranked[0][1] == pytest.approx(row.max())


def test_classify_refuses_a_batch_over_the_limit(digits_predictor, digits):
    with pytest.raises(BatchTooLargeError, match="limit is 2"):
        digits_predictor.classify(digits.X_test[:3].reshape(3, 8, 8), top_k=1, max_batch_size=2)


def test_flat_inputs_of_the_wrong_width_are_refused(digits_predictor):
    with pytest.raises(InvalidInputError, match=r"\(n, 64\)"):
        digits_predictor.decision_function(np.zeros((2, 63)))
