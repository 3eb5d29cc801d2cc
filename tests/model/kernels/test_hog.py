"""The compiled HOG transform against scikit-image's ``hog`` (the reference, called image by image).

The kernels compute what scikit-image computes, in the same precision and order: float32 votes
divided by the cell's area in float32, float64 L2-Hys with numpy's pairwise sums. So the cells
are equal to the bit wherever numpy's ``arctan2`` and ``hypot`` are the C library's, and they are
on this machine's tests; ``assert_same`` still allows a few float64 rounding errors (rtol 1e-12)
so that a numpy whose SIMD ``hypot`` differs in the last bit does not fail them. An error of the
size of float32 rounding (1e-7) would fail it: that is the float32 vote sums going wrong.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from skimage.feature import hog
from sklearn.datasets import load_digits

from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform
from service.model.kernels.hog import (
    cell_votes,
    hog_cells,
    hog_cells_serial,
    numpy_sum,
    orientation_bin,
    orientation_edges,
)
from service.model.threads import HOG_PARALLEL_MIN_VALUES, limit_threads


def reference(X, height, width, channels, cell, orientations):
    """scikit-image's cells of each flat image, as the transform computed them before."""
    rows = []
    for row in X:
        image = row.reshape(height, width, channels)
        cells = hog(
            image if channels == 3 else image[:, :, 0],
            orientations=orientations,
            pixels_per_cell=(cell, cell),
            cells_per_block=(1, 1),
            block_norm="L2-Hys",
            feature_vector=False,
            channel_axis=-1 if channels == 3 else None,
        )
        rows.append(cells.ravel())
    return np.array(rows)


def compiled(X, height, width, channels, cell, orientations, driver=hog_cells_serial):
    out = np.empty((X.shape[0], (height // cell) * (width // cell) * orientations))
    X = np.ascontiguousarray(X, dtype=np.float64)
    driver(X, height, width, channels, cell, orientations, out)
    return out


def assert_same(X, height, width, channels, cell, orientations):
    """Both drivers equal scikit-image (see the module's docstring for the tolerance) and each
    other to the bit."""
    expected = reference(X, height, width, channels, cell, orientations)
    serial = compiled(X, height, width, channels, cell, orientations)
    parallel = compiled(X, height, width, channels, cell, orientations, driver=hog_cells)
    np.testing.assert_allclose(serial, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(parallel, serial)
    return serial, expected


# Every image size with every cell size that fits in it (the transform refuses larger cells).
SIZES_AND_CELLS = [
    (height, width, cell)
    for height, width in [(8, 8), (9, 7), (12, 9), (16, 16), (5, 11)]
    for cell in (2, 3, 4, 8)
    if cell <= min(height, width)
]


@pytest.mark.parametrize(("height", "width", "cell"), SIZES_AND_CELLS)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("orientations", [4, 9])
def test_random_images_equal_scikit_image(height, width, cell, channels, orientations):
    rng = np.random.default_rng([height, width, channels, cell, orientations])
    d = height * width * channels
    # Real-valued pixels, 8-bit integer pixels (many gradients on bin edges: 0, 45, 90, 135
    # degrees) and faint ones (where the normalisation's eps weighs).
    batches = rng.random((6, d)) * 16, np.round(rng.random((6, d)) * 255), rng.random((6, d)) * 1e-6
    for X in batches:
        assert_same(X, height, width, channels, cell, orientations)


@pytest.mark.parametrize("cell", [1, 5, 7])
def test_odd_and_unit_cells_read_whole_cells(cell):
    X = np.random.default_rng(cell).random((4, 9 * 7 * 3)) * 16
    assert_same(X, 9, 7, 3, cell, 6)
    assert_same(X[:, : 9 * 7], 9, 7, 1, cell, 6)


@pytest.mark.parametrize("cell", [2, 3, 4, 8])
@pytest.mark.parametrize("orientations", [4, 9])
def test_digits_equal_scikit_image(cell, orientations):
    X = load_digits().data[:300]
    _, expected = assert_same(X, 8, 8, 1, cell, orientations)
    assert np.count_nonzero(expected) > 0


@pytest.mark.parametrize("channels", [1, 3])
def test_flat_images_have_zero_cells(channels):
    # No gradient anywhere: every cell is 0 / sqrt(0 + eps^2) = 0 (the eps case).
    X = np.zeros((2, 8 * 8 * channels))
    X[1] = 7.5
    cells, _ = assert_same(X, 8, 8, channels, 2, 9)
    assert not cells.any()


def test_colour_ties_take_the_first_channel():
    # Channels whose gradients differ in direction but not in magnitude at every pixel: the
    # transpose of a square image swaps g_row and g_col (a different angle, the same hypot),
    # and the negation keeps the magnitude. numpy's argmax takes the first of equal maxima.
    rng = np.random.default_rng(3)
    grey = np.round(rng.random((5, 8, 8)) * 4)
    images = np.stack([grey, grey.transpose(0, 2, 1), -grey], axis=-1)
    assert_same(images.reshape(5, -1), 8, 8, 3, 2, 9)
    # Ties of different integer gradients ((3, 4) and (5, 0)...) in small-valued random images.
    X = np.round(np.random.default_rng(4).random((20, 8 * 8 * 3)) * 3)
    assert_same(X, 8, 8, 3, 4, 9)
    # Not vacuous: the first channel's orientation differs from the third's at some pixel.
    first = compiled(images[:, :, :, :1].reshape(5, -1), 8, 8, 1, 2, 9)
    second = compiled(images[:, :, :, 1:2].reshape(5, -1), 8, 8, 1, 2, 9)
    assert not np.array_equal(first, second)


def test_votes_sum_in_float32_and_divide_by_the_area_in_float32():
    # scikit-image's cell_hog keeps its total in a C float: next to votes of 2**25 (float32
    # spacing 4 there), votes of a few units are rounded away one by one.
    image = np.zeros((4, 4))
    image[0, 2] = 2.0**25
    image[3] = [0.0, 3.0, 0.0, 3.0]  # two votes of 3 after the two of 2**25
    g_row, g_col = np.zeros((4, 4)), np.zeros((4, 4))
    g_row[1:-1], g_col[:, 1:-1] = image[2:] - image[:-2], image[:, 2:] - image[:, :-2]
    total = np.float32(0.0)
    for magnitude in np.hypot(g_col, g_row).ravel():
        total = np.float32(np.float64(total) + magnitude)
    votes = np.empty(1, dtype=np.float32)
    cell_votes(image.ravel(), 4, 4, 1, 4, 0, 0, orientation_edges(1), votes)
    assert votes[0] == total / np.float32(16)
    assert votes[0] != np.float32(np.hypot(g_col, g_row).sum() / 16)  # what float64 would give
    assert_same(image.reshape(1, -1), 4, 4, 1, 4, 1)


def test_an_orientation_that_rounds_to_180_falls_in_no_bin():
    edges = orientation_edges(9)
    assert orientation_bin(-1e-17, 1.0, edges) == 9  # (-6e-16 degrees) % 180 == 180.0
    assert orientation_bin(0.0, 1.0, edges) == 0
    assert orientation_bin(1.0, 0.0, edges) == 4  # 90 degrees: [80, 100)
    assert orientation_bin(1.0, 1.0, orientation_edges(4)) == 1  # 45 degrees: [45, 90)
    image = np.ones((4, 4))
    image[2, 1] = 1.0 - 2.0**-53 * 2  # g_row = -2**-52 at (1, 1): no vote
    image[1, 2] = 3.0  # g_col = 2 at (1, 1)
    assert orientation_bin(-(2.0**-52), 2.0, edges) == 9
    assert_same(image.reshape(1, -1), 4, 4, 1, 2, 9)


def test_numpy_sum_adds_in_numpy_s_order():
    rng = np.random.default_rng(0)
    for n in [*range(1, 140), 255, 256, 300, 1000]:
        a = rng.random(n) ** 3 * 10.0 ** rng.integers(-5, 5)
        assert numpy_sum(a) == np.sum(a.reshape(1, 1, n))


def test_the_transform_picks_its_driver_by_the_work_and_applies_like_scikit_image():
    spec = InputSpec("grid", (8, 8, 1))
    bound = parse_transform("hog(2, 9)").bind(spec)
    large = HOG_PARALLEL_MIN_VALUES // spec.n_features + 1
    assert bound.hog_driver_for(1) is hog_cells_serial
    if numba.get_num_threads() > 1:
        assert bound.hog_driver_for(large) is hog_cells
    with limit_threads(numba_threads=1):
        assert bound.hog_driver_for(large) is hog_cells_serial
    X = load_digits().data[:large]
    cells = bound.apply(X)
    assert cells.dtype == np.float64
    assert cells.flags.c_contiguous
    np.testing.assert_allclose(cells, reference(X, 8, 8, 1, 2, 9), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(bound.apply(X[:1]), cells[:1])
