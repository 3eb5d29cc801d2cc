"""The sparse bag-of-words kernels against an independent dense numpy / scipy reference.

The reference evaluates every formula over all W words of dense count matrices: a word absent
from either document contributes exactly 0 there without any special case, so it checks the
kernels' shared-words-only walk over the postings independently.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln

from service.model.kernels import sparse as sk

# -- dense references -------------------------------------------------------------------------


def lgamma_overlaps(B, X):
    """sum_w [lnG(b_w + x_w + 1) - lnG(b_w + 1) - lnG(x_w + 1)], shape (n_samples, n_basis)."""
    b, x = B[None, :, :], X[:, None, :]
    return np.sum(gammaln(b + x + 1.0) - gammaln(b + 1.0) - gammaln(x + 1.0), axis=2)


def reference_sensing0(B, X):
    W = B.shape[1]
    totals_b, totals_x = B.sum(axis=1)[None, :], X.sum(axis=1)[:, None]
    totals = gammaln(totals_b + 1.0) + gammaln(totals_x + 1.0) - gammaln(totals_b + totals_x + W)
    return lgamma_overlaps(B, X) + totals


def frequencies(C):
    """Rows divided by their totals; a row with no words stays all zero."""
    totals = C.sum(axis=1, keepdims=True)
    return np.divide(C, totals, out=np.zeros_like(C), where=totals > 0)


def reference_sensing1(B, X, n):
    # An empty document has all-zero frequencies, so every term is lnG(1) = 0: it scores 0.
    return lgamma_overlaps(n * frequencies(B), n * frequencies(X))


def reference_dot(B, X):
    return X @ B.T


def reference_rbf(B, X, gamma):
    return np.exp(-gamma * np.sum((X[:, None, :] - B[None, :, :]) ** 2, axis=2))


def magnitude(B, X, n=None):
    """A bound on the log-Gamma terms of every pair, to scale the absolute tolerance by."""
    if n is None:
        largest = B.sum(axis=1).max(initial=0.0) + X.sum(axis=1).max(initial=0.0) + B.shape[1]
    else:
        largest = 2.0 * n + 1.0
    return 1.0 + gammaln(largest + 1.0)


def assert_matches(got, expected, scale=1.0):
    # lgamma of large arguments is only good to a few ulps of its (large) value, and the
    # terms cancel, so the absolute tolerance follows the size of the terms, not the result.
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12 * scale)


# -- sparse layouts ---------------------------------------------------------------------------


def canonical(matrix):
    matrix.sum_duplicates()
    matrix.sort_indices()
    assert matrix.has_canonical_format
    return matrix


def csr(X):
    """Inputs as CSR: (indptr, indices, values)."""
    m = canonical(sp.csr_matrix(X))
    return m.indptr.astype(np.int64), m.indices.astype(np.int64), m.data.astype(np.float64)


def postings(B):
    """Basis as postings (its CSC form): (indptr, items, values)."""
    m = canonical(sp.csc_matrix(B))
    return m.indptr.astype(np.int64), m.indices.astype(np.int64), m.data.astype(np.float64)


def sensing0_basis(B):
    indptr, items, values = postings(B)
    totals = B.sum(axis=1).astype(np.float64)
    return indptr, items, values, gammaln(values + 1.0), totals, gammaln(totals + 1.0)


def sensing1_basis(B, n):
    indptr, items, values = postings(n * frequencies(B))
    return indptr, items, values, gammaln(values + 1.0)


def empty_out(X, B):
    return np.full((X.shape[0], B.shape[0]), np.nan)


def run_sensing0(driver, B, X, out=None):
    out = empty_out(X, B) if out is None else out
    driver(*sensing0_basis(B), *csr(X), B.shape[1], out)
    return out


def run_sensing1(driver, B, X, n, out=None):
    out = empty_out(X, B) if out is None else out
    driver(*sensing1_basis(B, n), *csr(X), float(n), out)
    return out


def run_dot(driver, B, X, out=None):
    out = empty_out(X, B) if out is None else out
    driver(*postings(B), *csr(X), out)
    return out


def run_rbf(driver, B, X, gamma, out=None):
    out = empty_out(X, B) if out is None else out
    driver(*postings(B), np.sum(B * B, axis=1), *csr(X), float(gamma), out)
    return out


SENSING0 = [sk.sensing0_similarities, sk.sensing0_similarities_serial]
SENSING1 = [sk.sensing1_similarities, sk.sensing1_similarities_serial]
DOT = [sk.dot_similarities, sk.dot_similarities_serial]
RBF = [sk.rbf_similarities, sk.rbf_similarities_serial]

SENSING1_N = 3.0
RBF_GAMMA = 0.05

# Every kernel and driver, as (run, reference, tolerance scale), for the generic tests below.
KERNELS = {
    "sensing0": (
        run_sensing0,
        reference_sensing0,
        lambda B, X: magnitude(B, X),
        SENSING0,
    ),
    "sensing1": (
        lambda driver, B, X, out=None: run_sensing1(driver, B, X, SENSING1_N, out),
        lambda B, X: reference_sensing1(B, X, SENSING1_N),
        lambda B, X: magnitude(B, X, SENSING1_N),
        SENSING1,
    ),
    "dot": (
        run_dot,
        reference_dot,
        lambda B, X: 1.0 + np.abs(X).sum(axis=1).max(initial=0) * np.abs(B).max(initial=0),
        DOT,
    ),
    "rbf": (
        lambda driver, B, X, out=None: run_rbf(driver, B, X, RBF_GAMMA, out),
        lambda B, X: reference_rbf(B, X, RBF_GAMMA),
        lambda B, X: 1.0,
        RBF,
    ),
}
ALL = [
    pytest.param(name, driver, id=f"{name}-{driver.__name__}")
    for name, (*_, drivers) in KERNELS.items()
    for driver in drivers
]


def check(name, driver, B, X):
    run, reference, scale, _ = KERNELS[name]
    got = run(driver, B, X)
    assert_matches(got, reference(B, X), scale(B, X))
    return got


# -- data -------------------------------------------------------------------------------------


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def counts(rng, n, W, density, high=6):
    """Random sparse integer counts in [1, high] at about ``density`` of the entries."""
    present = rng.random((n, W)) < density
    return np.where(present, rng.integers(1, high + 1, size=(n, W)), 0).astype(np.float64)


# (n_samples, n_basis, W, density, largest count)
RANDOM = [
    (30, 25, 50, 0.15, 5),
    (24, 36, 120, 0.08, 12),
    (40, 20, 300, 0.03, 3),
    (12, 9, 200, 0.3, 60),
    (1, 1, 64, 0.2, 4),
]


# -- against the reference --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "driver"), ALL)
@pytest.mark.parametrize(("n", "n_basis", "W", "density", "high"), RANDOM)
def test_random_counts_equal_reference(rng, name, driver, n, n_basis, W, density, high):
    B, X = counts(rng, n_basis, W, density, high), counts(rng, n, W, density, high)
    check(name, driver, B, X)


@pytest.mark.parametrize("driver", SENSING1)
@pytest.mark.parametrize("n", [0.5, 1.0, 7.0, 1000.0])
@pytest.mark.parametrize(("n_samples", "n_basis", "W", "density", "high"), RANDOM[:3])
def test_sensing1_equals_reference_for_small_and_large_n(
    rng, driver, n, n_samples, n_basis, W, density, high
):
    B, X = counts(rng, n_basis, W, density, high), counts(rng, n_samples, W, density, high)
    got = run_sensing1(driver, B, X, n)
    assert_matches(got, reference_sensing1(B, X, n), magnitude(B, X, n))


@pytest.mark.parametrize("driver", RBF)
@pytest.mark.parametrize("gamma", [1e-3, 0.5, 1.0, 7.0])
def test_rbf_on_unit_norm_rows_equals_reference(rng, driver, gamma):
    B, X = counts(rng, 15, 80, 0.1, 9), counts(rng, 20, 80, 0.1, 9)
    B[:, 0] += 1.0  # no empty row: every row can be normalised
    X[:, 0] += 1.0
    B /= np.linalg.norm(B, axis=1, keepdims=True)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    got = run_rbf(driver, B, X, gamma)
    np.testing.assert_allclose(got, reference_rbf(B, X, gamma), rtol=1e-10, atol=1e-14)
    # ||b - x||^2 = 2 - 2 b.x on the unit sphere.
    np.testing.assert_allclose(got, np.exp(-gamma * (2.0 - 2.0 * X @ B.T)), rtol=1e-10)
    assert (got <= 1.0).all()


def test_lgamma_overlap_is_the_log_binomial():
    for b, x in [(1.0, 1.0), (3.0, 5.0), (1000.0, 1.0), (0.25, 7.5), (4000.0, 1000.0)]:
        expected = gammaln(b + x + 1.0) - gammaln(b + 1.0) - gammaln(x + 1.0)
        got = sk.lgamma_overlap(b, x, gammaln(b + 1.0), gammaln(x + 1.0))
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12 * gammaln(b + x + 2.0))
    assert sk.lgamma_overlap(3.0, 5.0, gammaln(4.0), gammaln(6.0)) == pytest.approx(
        np.log(56.0), rel=1e-13
    )


# -- edge cases -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_empty_documents_on_either_side(rng, name, driver):
    W = 40
    B, X = counts(rng, 7, W, 0.2), counts(rng, 9, W, 0.2)
    B[[0, 3, 6]] = 0.0  # first, middle and last basis items hold no word
    X[[0, 4, 8]] = 0.0
    got = check(name, driver, B, X)
    if name == "sensing1":
        assert (got[[0, 4, 8]] == 0.0).all()
        assert (got[:, [0, 3, 6]] == 0.0).all()
    if name == "dot":
        assert (got[[0, 4, 8]] == 0.0).all()
        assert (got[:, [0, 3, 6]] == 0.0).all()
    if name == "sensing0":
        # log K(0, 0) = lnG(1) + lnG(1) - lnG(W): only the totals term.
        np.testing.assert_allclose(got[0, 0], -gammaln(W), rtol=1e-12)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_all_empty_batch_and_basis(name, driver):
    B, X = np.zeros((3, 10)), np.zeros((4, 10))
    check(name, driver, B, X)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_one_word_documents(rng, name, driver):
    W = 30
    B, X = np.zeros((W, W)), np.zeros((12, W))
    B[np.arange(W), np.arange(W)] = rng.integers(1, 5, size=W)  # basis j: word j only
    X[np.arange(12), rng.integers(0, W, size=12)] = rng.integers(1, 5, size=12)
    check(name, driver, B, X)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_documents_of_very_different_lengths(rng, name, driver):
    W = 150
    B, X = np.zeros((4, W)), np.zeros((5, W))
    B[0, 3] = 1.0  # one word
    B[1, 3] = 1000.0  # 1,000 on one word, 5,000 in all
    B[1, rng.choice(np.arange(4, W), size=40, replace=False)] = 100.0
    B[2, 7] = 1000.0  # 1,000 on a single word
    B[3] = counts(rng, 1, W, 0.5, 3)  # short and spread out
    X[0, 3] = 1.0
    X[1] = B[1]
    X[2, 3] = 1000.0
    X[2, rng.choice(np.arange(4, W), size=80, replace=False)] = 50.0
    X[3, 7] = 1.0
    X[4, 3] = 999.0
    X[4, 7] = 1.0
    assert B[1].sum() == 5000.0
    assert X[2].sum() == 5000.0
    check(name, driver, B, X)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_identical_documents(rng, name, driver):
    B = counts(rng, 10, 60, 0.15, 8)
    B[4] = 0.0
    got = check(name, driver, B, B.copy())
    diagonal = np.diag(got)
    if name == "dot":
        np.testing.assert_allclose(diagonal, np.sum(B * B, axis=1), rtol=1e-13)
    if name == "rbf":
        np.testing.assert_allclose(diagonal, 1.0, rtol=1e-13)


def disjoint(rng, n_basis, n, W):
    """Basis items on the first half of the words, inputs on the second."""
    B, X = counts(rng, n_basis, W, 0.3, 9), counts(rng, n, W, 0.3, 9)
    B[:, W // 2 :] = 0.0
    X[:, : W // 2] = 0.0
    return B, X


@pytest.mark.parametrize("driver", SENSING0)
def test_sensing0_of_disjoint_documents_is_the_totals_term(rng, driver):
    B, X = disjoint(rng, 8, 11, 90)
    W = B.shape[1]
    totals_b, totals_x = B.sum(axis=1)[None, :], X.sum(axis=1)[:, None]
    expected = gammaln(totals_b + 1.0) + gammaln(totals_x + 1.0) - gammaln(totals_b + totals_x + W)
    assert_matches(run_sensing0(driver, B, X), expected, magnitude(B, X))


@pytest.mark.parametrize("driver", SENSING1)
def test_sensing1_of_disjoint_documents_is_zero(rng, driver):
    B, X = disjoint(rng, 8, 11, 90)
    assert (run_sensing1(driver, B, X, 5.0) == 0.0).all()


@pytest.mark.parametrize("driver", DOT)
def test_dot_of_disjoint_documents_is_zero(rng, driver):
    B, X = disjoint(rng, 8, 11, 90)
    assert (run_dot(driver, B, X) == 0.0).all()


@pytest.mark.parametrize("driver", RBF)
def test_rbf_of_disjoint_documents_is_the_norms_term(rng, driver):
    B, X = disjoint(rng, 8, 11, 90)
    expected = np.exp(-0.01 * (np.sum(B * B, axis=1)[None, :] + np.sum(X * X, axis=1)[:, None]))
    np.testing.assert_allclose(run_rbf(driver, B, X, 0.01), expected, rtol=1e-12)


# -- invariances ------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", SENSING1)
@pytest.mark.parametrize("n", [0.5, 4.0, 1000.0])
def test_sensing1_ignores_an_integer_scaling_of_the_counts(rng, driver, n):
    B, X = counts(rng, 9, 70, 0.2, 7), counts(rng, 12, 70, 0.2, 7)
    factors = rng.integers(2, 50, size=(12, 1))
    basis_factors = rng.integers(2, 50, size=(9, 1))
    base = run_sensing1(driver, B, X, n)
    np.testing.assert_allclose(run_sensing1(driver, B, X * factors, n), base, rtol=1e-12)
    np.testing.assert_allclose(run_sensing1(driver, B * basis_factors, X, n), base, rtol=1e-12)


@pytest.mark.parametrize("driver", SENSING0)
def test_sensing0_is_symmetric(rng, driver):
    B, X = counts(rng, 13, 100, 0.1, 20), counts(rng, 17, 100, 0.1, 20)
    B[2], X[5] = 0.0, 0.0
    forward = run_sensing0(driver, B, X)
    backward = run_sensing0(driver, X, B)  # the inputs as basis, the basis as inputs
    np.testing.assert_allclose(forward, backward.T, rtol=1e-12, atol=1e-12 * magnitude(B, X))


@pytest.mark.parametrize("driver", SENSING1)
def test_sensing1_is_symmetric(rng, driver):
    B, X = counts(rng, 13, 100, 0.1, 20), counts(rng, 17, 100, 0.1, 20)
    forward = run_sensing1(driver, B, X, 6.0)
    backward = run_sensing1(driver, X, B, 6.0)
    np.testing.assert_allclose(forward, backward.T, rtol=1e-12, atol=1e-12 * magnitude(B, X, 6))


@pytest.mark.parametrize(
    ("sensing0", "sensing1", "dot"), list(zip(SENSING0, SENSING1, DOT, strict=True))
)
def test_absent_words_contribute_exactly_zero(rng, sensing0, sensing1, dot):
    B, X = counts(rng, 10, 50, 0.2, 6), counts(rng, 14, 50, 0.2, 6)
    B[3], X[7] = 0.0, 0.0
    # One more word that no document uses, at the end and in the middle of the vocabulary.
    wider = [
        (np.hstack([B, np.zeros((10, 1))]), np.hstack([X, np.zeros((14, 1))])),
        (np.insert(B, 20, 0.0, axis=1), np.insert(X, 20, 0.0, axis=1)),
    ]
    for B1, X1 in wider:
        assert B1.shape[1] == X1.shape[1] == 51
        # sensing0 changes only through W in the totals term.
        got = run_sensing0(sensing0, B1, X1)
        assert_matches(got, reference_sensing0(B1, X1), magnitude(B1, X1))
        totals_b, totals_x = B.sum(axis=1)[None, :], X.sum(axis=1)[:, None]
        shift = gammaln(totals_b + totals_x + 50) - gammaln(totals_b + totals_x + 51)
        assert_matches(got - run_sensing0(sensing0, B, X), shift, magnitude(B1, X1))
        assert (run_sensing1(sensing1, B1, X1, 3.0) == run_sensing1(sensing1, B, X, 3.0)).all()
        assert (run_dot(dot, B1, X1) == run_dot(dot, B, X)).all()


# -- output handling --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_drivers_write_into_a_strided_block_and_nowhere_else(rng, name, driver):
    run, reference, scale, _ = KERNELS[name]
    B, X = counts(rng, 6, 45, 0.2, 5), counts(rng, 9, 45, 0.2, 5)
    wide = np.full((9, 14), -99.0)
    block = wide[:, 5:11]
    assert not block.flags.c_contiguous
    run(driver, B, X, out=block)
    assert_matches(wide[:, 5:11], reference(B, X), scale(B, X))
    assert (wide[:, :5] == -99.0).all()
    assert (wide[:, 11:] == -99.0).all()
    # every other column of a wider array as well
    wide = np.full((9, 12), -99.0)
    run(driver, B, X, out=wide[:, ::2])
    assert_matches(wide[:, ::2], reference(B, X), scale(B, X))
    assert (wide[:, 1::2] == -99.0).all()


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_empty_batch_leaves_out_empty(rng, name, driver):
    run, *_ = KERNELS[name]
    B = counts(rng, 5, 30, 0.2)
    X = np.zeros((0, 30))
    assert csr(X)[0].tolist() == [0]
    out = np.empty((0, 5))
    run(driver, B, X, out=out)
    assert out.shape == (0, 5)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_empty_basis_writes_nothing(rng, name, driver):
    run, *_ = KERNELS[name]
    B, X = np.zeros((0, 30)), counts(rng, 4, 30, 0.2)
    out = np.empty((4, 0))
    run(driver, B, X, out=out)
    assert out.shape == (4, 0)


@pytest.mark.parametrize(("name", "driver"), ALL)
def test_drivers_overwrite_stale_output(rng, name, driver):
    run, reference, scale, _ = KERNELS[name]
    B, X = counts(rng, 6, 40, 0.2, 5), counts(rng, 8, 40, 0.2, 5)
    B[1], X[2] = 0.0, 0.0
    out = np.full((8, 6), 12345.0)
    run(driver, B, X, out=out)
    run(driver, B, X, out=out)  # a second call into the same buffer gives the same answer
    assert_matches(out, reference(B, X), scale(B, X))
