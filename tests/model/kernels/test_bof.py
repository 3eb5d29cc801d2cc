"""The bof transform against references written with numpy, scikit-image and scikit-learn.

- descriptors: scikit-image's ``hog`` with 4 x 4-cell blocks, L2-Hys, every ``step / cell``-th
  block (the kernels reuse the HOG kernels' float32 votes and numpy-ordered sums, so they are
  equal to the bit here; the tolerance, rtol 1e-12, allows a numpy whose SIMD ``hypot`` or
  ``arctan2`` differs in the last bit);
- words: the nearest centre by numpy's brute-force distances and ``argmin``;
- pyramid counts: each patch's cell found from its centre pixel with numpy, counted with
  ``np.add.at``;
- the measures on cells: ``scipy.special.gammaln`` and numpy on dense count vectors, weighted
  by Lazebnik et al.'s level weights;
- the visual words: scikit-learn's ``MiniBatchKMeans`` with the same seed on the reference
  descriptors.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln
from skimage.feature import hog
from sklearn.cluster import MiniBatchKMeans

from service.model.errors import SpecError
from service.model.inputs.bof import BagOfFeatures, PyramidLayout, pyramid_weights
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform
from service.model.inputs.words import CellDocuments, Documents, smooth_idf
from service.model.similarity import parse_spec
from service.model.threads import limit_threads
from training.estimator.visual_words import fit_bag_of_features


def reference_descriptors(image: np.ndarray, patch: int, step: int) -> np.ndarray:
    """scikit-image's HOG blocks of one (H, W) or (H, W, 3) image: (n_patches, 128)."""
    cell = patch // 4
    blocks = hog(
        image if image.shape[-1] == 3 else image[..., 0],
        orientations=8,
        pixels_per_cell=(cell, cell),
        cells_per_block=(4, 4),
        block_norm="L2-Hys",
        feature_vector=False,
        channel_axis=-1 if image.shape[-1] == 3 else None,
    )
    chosen = blocks[:: step // cell, :: step // cell]
    return chosen.reshape(-1, 128)


def reference_words(descriptors: np.ndarray, centres: np.ndarray) -> np.ndarray:
    distances = ((descriptors[:, None, :] - centres[None, :, :]) ** 2).sum(axis=-1)
    return distances.argmin(axis=1)


def reference_counts(words, height, width, patch, step, levels, n_words) -> np.ndarray:
    """(n_images * n_cells, n_words) dense counts: a patch's cell at level l is where its
    centre pixel falls in a 2^l x 2^l grid."""
    rows = (height - patch) // step + 1
    cols = (width - patch) // step + 1
    centre_r = (np.arange(rows) * step + patch // 2)[:, None].repeat(cols, 1).ravel()
    centre_c = (np.arange(cols) * step + patch // 2)[None, :].repeat(rows, 0).ravel()
    blocks = []
    for image_words in words:
        for level in levels:
            side = 2**level
            cell = np.floor(centre_r * side / height).astype(int) * side + np.floor(
                centre_c * side / width
            ).astype(int)
            counts = np.zeros((side * side, n_words))
            np.add.at(counts, (cell, image_words), 1)
            blocks.append(counts)
    return np.vstack(blocks) if blocks else np.zeros((0, n_words))


def bound(spec: InputSpec, text: str, centres: np.ndarray):
    transform = parse_transform(text)
    n_words = centres.shape[0]
    return BagOfFeatures(transform, centres, np.ones(n_words)).bind(spec)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, size=(6, 40, 48, 1))


@pytest.mark.parametrize(("patch", "step"), [(16, 8), (8, 4), (16, 12), (12, 3)])
def test_descriptors_are_scikit_image_hog_blocks(images, patch, step):
    spec = InputSpec("grid", images.shape[1:])
    transform = bound(spec, f"bof(patch={patch}, step={step}, words=2)", np.zeros((2, 128)))
    got = transform.descriptors(images.reshape(len(images), -1))
    for image, descriptors in zip(images, got, strict=True):
        np.testing.assert_allclose(
            descriptors, reference_descriptors(image, patch, step), rtol=1e-12, atol=1e-15
        )


def test_colour_descriptors_take_the_dominant_channel():
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 1, size=(2, 32, 32, 3))
    spec = InputSpec("grid", (32, 32, 3))
    got = bound(spec, "bof(patch=16, step=8, words=2)", np.zeros((2, 128))).descriptors(
        images.reshape(2, -1)
    )
    for image, descriptors in zip(images, got, strict=True):
        np.testing.assert_allclose(
            descriptors, reference_descriptors(image, 16, 8), rtol=1e-12, atol=1e-15
        )


def test_words_and_pyramid_counts_against_numpy(images):
    spec = InputSpec("grid", images.shape[1:])
    rng = np.random.default_rng(2)
    centres = np.abs(rng.normal(0, 0.15, size=(30, 128)))
    flat = images.reshape(len(images), -1)
    transform = bound(spec, "bof(patch=8, step=4, words=30, levels=2)", centres)
    words, finite = transform.words(flat)
    descriptors = np.stack([reference_descriptors(image, 8, 4) for image in images])
    expected_words = np.stack([reference_words(d, centres) for d in descriptors])
    np.testing.assert_array_equal(words, expected_words)
    assert finite.all()
    cells = transform.apply(flat)
    expected = reference_counts(expected_words, 40, 48, 8, 4, (0, 1, 2), 30)
    np.testing.assert_array_equal(cells.documents.counts.toarray(), expected)
    assert cells.n_cells == 1 + 4 + 16
    assert len(cells) == len(images)
    # every level counts every patch once
    per_level = expected.reshape(len(images), 21, 30).sum(axis=2)
    for level_cells in (slice(0, 1), slice(1, 5), slice(5, 21)):
        assert (per_level[:, level_cells].sum(axis=1) == words.shape[1]).all()


def test_single_level_counts_only_that_level(images):
    spec = InputSpec("grid", images.shape[1:])
    centres = np.random.default_rng(3).uniform(0, 0.2, size=(5, 128))
    flat = images.reshape(len(images), -1)
    transform = bound(spec, "bof(patch=16, step=8, words=5, levels=1, single=1)", centres)
    words, _ = transform.words(flat)
    cells = transform.apply(flat)
    np.testing.assert_array_equal(
        cells.documents.counts.toarray(), reference_counts(words, 40, 48, 16, 8, (1,), 5)
    )
    np.testing.assert_array_equal(cells.cell_weights, np.ones(4))


def test_level_weights_are_lazebniks():
    assert pyramid_weights((0, 1, 2)) == {0: 0.25, 1: 0.25, 2: 0.5}
    assert pyramid_weights((0, 1, 2, 3)) == {0: 0.125, 1: 0.125, 2: 0.25, 3: 0.5}
    assert pyramid_weights((0,)) == {0: 1.0}
    assert pyramid_weights((2,)) == {2: 1.0}
    layout = PyramidLayout.of(parse_transform("bof(levels=2)"), InputSpec("grid", (64, 64, 1)))
    np.testing.assert_array_equal(layout.cell_weights, [0.25] + [0.25] * 4 + [0.5] * 16)
    assert (layout.patch_rows, layout.patch_cols) == (7, 7)


def test_parallel_and_serial_drivers_agree(images):
    spec = InputSpec("grid", images.shape[1:])
    centres = np.random.default_rng(4).uniform(0, 0.2, size=(40, 128))
    flat = images.reshape(len(images), -1)
    transform = bound(spec, "bof(patch=8, step=4, words=40)", centres)
    assert not transform.runs_serially(len(images))
    parallel, _ = transform.words(flat)
    with limit_threads(numba_threads=1):
        serial, _ = transform.words(flat)
    np.testing.assert_array_equal(parallel, serial)


def test_values_too_large_mark_the_image_unreadable():
    spec = InputSpec("grid", (32, 32, 1))
    images = np.zeros((2, 32 * 32))
    images[1, ::7] = 1e300  # the float32 votes overflow
    cells = bound(spec, "bof(words=3)", np.zeros((3, 128))).apply(images)
    np.testing.assert_array_equal(cells.unreadable, [False, True])


def _cells(rng, n, n_cells, n_words, idf, weights):
    dense = rng.integers(0, 4, size=(n * n_cells, n_words)) * (
        rng.uniform(size=(n * n_cells, n_words)) < 0.4
    )
    dense[0] = 0  # an empty cell
    return dense.astype(float), CellDocuments(Documents(sp.csr_matrix(dense), idf), weights)


def _sensing0(b, x, n_words):
    totals = b.sum(), x.sum()
    return (
        np.sum(gammaln(b + x + 1) - gammaln(b + 1) - gammaln(x + 1))
        + gammaln(totals[0] + 1)
        + gammaln(totals[1] + 1)
        - gammaln(totals[0] + totals[1] + n_words)
    )


def _sensing1(b, x, n):
    scaled = [n * v / v.sum() if v.sum() else v for v in (b, x)]
    return np.sum(
        gammaln(scaled[0] + scaled[1] + 1) - gammaln(scaled[0] + 1) - gammaln(scaled[1] + 1)
    )


@pytest.mark.parametrize("measure", ["sensing0", "sensing1(n=30)", "linear", "rbf(gamma=0.5)"])
def test_measures_sum_over_cells_with_the_level_weights(measure):
    rng = np.random.default_rng(5)
    n_cells, n_words = 5, 9
    weights = pyramid_weights((0, 1))
    weights = np.array([weights[0]] + [weights[1]] * 4)
    B, basis = _cells(rng, 4, n_cells, n_words, np.ones(n_words), weights)
    X, inputs = _cells(rng, 3, n_cells, n_words, np.ones(n_words), weights)
    idf = smooth_idf(sp.csr_matrix(np.vstack([B, X])))
    basis = CellDocuments(Documents(basis.documents.counts, idf), weights)
    inputs = CellDocuments(Documents(inputs.documents.counts, idf), weights)

    def tfidf(v):
        t = v * idf
        norm = np.linalg.norm(t)
        return t / norm if norm else t

    kappa = {
        "sensing0": lambda b, x: _sensing0(b, x, n_words),
        "sensing1(n=30)": lambda b, x: _sensing1(b, x, 30.0),
        "linear": lambda b, x: tfidf(b) @ tfidf(x),
        "rbf(gamma=0.5)": lambda b, x: np.exp(-0.5 * np.sum((tfidf(b) - tfidf(x)) ** 2)),
    }[measure]
    expected = np.array(
        [
            [
                sum(weights[c] * kappa(B[j * n_cells + c], X[i * n_cells + c]) for c in range(5))
                for j in range(4)
            ]
            for i in range(3)
        ]
    )
    spec = parse_spec(measure)
    np.testing.assert_allclose(spec.compute(basis, inputs), expected, rtol=1e-12, atol=1e-12)
    bound_measure = spec.bind(n_words, cells=n_cells)
    out = np.empty((3, 4))
    bound_measure.drivers.parallel(basis, inputs, *bound_measure.args, out)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_sensing2_resamples_each_cell():
    rng = np.random.default_rng(6)
    weights = np.array([0.5, 0.5])
    _, basis = _cells(rng, 2, 2, 6, np.ones(6), weights)
    _, inputs = _cells(rng, 2, 2, 6, np.ones(6), weights)
    n_words = 20
    resampled_basis = basis.documents.view("resampled", n_words).toarray()
    resampled_inputs = inputs.documents.view("resampled", n_words).toarray()
    nonempty = resampled_inputs.sum(axis=1) > 0
    assert (resampled_inputs.sum(axis=1)[nonempty] == n_words).all()
    expected = np.array(
        [
            [
                sum(
                    0.5 * _sensing0(resampled_basis[j * 2 + c], resampled_inputs[i * 2 + c], 6)
                    for c in range(2)
                )
                for j in range(2)
            ]
            for i in range(2)
        ]
    )
    got = parse_spec(f"sensing2(n_words={n_words})").compute(basis, inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_visual_words_are_minibatch_kmeans_of_the_descriptors(images):
    spec = InputSpec("grid", images.shape[1:])
    transform = parse_transform("bof(patch=16, step=8, words=6, levels=1)")
    flat = images.reshape(len(images), -1)
    bag, items = fit_bag_of_features(transform, spec, flat, random_state=3)
    descriptors = np.vstack([reference_descriptors(image, 16, 8) for image in images])
    kmeans = MiniBatchKMeans(n_clusters=6, random_state=3, batch_size=1024, n_init=3)
    kmeans.fit(descriptors)
    np.testing.assert_allclose(bag.centres, kmeans.cluster_centers_, rtol=1e-10, atol=1e-12)
    words = np.stack(
        [reference_words(reference_descriptors(image, 16, 8), bag.centres) for image in images]
    )
    counts = reference_counts(words, 40, 48, 16, 8, (0, 1), 6)
    np.testing.assert_array_equal(items.documents.counts.toarray(), counts)
    document_frequency = (counts > 0).sum(axis=0)
    np.testing.assert_allclose(
        bag.idf, np.log((1 + len(counts)) / (1 + document_frequency)) + 1, rtol=1e-12
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bof(patch=10)", "multiple of 4"),
        ("bof(patch=16, step=6)", "multiple of a spatial bin"),
        ("bof(patch=48, step=12)", "larger than the 40x48 image"),
        ("bof(words=1)", "at least 2 words"),
        ("bof(levels=6)", "levels must be 0..5"),
        ("bof(single=2)", "single is 0"),
    ],
)
def test_bad_parameters_are_refused(text, message):
    with pytest.raises(SpecError, match=message):
        parse_transform(text).check(InputSpec("grid", (40, 48, 1)))


def test_bof_applies_to_images_only_and_reads_no_grid_measure():
    with pytest.raises(SpecError, match="needs images"):
        parse_transform("bof").check(InputSpec("vector", (64,)))
    with pytest.raises(SpecError, match="does not apply to bags of visual words"):
        parse_spec("rigid(1)").bind(10, cells=5)
    with pytest.raises(SpecError, match="fitted on training images"):
        parse_transform("bof").bind(InputSpec("grid", (32, 32, 1)))
