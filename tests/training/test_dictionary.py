"""US-SVM dictionary learning: the numba SGD against a plain numpy transcription of Algorithm 1,
the variants' constraints, pruning and transfer."""

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from training.retrieval.dictionary import UnionOfSubspacesSVM, prune_codes, sgd_epochs


@parametrize_with_checks([UnionOfSubspacesSVM(n_atoms=8, random_state=0)])
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def reference_sgd(D, X, Y, U, V, b, order, block, lz, t0z, ld, t0d, alpha, beta, r, mu, nonneg):
    """Algorithm 1 of the US-SVM paper in numpy, with the elastic-net gradient 2 beta (1-r) z."""
    D, U, V, b = D.copy(), U.copy(), V.copy(), b.copy()
    t = 0
    for start in range(0, len(order), block):
        rows = order[start : start + block]
        gram = D.T @ D
        for i in rows:
            x, y = X[i], Y[i]
            Z = U - V
            y_hat = np.where(y * ((D @ Z).T @ x + b) < 1, y, 0.0)
            lr = lz / (t + t0z)
            data = np.outer(D.T @ x, y_hat)
            smooth = alpha * gram @ Z + 2 * beta * (1 - r) * Z
            U = np.maximum(U - lr * (r * beta - data + smooth), 0.0)
            if not nonneg:
                V = np.maximum(V - lr * (r * beta + data - smooth), 0.0)
            b = b + mu * lr * y_hat
            t += 1
        if ld > 0:
            Z = U - V
            for i in rows:
                x, y = X[i], Y[i]
                y_hat = np.where(y * ((D @ Z).T @ x + b) < 1, y, 0.0)
                lr = ld / (t + t0d)
                D = D - lr * (-np.outer(x, Z @ y_hat) + alpha * D @ Z @ Z.T)
                D = D / np.maximum(np.linalg.norm(D, axis=0), 1.0)
                t += 1
    return D, U, V, b


@pytest.mark.parametrize(
    ("alpha", "r", "nonnegative", "lambda_d"),
    [
        (0.0, 1.0, False, 0.5),  # US-SVM, the fast case
        (0.3, 1.0, False, 0.5),  # with the fourth-order term
        (0.0, 0.4, False, 0.5),  # US-SVM-E
        (0.0, 1.0, True, 0.5),  # US-SVM-N
        (0.2, 0.4, True, 0.5),  # US-SVM-NE
        (0.0, 1.0, False, 0.0),  # codes only: D fixed (transfer)
    ],
)
def test_sgd_equals_a_numpy_transcription_of_algorithm_1(alpha, r, nonnegative, lambda_d):
    rng = np.random.default_rng(0)
    d, A, K, n = 7, 5, 3, 40
    X = rng.normal(size=(n, d))
    Y = np.where(rng.integers(0, K, n)[:, None] == np.arange(K), 1.0, -1.0)
    D = rng.normal(size=(d, A))
    D /= np.linalg.norm(D, axis=0)
    U, V = np.abs(rng.normal(size=(A, K))) * 0.1, np.abs(rng.normal(size=(A, K))) * 0.1
    if nonnegative:
        V[:] = 0.0
    b = rng.normal(size=K) * 0.1
    order = np.concatenate([rng.permutation(n), rng.permutation(n)]).astype(np.int64)
    args = (order, 16, 2.0, 10.0, lambda_d, 20.0, alpha, 0.05, r, 0.3, nonnegative)
    expected = reference_sgd(D, X, Y, U, V, b, *args)
    D_got, U_got, V_got, b_got = D.copy(), U.copy(), V.copy(), b.copy()
    steps = sgd_epochs(D_got, X, Y, U_got, V_got, b_got, *args)
    assert steps == len(order) * (2 if lambda_d > 0 else 1)
    for got, want in zip((D_got, U_got, V_got, b_got), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert (np.linalg.norm(D_got, axis=0) <= 1.0 + 1e-12).all()
    if lambda_d == 0:
        np.testing.assert_array_equal(D_got, D)


def test_prune_keeps_the_largest_magnitudes_of_each_code():
    codes = np.array([[0.1, -3.0], [-2.0, 0.0], [0.5, 1.0], [0.0, -0.2]])
    np.testing.assert_array_equal(
        prune_codes(codes, 2), [[0.0, -3.0], [-2.0, 0.0], [0.5, 1.0], [0.0, 0.0]]
    )
    np.testing.assert_array_equal(prune_codes(codes, 0), 0.0)
    np.testing.assert_array_equal(prune_codes(codes, 10), codes)
    with pytest.raises(ValueError, match="n_nonzero"):
        prune_codes(codes, -1)


@pytest.fixture(scope="module")
def normalised_digits(digits):
    from training.estimator.preprocessing import InputNormalizer

    normalizer = InputNormalizer().fit(digits.X_train)
    return normalizer.transform(digits.X_train), normalizer.transform(digits.X_test)


def test_the_variants_learn_digits_within_their_constraints(digits, normalised_digits):
    X_train, X_test = normalised_digits
    for nonnegative in (False, True):
        model = UnionOfSubspacesSVM(
            n_atoms=32, nonnegative=nonnegative, n_epochs=5, random_state=0
        ).fit(X_train, digits.y_train)
        assert model.dictionary_.shape == (64, 32)
        assert model.codes_.shape == (32, 10)
        assert (np.linalg.norm(model.dictionary_, axis=0) <= 1.0 + 1e-12).all()
        if nonnegative:
            assert (model.codes_ >= 0).all()
        accuracy = (model.predict(X_test) == digits.y_test).mean()
        assert accuracy > 0.85  # ten classes, a quarter of the default epochs
        pruned = model.class_scores(X_test, n_nonzero=3)
        manual = X_test @ model.dictionary_ @ prune_codes(model.codes_, 3) + model.intercept_
        np.testing.assert_allclose(pruned, manual)


def test_transfer_learns_new_classes_on_a_fixed_dictionary(digits, normalised_digits):
    X_train, X_test = normalised_digits
    old = np.isin(digits.y_train, list("01234"))
    base = UnionOfSubspacesSVM(n_atoms=32, n_epochs=5, random_state=0)
    base.fit(X_train[old], digits.y_train[old])
    new = base.transfer(X_train[~old], digits.y_train[~old])
    np.testing.assert_array_equal(new.dictionary_, base.dictionary_)
    assert list(new.classes_) == list("56789")
    held = np.isin(digits.y_test, list("56789"))
    assert (new.predict(X_test[held]) == digits.y_test[held]).mean() > 0.7


def test_the_defaults_classify_digits_about_as_well_as_a_linear_svm(digits, normalised_digits):
    from sklearn.svm import LinearSVC

    X_train, X_test = normalised_digits
    model = UnionOfSubspacesSVM(random_state=0).fit(X_train, digits.y_train)
    accuracy = (model.predict(X_test) == digits.y_test).mean()
    svm = LinearSVC().fit(X_train, digits.y_train)
    assert accuracy > (svm.predict(X_test) == digits.y_test).mean() - 0.02  # 93.4% against 93.0%
    # Five atoms per class keep most of it.
    pruned = model.classes_[model.class_scores(X_test, n_nonzero=5).argmax(axis=1)]
    assert (pruned == digits.y_test).mean() > 0.85


def test_two_classes_get_one_code_each_and_scikit_learns_binary_scores():
    rng = np.random.default_rng(0)
    X = np.r_[rng.normal(size=(50, 4)) + 2.0, rng.normal(size=(50, 4)) - 2.0]
    y = np.repeat(["neg", "pos"], 50)
    model = UnionOfSubspacesSVM(n_atoms=4, random_state=0).fit(X, y)
    assert model.codes_.shape == (4, 2)
    scores = model.class_scores(X)
    assert scores.shape == (100, 2)
    np.testing.assert_array_equal(model.predict(X), model.classes_[scores.argmax(axis=1)])
    np.testing.assert_allclose(model.decision_function(X), scores[:, 1] - scores[:, 0])
    assert (model.predict(X) == y).mean() > 0.95
    with pytest.raises(ValueError, match="features"):
        model.decision_function(X[:, :3])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_atoms": 0}, "n_atoms"),
        ({"l1_ratio": 1.5}, "l1_ratio"),
        ({"beta": -1.0}, "beta"),
        ({"lambda_z": 0.0}, "lambda_z"),
    ],
)
def test_bad_parameters_are_refused_in_fit(params, message):
    X = np.random.default_rng(0).normal(size=(20, 3))
    with pytest.raises(ValueError, match=message):
        UnionOfSubspacesSVM(**params).fit(X, np.arange(20) % 2)
