"""The normalisation alternatives and eigen diagnostics against direct numpy/scipy references."""

import numpy as np
import pytest
import scipy.linalg
from sklearn.metrics.pairwise import rbf_kernel

from service.model import SpecError, parse_specs
from service.model.features import NORMALIZATIONS, parse_normalization, resolve_normalization
from training.diagnostics import eigen_diagnostics
from training.expansion import BasisExpansion, nystroem_projection


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(45, 6))
    y = np.repeat(["a", "b", "c"], 15)
    return X, y


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("besvm", "besvm"),
        ("ZScore", "zscore"),
        ("nystroem", "nystroem(clip)"),
        ("nystroem(flip)", "nystroem(flip)"),
        ("nystroem(spectrum=square)", "nystroem(square)"),
    ],
)
def test_normalization_names_parse_to_canonical_form(text, canonical):
    assert parse_normalization(text) == canonical
    assert canonical in NORMALIZATIONS


@pytest.mark.parametrize("text", ["l2", "nystroem(shift)", "zscore(1)", "nystroem(clip, 2)"])
def test_unknown_normalizations_are_refused(text):
    with pytest.raises(SpecError):
        parse_normalization(text)


def test_zscore_equals_direct_numpy(data):
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.2)", n_basis_per_class=4, normalization="zscore")
    features = expansion.fit_transform(X, y)
    raw = rbf_kernel(X, X[expansion.basis_indices_], gamma=0.2)
    expected = (raw - raw.mean(axis=0)) / raw.std(axis=0)
    np.testing.assert_allclose(features, expected, rtol=1e-10)
    np.testing.assert_allclose(expansion.transform(X), expected, rtol=1e-10)


def test_nystroem_clip_of_a_kernel_equals_scipy_inverse_square_root(data):
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.2)", n_basis_per_class=5, normalization="nystroem")
    features = expansion.fit_transform(X, y)
    basis = X[expansion.basis_indices_]
    K = rbf_kernel(basis, basis, gamma=0.2)
    expected = rbf_kernel(X, basis, gamma=0.2) @ np.real(scipy.linalg.sqrtm(np.linalg.inv(K)))
    np.testing.assert_allclose(features, expected, rtol=1e-6, atol=1e-8)
    # The Nystroem embedding reproduces the kernel between basis items exactly.
    embedded = features[expansion.basis_indices_]
    np.testing.assert_allclose(embedded @ embedded.T, K, atol=1e-8)


@pytest.fixture
def indefinite():
    rng = np.random.default_rng(11)
    A = rng.normal(size=(8, 8))
    return (A + A.T) / 2  # symmetric with negative eigenvalues


@pytest.mark.parametrize(
    ("fix", "spectrum"),
    [
        ("clip", lambda w: np.where(w > 0, w, np.inf) ** -0.5),
        ("flip", lambda w: np.abs(w) ** -0.5),
        ("square", lambda w: np.abs(w) ** -1.0),
    ],
)
def test_nystroem_spectrum_fixes_equal_direct_eigen_decomposition(indefinite, fix, spectrum):
    w, V = np.linalg.eigh(indefinite)
    assert (w < 0).any()
    assert (w > 0).any()
    expected = (V * spectrum(w)) @ V.T
    np.testing.assert_allclose(nystroem_projection(indefinite, fix), expected, atol=1e-10)


def test_nystroem_square_is_the_inverse_square_root_of_k_transpose_k(indefinite):
    expected = np.real(scipy.linalg.sqrtm(np.linalg.inv(indefinite.T @ indefinite)))
    np.testing.assert_allclose(nystroem_projection(indefinite, "square"), expected, atol=1e-8)


def test_nystroem_symmetrises_an_asymmetric_gram_matrix(indefinite):
    rng = np.random.default_rng(5)
    skew = rng.normal(size=indefinite.shape)
    skew -= skew.T
    np.testing.assert_allclose(
        nystroem_projection(indefinite + skew, "flip"),
        nystroem_projection(indefinite, "flip"),
        atol=1e-12,
    )


def test_eigen_diagnostics_equal_direct_numpy(indefinite):
    w = np.linalg.eigvalsh(indefinite)
    diagnostics = eigen_diagnostics(indefinite)
    assert diagnostics["ngrat"] == pytest.approx((w < 0).mean())
    assert diagnostics["ngeng"] == pytest.approx(-w[w < 0].sum() / w[w > 0].sum())
    assert diagnostics["n_negative"] == int((w < 0).sum())


def test_eigen_diagnostics_of_a_kernel_are_zero_despite_rounding(data):
    X, _ = data
    K = X @ X.T  # PSD of rank 6: rounding turns some of the 39 zero eigenvalues negative
    assert np.linalg.eigvalsh(K).min() < 0
    diagnostics = eigen_diagnostics(K)
    assert diagnostics["ngrat"] == 0.0
    assert diagnostics["ngeng"] == 0.0


def test_basis_gram_holds_each_measure_between_basis_items(data):
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.3) + linear", n_basis_per_class=3).fit(X, y)
    basis = X[expansion.basis_indices_]
    np.testing.assert_allclose(expansion.basis_gram_[0], rbf_kernel(basis, basis, gamma=0.3))
    np.testing.assert_allclose(expansion.basis_gram_[1], basis @ basis.T, rtol=1e-12)


@pytest.mark.parametrize(
    ("normalization", "similarities", "resolved"),
    [
        ("auto", "rbf", "nystroem(square)"),
        ("AUTO", "rbf + linear", "nystroem(square)"),
        ("auto", "rbf + rigid(1)", "besvm"),
        ("auto", "deformable", "besvm"),
        ("zscore", "rigid", "zscore"),
        ("nystroem", "rbf", "nystroem(clip)"),
    ],
)
def test_auto_normalization_follows_whether_every_measure_is_a_kernel(
    normalization, similarities, resolved
):
    assert resolve_normalization(normalization, parse_specs(similarities)) == resolved


def test_nystroem_keeps_the_eigenvalues_of_its_one_decomposition_for_the_diagnostics(data):
    """The basis eigenvalues Nystroem decomposed for its projection are numpy's of the
    symmetrised Gram matrix, and the diagnostics from them are those of a fresh eigvalsh."""
    from training.estimator import basis_diagnostics

    X, y = data
    expansion = BasisExpansion(
        "rbf(gamma=0.3) + linear", n_basis_per_class=5, normalization="nystroem(square)"
    ).fit(X, y)
    assert expansion.basis_eigenvalues_.shape == (2, 15)
    for gram, eigenvalues in zip(expansion.basis_gram_, expansion.basis_eigenvalues_, strict=True):
        np.testing.assert_allclose(
            eigenvalues, np.linalg.eigvalsh((gram + gram.T) / 2), rtol=1e-9, atol=1e-12
        )
    names = expansion.similarity_names_
    for name, gram in zip(names, expansion.basis_gram_, strict=True):
        expected = eigen_diagnostics(gram)
        got = basis_diagnostics(expansion)[name]
        assert got["n_negative"] == expected["n_negative"]
        assert got["max_eigenvalue"] == pytest.approx(expected["max_eigenvalue"], rel=1e-9)
    assert set(expansion.timings_) == {"similarities", "normalization", "projection"}
    besvm = BasisExpansion("rbf(gamma=0.3)", n_basis_per_class=5).fit(X, y)
    assert besvm.basis_eigenvalues_ is None


def test_a_nystroem_projection_from_a_given_spectrum_is_the_one_from_the_matrix(indefinite):
    from training.expansion import symmetric_eigenvalues

    spectrum = symmetric_eigenvalues(indefinite)
    for fix in ("clip", "flip", "square"):
        np.testing.assert_array_equal(
            nystroem_projection(None, fix, spectrum), nystroem_projection(indefinite, fix)
        )
