"""mAP against sparsity: the metric against hand computations and scikit-learn, pruning, and the
US-SVM paper's comparison on real digits (US-SVM against the pruned l2-SVM and l1-SVM)."""

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from training.retrieval.evaluation import (
    BASELINES,
    US_SVM_VARIANTS,
    average_precisions,
    fit_baseline,
    map_against_sparsity,
    mean_average_precision,
    plot_map_against_sparsity,
    prune_weights,
)


def test_mean_average_precision_equals_a_hand_computation():
    y = np.array(["a", "b", "a", "b"])
    scores = np.array([[0.9, 0.2], [0.8, 0.7], [0.3, 0.4], [0.1, 0.6]])
    # "a" ranks a, b, a, b: AP = (1/1 + 2/3) / 2. "b" ranks its two items first: AP = 1.
    expected = ((1.0 + 2.0 / 3.0) / 2.0 + 1.0) / 2.0
    assert mean_average_precision(scores, y, np.array(["a", "b"])) == pytest.approx(expected)
    # The columns follow ``classes``: swapped classes, swapped columns.
    assert mean_average_precision(scores[:, ::-1], y, np.array(["b", "a"])) == pytest.approx(
        expected
    )


def test_tied_scores_are_one_threshold():
    # Two items tied at the top, one relevant: one step to recall 1 at precision 1/2.
    ap = average_precisions(np.array([[0.5], [0.5], [0.1]]), np.array([[False], [True], [False]]))
    assert ap[0] == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_average_precision_equals_scikit_learn_with_ties(seed):
    rng = np.random.default_rng(seed)
    classes = np.array(["x", "y", "z", "w"])
    y = rng.choice(classes[:3], size=200)  # "w" has no item: left out of the mean
    scores = np.round(rng.normal(size=(200, 4)), 1)  # rounding makes many ties
    scores[:, 1] = 0.0  # a column of ties only
    expected = np.mean(
        [average_precision_score(y == c, scores[:, k]) for k, c in enumerate(classes[:3])]
    )
    assert mean_average_precision(scores, y, classes) == pytest.approx(expected, rel=1e-12)
    assert np.isnan(average_precisions(scores, y[:, None] == classes[None, :])[3])


def test_mean_average_precision_refuses_bad_input():
    with pytest.raises(ValueError, match="shape"):
        mean_average_precision(np.zeros((3, 2)), np.array([0, 1, 0]), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="no class"):
        mean_average_precision(np.zeros((2, 1)), np.array([0, 0]), np.array([1]))


def test_prune_weights_keeps_the_largest_magnitudes_of_each_row():
    coef = np.array([[0.1, -3.0, 0.5, 0.0], [-2.0, 0.0, 1.0, -0.2]])
    np.testing.assert_array_equal(
        prune_weights(coef, 2), [[0.0, -3.0, 0.5, 0.0], [-2.0, 0.0, 1.0, 0.0]]
    )
    np.testing.assert_array_equal(prune_weights(coef, 1), [[0.0, -3.0, 0.0, 0.0], [-2, 0, 0, 0]])
    np.testing.assert_array_equal(prune_weights(coef, 0), 0.0)
    np.testing.assert_array_equal(prune_weights(coef, 9), coef)


@pytest.fixture(scope="module")
def digits_rows(digits):
    """The paper's comparison on digits: train on the training split's normalised inputs and
    search the test split."""
    from training.estimator.preprocessing import InputNormalizer

    normalizer = InputNormalizer().fit(digits.X_train)
    return map_against_sparsity(
        normalizer.transform(digits.X_train), digits.y_train,
        normalizer.transform(digits.X_test), digits.y_test,
    )  # fmt: skip


def test_us_svm_beats_the_pruned_svms_at_five_nonzeros_on_digits(digits_rows):
    at = {(row["method"], row["sparsity"]): row for row in digits_rows}
    for method in US_SVM_VARIANTS:
        assert at[(method, 5)]["map"] > max(at[(b, 5)]["map"] for b in BASELINES), method
    # The acceptance criterion of the issue, with a margin: several mAP points.
    assert at[("US-SVM", 5)]["map"] > max(at[(b, 5)]["map"] for b in BASELINES) + 0.05
    assert at[("US-SVM", 5)]["map"] > 0.9
    # Unpruned, the linear SVMs are the stronger rankers on dense inputs, but not by much.
    assert at[("US-SVM", None)]["map"] > at[("l2-SVM", None)]["map"] - 0.05


def test_the_rows_report_every_method_and_their_actual_sparsity(digits_rows):
    methods = [*US_SVM_VARIANTS, *BASELINES]
    assert list(dict.fromkeys(row["method"] for row in digits_rows)) == methods
    sparsities = [1, 2, 3, 5, 10, 20, None]
    assert [(r["method"], r["sparsity"]) for r in digits_rows] == [
        (m, s) for m in methods for s in sparsities
    ]
    for row in digits_rows:
        assert 0.0 < row["map"] <= 1.0
        if row["sparsity"] is not None:
            assert row["mean_nonzeros"] <= row["sparsity"]
    unpruned = {
        row["method"]: row["mean_nonzeros"] for row in digits_rows if row["sparsity"] is None
    }
    assert unpruned["l2-SVM"] > 20  # a dense weight vector over the 64 pixels


def test_map_against_sparsity_options_and_the_plot(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 6))
    y = np.repeat(np.array(["p", "q", "r"]), 30)
    X = centres[np.searchsorted(["p", "q", "r"], y)] + 0.3 * rng.normal(size=(90, 6))
    variants = {"only": {"n_epochs": 2, "n_atoms": 100}}
    rows = map_against_sparsity(
        X, y, X, y, sparsities=(1, 2), variants=variants, n_atoms=8, progress=True
    )
    assert [(r["method"], r["sparsity"]) for r in rows] == [
        (m, s) for m in ("only", *BASELINES) for s in (1, 2, None)
    ]
    assert rows[2]["mean_nonzeros"] <= 8  # n_atoms overrides the variant's
    with pytest.raises(ValueError, match="sparsities"):
        map_against_sparsity(X, y, X, y, sparsities=(-1,), variants=variants)
    path = tmp_path / "map.png"
    plot_map_against_sparsity(rows, path, "three blobs")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_classes_get_a_weight_row_each():
    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(size=(40, 5)) + 1.0, rng.normal(size=(40, 5)) - 1.0]
    y = np.repeat(np.array(["no", "yes"]), 40)
    coef, intercept, classes = fit_baseline("l2-SVM", X, y)
    assert coef.shape == (2, 5)
    np.testing.assert_array_equal(coef[0], -coef[1])
    np.testing.assert_array_equal(intercept[0], -intercept[1])
    assert list(classes) == ["no", "yes"]
    rows = map_against_sparsity(
        X, y, X, y, sparsities=(1,), variants={"US-SVM": {"n_epochs": 2}}, n_atoms=4
    )
    assert all(row["map"] > 0.9 for row in rows)
    with pytest.raises(ValueError, match="baseline"):
        fit_baseline("l3-SVM", X, y)
