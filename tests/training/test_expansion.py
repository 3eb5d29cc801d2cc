"""Input normalisation, basis selection and the basis expansion against direct numpy references."""

import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.utils.estimator_checks import parametrize_with_checks

from training.estimator.basis import select_basis
from training.estimator.expansion import BasisExpansion
from training.estimator.preprocessing import InputNormalizer


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(loc=3.0, scale=2.0, size=(60, 5))
    y = np.repeat(["a", "b", "c"], 20)
    return X, y


@parametrize_with_checks(
    [
        InputNormalizer(),
        BasisExpansion(n_basis_per_class=3),
        BasisExpansion(
            "rbf + linear", n_basis_per_class=3, basis_strategy="kmedoids", random_state=0
        ),
        BasisExpansion(n_basis_per_class=3, normalization="nystroem(flip)"),
        BasisExpansion(n_basis_per_class=3, normalization="zscore", basis_strategy="random"),
    ]
)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_input_normalizer_statistics_equal_direct_numpy(data):
    X, _ = data
    normalizer = InputNormalizer().fit(X)
    mean = X.mean(axis=0)
    scale = np.mean(np.sqrt(((X - mean) ** 2).sum(axis=1)))
    np.testing.assert_allclose(normalizer.mean_, mean, rtol=1e-13)
    assert normalizer.scale_ == pytest.approx(scale, rel=1e-13)
    X_hat = normalizer.transform(X)
    np.testing.assert_allclose(X_hat.mean(axis=0), 0.0, atol=1e-13)
    assert np.linalg.norm(X_hat, axis=1).mean() == pytest.approx(1.0, rel=1e-13)


def test_input_normalizer_of_constant_data_keeps_unit_scale():
    assert InputNormalizer().fit(np.ones((4, 3))).scale_ == 1.0


def test_besvm_statistics_equal_direct_numpy_for_each_measure(data):
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.1) + linear", n_basis_per_class=4)
    features = expansion.fit_transform(X, y)
    basis = X[expansion.basis_indices_]
    for m, raw in enumerate([rbf_kernel(X, basis, gamma=0.1), X @ basis.T]):
        mean = raw.mean(axis=0)
        scale = np.mean(np.sqrt(((raw - mean) ** 2).sum(axis=1)))
        block = slice(12 * m, 12 * (m + 1))
        np.testing.assert_allclose(expansion.offset_[block], mean, rtol=1e-12)
        np.testing.assert_allclose(expansion.scale_[block], scale, rtol=1e-12)
        np.testing.assert_allclose(features[:, block], (raw - mean) / scale, rtol=1e-10, atol=1e-12)
        # Each measure's block is centred with unit mean norm on the training set.
        assert np.linalg.norm(features[:, block], axis=1).mean() == pytest.approx(1.0)
    assert features.shape == (60, 24)
    np.testing.assert_allclose(expansion.transform(X), features, rtol=1e-12, atol=1e-12)


def test_no_normalization_gives_the_raw_kernel_map(data):
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.1)", n_basis_per_class=2, normalization="none")
    features = expansion.fit(X, y).transform(X[:7])
    np.testing.assert_allclose(features, rbf_kernel(X[:7], expansion.basis_, gamma=0.1), rtol=1e-10)


def test_transform_in_chunks_equals_one_pass(data):
    X, y = data
    one = BasisExpansion(n_basis_per_class=5).fit(X, y).transform(X)
    chunked = BasisExpansion(n_basis_per_class=5, chunk_size=7).fit(X, y).transform(X)
    # Chunks of 7 run the pair kernels, the whole set BLAS: equal up to rounding.
    np.testing.assert_allclose(one, chunked, rtol=1e-12, atol=1e-13)


def test_index_basis_is_class_balanced_evenly_spaced_and_deterministic():
    y = np.array(["b"] * 10 + ["a"] * 6 + ["b"] * 2)
    indices = select_basis(y, len(y), 3, "index")
    # classes in sorted order: "a" (rows 10..15), then "b" (rows 0..9, 16, 17)
    np.testing.assert_array_equal(indices, [10, 12, 14, 0, 4, 8])
    np.testing.assert_array_equal(indices, select_basis(y, len(y), 3, "index"))


def test_random_basis_is_seeded_and_class_balanced():
    y = np.repeat([0, 1, 2], 30)
    first = select_basis(y, 90, 5, "random", random_state=3)
    assert (np.bincount(y[first]) == 5).all()
    np.testing.assert_array_equal(first, select_basis(y, 90, 5, "random", random_state=3))
    assert not np.array_equal(first, select_basis(y, 90, 5, "random", random_state=4))


def test_a_small_class_gives_all_its_items():
    y = np.array([0] * 10 + [1] * 2)
    indices = select_basis(y, 12, 4, "index")
    assert sorted(indices[y[indices] == 1].tolist()) == [10, 11]
    assert len(indices) == 6


def test_without_labels_the_basis_spans_all_items():
    np.testing.assert_array_equal(select_basis(None, 10, 5, "index"), [0, 2, 4, 6, 8])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"similarities": "cosine"}, "unknown similarity"),
        ({"basis_strategy": "best"}, "basis_strategy"),
        ({"normalization": "l2"}, "normalization"),
        ({"n_basis_per_class": 0}, "n_basis_per_class"),
        ({"n_basis_per_class": 2.5}, "n_basis_per_class"),
    ],
)
def test_bad_parameters_are_refused_at_fit(data, params, message):
    X, y = data
    with pytest.raises(ValueError, match=message):
        BasisExpansion(**params).fit(X, y)


def test_transform_refuses_a_different_number_of_features(data):
    X, y = data
    expansion = BasisExpansion(n_basis_per_class=2).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        expansion.transform(X[:, :3])
