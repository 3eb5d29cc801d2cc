"""Basis selection: class balance of every strategy, and kernel k-medoids against brute force."""

import itertools

import numpy as np
import pytest

from training.estimator.basis import BASIS_STRATEGIES, kernel_distances, kmedoids, select_basis
from training.estimator.expansion import BasisExpansion


def _linear_blocks(X):
    return lambda rows: (X[rows] @ X[rows].T)[None]


@pytest.mark.parametrize("strategy", BASIS_STRATEGIES)
def test_every_strategy_is_class_balanced_and_within_each_class(strategy):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, 3))
    y = np.array(["a"] * 30 + ["b"] * 35 + ["c"] * 5)
    indices = select_basis(y, 70, 8, strategy, random_state=1, similarity=_linear_blocks(X))
    labels = y[indices]
    assert [int((labels == c).sum()) for c in "abc"] == [8, 8, 5]
    assert len(set(indices.tolist())) == len(indices)
    again = select_basis(y, 70, 8, strategy, random_state=1, similarity=_linear_blocks(X))
    np.testing.assert_array_equal(indices, again)


def test_kmedoids_needs_the_similarity():
    with pytest.raises(ValueError, match="similarity"):
        select_basis(np.zeros(10), 10, 2, "kmedoids")


def test_kernel_distances_of_a_linear_kernel_are_squared_euclidean():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(12, 4))
    squared = ((X[:, None, :] - X[None, :, :]) ** 2).sum(axis=2)
    np.testing.assert_allclose(
        kernel_distances((X @ X.T)[None]), squared / squared.mean(), atol=1e-12
    )


def _cost(distances, medoids):
    return distances[:, medoids].min(axis=1).sum()


def test_kmedoids_finds_the_optimum_of_small_problems():
    rng = np.random.default_rng(4)
    for trial in range(10):
        X = rng.normal(size=(12, 2))
        distances = np.sqrt(((X[:, None] - X[None]) ** 2).sum(axis=2))
        best = min(_cost(distances, list(c)) for c in itertools.combinations(range(12), 3))
        found = kmedoids(distances, 3, np.random.default_rng(trial))
        # Alternation is a local method; the best of several starts lands at or near the optimum.
        assert _cost(distances, found) <= 1.05 * best


def test_kmedoids_picks_one_medoid_per_cluster():
    rng = np.random.default_rng(6)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + 0.1 * rng.normal(size=(15, 2)) for c in centres])
    y = np.zeros(45)
    expansion = BasisExpansion(
        "linear", n_basis_per_class=3, basis_strategy="kmedoids", random_state=0
    ).fit(X, y)
    clusters = sorted(int(i) // 15 for i in expansion.basis_indices_)
    assert clusters == [0, 1, 2]


def test_kmedoids_handles_duplicates_and_k_equal_to_n():
    distances = np.zeros((4, 4))
    medoids = kmedoids(distances, 2, np.random.default_rng(0))
    assert len(set(medoids.tolist())) == 2
    np.testing.assert_array_equal(kmedoids(distances, 4, np.random.default_rng(0)), np.arange(4))
