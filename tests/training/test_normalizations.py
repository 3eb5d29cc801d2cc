"""The normalisation alternatives and eigen diagnostics against direct numpy/scipy references."""

import numpy as np
import pytest
import scipy.linalg
from sklearn.metrics.pairwise import rbf_kernel

from service.model import SpecError, parse_specs
from service.model.features import NORMALIZATIONS, parse_normalization, resolve_normalization
from training import BasisExpandingSVC
from training.estimator.block_statistics import learn
from training.estimator.diagnostics import eigen_diagnostics
from training.estimator.expansion import BasisExpansion
from training.estimator.normalization import (
    NORMALIZATION_RULES,
    kernel_map_projection,
    normalization_rule,
    normalization_statistics,
    nystroem_projection,
)
from training.estimator.preprocessing import InputNormalizer, InputStatistics


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


def test_nystroem_clip_of_a_kernel_is_scipys_inverse_square_root_up_to_a_rotation(data):
    """A kernel's clip map comes from a Cholesky factor, not K^(-1/2) itself: the features are
    the inverse square root's rotated by an orthogonal matrix, which a linear SVM cannot see."""
    X, y = data
    expansion = BasisExpansion("rbf(gamma=0.2)", n_basis_per_class=5, normalization="nystroem")
    features = expansion.fit_transform(X, y)
    basis = X[expansion.basis_indices_]
    K = rbf_kernel(basis, basis, gamma=0.2)
    expected = rbf_kernel(X, basis, gamma=0.2) @ np.real(scipy.linalg.sqrtm(np.linalg.inv(K)))
    rotation = np.linalg.lstsq(expected, features, rcond=None)[0]
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(len(K)), atol=1e-6)
    np.testing.assert_allclose(features, expected @ rotation, atol=1e-8)
    np.testing.assert_allclose(expansion.transform(X), features, atol=1e-10)
    # The Nystroem embedding reproduces the kernel between basis items exactly.
    embedded = features[expansion.basis_indices_]
    np.testing.assert_allclose(embedded @ embedded.T, K, atol=1e-8)


@pytest.mark.parametrize("kind", ["repeated items", "linear beyond its rank"])
def test_a_kernel_map_from_a_singular_gram_matrix_is_the_pseudo_inverses(kind):
    """Repeated basis items, or a linear kernel on more items than numbers, make the Gram matrix
    singular: the pivoted factor keeps its rank and gives the inner products of the
    pseudo-inverse, k(x)^T K^+ k(y), as the eigenvector map does."""
    rng = np.random.default_rng(8)
    basis = rng.normal(size=(30, 12) if kind == "repeated items" else (30, 4))
    others = rng.normal(size=(10, basis.shape[1]))
    if kind == "repeated items":
        basis[20:] = basis[:10]
        gram, towards = rbf_kernel(basis, basis, gamma=0.1), rbf_kernel(others, basis, gamma=0.1)
    else:
        gram, towards = basis @ basis.T, others @ basis.T
    projection = kernel_map_projection(gram)
    rank = 20 if kind == "repeated items" else 4
    assert np.count_nonzero(np.abs(projection).sum(axis=0)) == rank
    pseudo_inverse = np.linalg.pinv(gram, rcond=1e-10, hermitian=True)
    np.testing.assert_allclose(
        (towards @ projection) @ (towards @ projection).T,
        towards @ pseudo_inverse @ towards.T,
        atol=1e-6,
    )
    np.testing.assert_allclose((gram @ projection) @ (gram @ projection).T, gram, atol=1e-8)


def test_a_kernel_map_of_a_nearly_singular_gram_matrix_stays_a_nystroem_map():
    """A wide rbf on hundreds of basis items is singular up to rounding, where the factor and
    the eigenvectors drop different near-null directions. Either way the map must stay a
    Nystroem approximation: the basis Gram matrix reproduced, and a new item's squared feature
    norm never above k(x, x) = 1 (the kernel minus its approximation is positive
    semi-definite)."""
    rng = np.random.default_rng(2)
    basis, others = rng.normal(size=(400, 5)), rng.normal(size=(200, 5))
    gram = rbf_kernel(basis, gamma=0.02)
    assert np.linalg.cond(gram) > 1e12
    projection = kernel_map_projection(gram)
    reproduced = gram @ projection
    np.testing.assert_allclose(reproduced @ reproduced.T, gram, atol=1e-6)
    features = rbf_kernel(others, basis, gamma=0.02) @ projection
    assert (np.einsum("ij,ij->i", features, features) <= 1.0 + 1e-6).all()


def test_a_kernel_map_of_a_zero_or_one_item_basis():
    np.testing.assert_array_equal(kernel_map_projection(np.zeros((3, 3))), np.zeros((3, 3)))
    np.testing.assert_allclose(kernel_map_projection(np.array([[4.0]])), [[0.5]])


def test_an_indefinite_measure_is_clipped_by_its_eigenvalues_beside_a_kernels_factor():
    """Clip drops an indefinite measure's negative eigenvalues, which a Cholesky factor cannot
    do: that measure's projection is V_+ L_+^(-1/2) V_+^T up to a rotation, the kernel's beside
    it a factor's."""
    rng = np.random.default_rng(4)
    X = rng.random(size=(40, 16))
    y = np.repeat(["a", "b"], 20)
    expansion = BasisExpansion(
        "linear + rigid(1)", n_basis_per_class=8, normalization="nystroem", grid_shape=(4, 4, 1)
    ).fit(X, y)
    linear, rigid = expansion.basis_gram_
    w, V = np.linalg.eigh((rigid + rigid.T) / 2)
    assert (w < -1e-8).any()
    positive = w > 1e-10 * np.abs(w).max()
    expected = (V[:, positive] * w[positive] ** -0.5) @ V[:, positive].T
    clipped = expansion.projection_[1]
    np.testing.assert_allclose(clipped @ clipped.T, expected @ expected.T, atol=1e-8)
    reproduced = linear @ expansion.projection_[0]
    np.testing.assert_allclose(reproduced @ reproduced.T, linear, atol=1e-8)
    assert expansion.basis_eigenvalues_ is None


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
    """The map is V f(w) V^T up to a rotation (the features' inner products, P P^T, are the
    same), its columns past the eigenvalues kept zero (clip's: flip and square keep all)."""
    w, V = np.linalg.eigh(indefinite)
    assert (w < 0).any()
    assert (w > 0).any()
    expected = (V * spectrum(w)) @ V.T
    projection = nystroem_projection(indefinite, fix)
    np.testing.assert_allclose(projection @ projection.T, expected @ expected.T, atol=1e-10)
    rank = np.count_nonzero(np.isfinite(spectrum(w)) & (spectrum(w) != 0))
    np.testing.assert_array_equal(projection[:, rank:], 0.0)
    assert np.linalg.matrix_rank(projection) == rank


@pytest.mark.parametrize("fix", ["square", "clip"])
def test_a_linear_measure_of_few_inputs_maps_to_its_rank_in_columns(fix):
    """A linear measure of 3 numbers on a basis of 24 items has rank 3: its Nystroem features
    are 3 columns and zeros, with the inner products of the map, k(x)^T f(K)^2 k(y), by numpy;
    the solver trains on those 3 columns (dense ones), beside the rbf measure's or alone."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(60, 3))
    y = np.repeat(["a", "b", "c"], 20)
    expansion = BasisExpansion("linear", n_basis_per_class=8, normalization=f"nystroem({fix})")
    features = expansion.fit(X, y).transform(X)
    np.testing.assert_array_equal(features[:, 3:], 0.0)
    basis = expansion.basis_items_
    gram, similarities = basis @ basis.T, X @ basis.T
    inverse = np.linalg.pinv(gram @ gram if fix == "square" else gram, rcond=1e-10, hermitian=True)
    np.testing.assert_allclose(
        features @ features.T, similarities @ inverse @ similarities.T, rtol=1e-7, atol=1e-8
    )
    expanded = BasisExpandingSVC(
        similarity="rbf(gamma=0.5) + linear",
        normalization=f"nystroem({fix})",
        basis_per_class=8,
    ).expand(X, y)
    np.testing.assert_array_equal(expanded.columns, np.r_[0:24, 24:27])
    assert expanded.design.shape == (60, 27)
    # alone, its 3 columns of 24 are dense ones: not a sparse design of mostly zeros
    alone = BasisExpandingSVC(
        similarity="linear", normalization=f"nystroem({fix})", basis_per_class=8
    ).expand(X, y)
    assert isinstance(alone.design, np.ndarray)
    np.testing.assert_array_equal(alone.columns, [0, 1, 2])


def test_nystroem_square_is_the_inverse_square_root_of_k_transpose_k(indefinite):
    expected = np.real(scipy.linalg.sqrtm(np.linalg.inv(indefinite.T @ indefinite)))
    projection = nystroem_projection(indefinite, "square")
    np.testing.assert_allclose(projection @ projection.T, expected @ expected.T, atol=1e-8)


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


def _learned_in_blocks(statistics, X, cuts):
    """What ``statistics`` learns when the rows come in blocks cut at ``cuts`` (as a cluster's
    workers hold them): each block's sums added up, pass by pass."""
    blocks = np.split(X, cuts)
    return learn(
        statistics,
        len(X),
        lambda step, learned: tuple(
            sum(parts)
            for parts in zip(*(statistics.sums(b, step, learned) for b in blocks), strict=True)
        ),
    )


def test_every_normalization_has_one_rule():
    assert set(NORMALIZATION_RULES) == set(NORMALIZATIONS)
    with pytest.raises(ValueError, match="unknown normalization"):
        normalization_rule("l2", 1)


@pytest.mark.parametrize("normalization", ["besvm", "zscore", "none"])
def test_a_normalization_learned_from_blocks_is_the_one_learned_in_one(normalization):
    """One process is one block: the sums of any cut into blocks give its statistics, which
    are the direct numpy formulas (BE-SVM eq. 4 for besvm: each measure's centred map over the
    mean norm of its rows)."""
    rng = np.random.default_rng(5)
    raw = rng.gamma(2.0, size=(300, 3 * 7))  # three measures of seven basis items
    offset, scale, projection = normalization_statistics(raw, 3, normalization)
    rule = normalization_rule(normalization, 3)
    in_blocks = rule.statistics(_learned_in_blocks(rule, raw, [40, 41, 200]), raw.shape[1], None)
    for one, blocks in zip((offset, scale), in_blocks[:2], strict=True):
        np.testing.assert_allclose(blocks, one, rtol=1e-12)
    assert projection is None
    assert in_blocks[2] is None
    centred = raw - raw.mean(axis=0)
    expected = {
        "none": (np.zeros(21), np.ones(21)),
        "zscore": (raw.mean(axis=0), raw.std(axis=0)),
        "besvm": (
            raw.mean(axis=0),
            np.repeat(
                [np.linalg.norm(centred[:, m * 7 : (m + 1) * 7], axis=1).mean() for m in range(3)],
                7,
            ),
        ),
    }[normalization]
    np.testing.assert_allclose(offset, expected[0], rtol=1e-12)
    np.testing.assert_allclose(scale, expected[1], rtol=1e-12)


@pytest.mark.parametrize("scaling", ["global", "per-feature"])
def test_the_input_normalization_learned_from_blocks_is_the_one_fitted_in_one(scaling):
    rng = np.random.default_rng(6)
    X = rng.normal(size=(200, 5)) * [1.0, 10.0, 0.1, 3.0, 0.0] + 4.0  # one constant feature
    fitted = InputNormalizer(scaling=scaling).fit(X)
    learned = _learned_in_blocks(InputStatistics(scaling), X, [13, 100])
    np.testing.assert_allclose(learned["mean"], fitted.mean_, rtol=1e-12)
    np.testing.assert_allclose(learned["scale"], fitted.scale_, rtol=1e-12)
    # The mean norm of the normalised inputs is 1, under both scalings (per feature: each
    # feature standardised first, StandardScaler's, a constant one left as it is).
    standardized = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
    reference = X - X.mean(axis=0) if scaling == "global" else standardized
    expected = np.linalg.norm(reference, axis=1).mean()
    normalized = fitted.transform(X)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1).mean(), 1.0, rtol=1e-12)
    if scaling == "global":
        np.testing.assert_allclose(fitted.scale_, expected, rtol=1e-12)


def test_nystroem_keeps_the_eigenvalues_of_its_one_decomposition_for_the_diagnostics(data):
    """The basis eigenvalues Nystroem decomposed for its projection are numpy's of the
    symmetrised Gram matrix, and the diagnostics from them are those of a fresh eigvalsh."""
    from training.estimator.estimator import basis_diagnostics

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
    from training.estimator.normalization import symmetric_eigenvalues

    spectrum = symmetric_eigenvalues(indefinite)
    for fix in ("clip", "flip", "square"):
        np.testing.assert_array_equal(
            nystroem_projection(None, fix, spectrum), nystroem_projection(indefinite, fix)
        )
