"""The grid similarity kernels against a brute-force numpy reference."""

import itertools

import numpy as np
import pytest

from service.model.kernels import dense as dense_kernels
from service.model.kernels import grid as grid_kernels


def reference_rigid(b, x, height, width, channels, h):
    """max over shifts of the sum of cell products, zero padding, by explicit shifts."""
    bg = b.reshape(height, width, channels)
    xp = np.pad(x.reshape(height, width, channels), ((h, h), (h, h), (0, 0)))
    return max(
        float(np.sum(bg * xp[h + dy : h + dy + height, h + dx : h + dx + width]))
        for dy, dx in itertools.product(range(-h, h + 1), repeat=2)
    )


def reference_deformable(b, x, height, width, channels, h_r, h_l):
    """max over rigid shifts of the sum over cells of the max over local shifts, explicitly."""
    reach = h_r + h_l
    bg = b.reshape(height, width, channels)
    xp = np.pad(x.reshape(height, width, channels), ((reach, reach), (reach, reach), (0, 0)))
    # products[reach + oy, reach + ox, r, c] = <b_(r, c), x_(r + oy, c + ox)>
    products = np.empty((2 * reach + 1, 2 * reach + 1, height, width))
    for oy, ox in itertools.product(range(2 * reach + 1), repeat=2):
        products[oy, ox] = np.sum(bg * xp[oy : oy + height, ox : ox + width], axis=2)
    best = -np.inf
    for zy, zx in itertools.product(range(-h_r, h_r + 1), repeat=2):
        cy, cx = reach + zy, reach + zx  # the rigid shift, as an index of products
        local = products[cy - h_l : cy + h_l + 1, cx - h_l : cx + h_l + 1].max(axis=(0, 1))
        best = max(best, float(np.sum(local)))
    return best


def reference_matrix(reference, basis, X, *args):
    return np.array([[reference(b, x, *args) for b in basis] for x in X])


def rounding_bound(basis, X):
    """A bound on the rounding error of every sum these kernels compute, shape (n_x, n_basis).

    Each score is a sum of products ``b_i x_j`` that uses every ``b_i`` at most once, added in
    any order (fastmath lets LLVM reassociate), so its error is at most
    ``gamma_m * sum |b_i x_j| <= m u ||b||_1 ||x||_inf`` for ``m`` terms (products rounded too).
    ``m <= 2 n``: deformable matching with one channel splits ``b`` into ``max(b, 0)`` and
    ``min(b, 0)``. So ``2 n eps ||b||_1 ||x||_inf`` bounds it with room to spare; a maximum of
    such sums is off by no more than the worst of them.
    """
    n = basis.shape[1]
    scale = np.outer(np.abs(X).max(axis=1), np.abs(basis).sum(axis=1))
    return 2 * n * np.finfo(np.float64).eps * scale


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# (height, width, channels): digits-like, HOG-like, non-square, single cells, colour.
GRIDS = [(8, 8, 1), (4, 4, 9), (5, 3, 1), (3, 5, 3), (1, 1, 1), (1, 1, 3), (2, 3, 2), (1, 6, 1)]
RIGID = [grid_kernels.rigid_similarities, grid_kernels.rigid_similarities_serial]
DEFORMABLE = [grid_kernels.deformable_similarities, grid_kernels.deformable_similarities_serial]
# (h_r, h_l), including shifts as large as or larger than the grids above.
DEFORMATIONS = [(0, 1), (1, 1), (2, 1), (1, 2), (0, 3), (4, 3), (9, 1)]


def grids(rng, n, shape):
    return rng.normal(size=(n, int(np.prod(shape))))


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("h", [0, 1, 2, 7])
def test_rigid_pair_equals_reference(rng, shape, h):
    for b, x in zip(grids(rng, 3, shape), grids(rng, 3, shape), strict=True):
        expected = reference_rigid(b, x, *shape, h)
        got = grid_kernels.rigid_pair(b, x, *shape, h)
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("driver", RIGID)
@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("h", [1, 2, 9])
def test_rigid_drivers_equal_reference(rng, driver, shape, h):
    # 6 basis items: one full tile of 4 and a partial one.
    basis, X = grids(rng, 6, shape), grids(rng, 5, shape)
    out = np.full((5, 6), np.nan)
    driver(basis, X, *shape, h, out)
    expected = reference_matrix(reference_rigid, basis, X, *shape, h)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("driver", RIGID + DEFORMABLE)
@pytest.mark.parametrize("shape", [(8, 8, 1), (3, 5, 3), (1, 1, 1)])
def test_no_shift_is_the_inner_product(rng, driver, shape):
    basis, X = grids(rng, 7, shape), grids(rng, 4, shape)
    out = np.full((4, 7), np.nan)
    shifts = (0,) if driver in RIGID else (0, 0)
    driver(basis, X, *shape, *shifts, out)
    np.testing.assert_allclose(out, X @ basis.T, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("channels", [1, 3])
def test_rigid_ignores_a_one_cell_shift_and_linear_does_not(rng, channels):
    image = np.zeros((6, 7, channels))
    image[1:5, 1:6] = rng.normal(size=(4, 5, channels))  # an empty border: nothing falls off
    moved = np.roll(image, (1, -1), axis=(0, 1))
    template = np.zeros_like(image)
    template[1:5, 1:6] = image[1:5, 1:6] + 0.3 * rng.normal(size=(4, 5, channels))
    basis = template.reshape(1, -1)
    X = np.stack([image.ravel(), moved.ravel()])
    rigid, linear = np.empty((2, 1)), np.empty((2, 1))
    grid_kernels.rigid_similarities_serial(basis, X, 6, 7, channels, 1, rigid)
    dense_kernels.linear_similarities_serial(basis, X, linear)
    bound = rounding_bound(basis, X)[:, 0]
    # The moved image scores what the image does (the same products, summed in another order)...
    assert abs(rigid[0, 0] - rigid[1, 0]) <= bound[0] + bound[1]
    # ...and the zero shift is the inner product, so rigid >= linear up to the rounding of both.
    assert rigid[0, 0] >= linear[0, 0] - 2 * bound[0]
    assert abs(linear[0, 0] - linear[1, 0]) > 0.1 * abs(linear[0, 0])


def test_padding_zero_takes_part_in_the_maximum():
    b, x = np.array([-1.0]), np.array([2.0])
    assert grid_kernels.rigid_pair(b, x, 1, 1, 1, 0) == -2.0
    assert grid_kernels.rigid_pair(b, x, 1, 1, 1, 1) == 0.0
    assert grid_kernels.deformable_pair(b, x, 1, 1, 1, 0, 1) == 0.0
    out = np.empty((1, 1))
    for driver in DEFORMABLE:
        driver(b[None], x[None], 1, 1, 1, 0, 1, out)
        assert out[0, 0] == 0.0
        driver(b[None], x[None], 1, 1, 1, 0, 0, out)
        assert out[0, 0] == -2.0


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize(("h_r", "h_l"), DEFORMATIONS)
def test_deformable_pair_equals_reference(rng, shape, h_r, h_l):
    for b, x in zip(grids(rng, 2, shape), grids(rng, 2, shape), strict=True):
        expected = reference_deformable(b, x, *shape, h_r, h_l)
        got = grid_kernels.deformable_pair(b, x, *shape, h_r, h_l)
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("driver", DEFORMABLE)
@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize(("h_r", "h_l"), DEFORMATIONS)
def test_deformable_drivers_equal_reference(rng, driver, shape, h_r, h_l):
    basis, X = grids(rng, 5, shape), grids(rng, 3, shape)
    out = np.full((3, 5), np.nan)
    driver(basis, X, *shape, h_r, h_l, out)
    expected = reference_matrix(reference_deformable, basis, X, *shape, h_r, h_l)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("rigid", "deformable"), list(zip(RIGID, DEFORMABLE, strict=True)))
@pytest.mark.parametrize("shape", [(8, 8, 1), (4, 4, 9), (5, 3, 1)])
@pytest.mark.parametrize("h", [0, 1, 2])
def test_deformable_without_local_shift_is_rigid_and_local_shifts_only_add(
    rng, rigid, deformable, shape, h
):
    basis, X = grids(rng, 6, shape), grids(rng, 5, shape)
    expected, same, more = (np.full((5, 6), np.nan) for _ in range(3))
    rigid(basis, X, *shape, h, expected)
    deformable(basis, X, *shape, h, 0, same)
    deformable(basis, X, *shape, h, 1, more)
    np.testing.assert_allclose(same, expected, rtol=1e-10, atol=1e-12)
    # Local shifts include none: more >= expected up to the rounding of both sums.
    assert (more >= expected - 2 * rounding_bound(basis, X)).all()
    assert (more > expected + 1e-6).any()


@pytest.mark.parametrize("driver", DEFORMABLE)
@pytest.mark.parametrize("channels", [1, 2])
def test_deformable_lets_each_basis_cell_pick_its_input_cell(driver, channels):
    # On a 1 x 3 strip with local shifts of one cell, every cell of an all-ones item reaches the
    # input's single bright cell (3), but only one cell of that input is bright (1).
    ones = np.ones((1, 3, channels)).ravel()
    spot = np.zeros((1, 3, channels))
    spot[0, 1] = 1.0 / channels
    spot = spot.ravel()
    out = np.empty((1, 2))
    driver(np.stack([ones, spot]), spot[None], 1, 3, channels, 0, 1, out)
    np.testing.assert_allclose(out, [[3.0, 1.0 / channels]], rtol=1e-12)
    assert grid_kernels.deformable_pair(ones, spot, 1, 3, channels, 0, 1) == pytest.approx(3.0)
    assert grid_kernels.deformable_pair(spot, ones, 1, 3, channels, 0, 1) == pytest.approx(1.0)


@pytest.mark.parametrize("n_basis", [1, 2, 3, 4, 130])
@pytest.mark.parametrize("shape", [(3, 3, 1), (2, 3, 2)])
def test_any_number_of_basis_items(rng, n_basis, shape):
    # Rigid scores 4 items at a time; deformable with channels vectorises over blocks of 128.
    basis, X = grids(rng, n_basis, shape), grids(rng, 2, shape)
    rigid = reference_matrix(reference_rigid, basis, X, *shape, 1)
    deformable = reference_matrix(reference_deformable, basis, X, *shape, 1, 1)
    for driver, args, expected in [
        *((driver, (1,), rigid) for driver in RIGID),
        *((driver, (1, 1), deformable) for driver in DEFORMABLE),
    ]:
        out = np.full((2, n_basis), np.nan)
        driver(basis, X, *shape, *args, out)
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("rigid", "deformable"), list(zip(RIGID, DEFORMABLE, strict=True)), ids=["parallel", "serial"]
)
@pytest.mark.parametrize("shape", [(8, 8, 1), (3, 5, 3)])
def test_drivers_write_into_a_strided_block_and_nowhere_else(rng, rigid, deformable, shape):
    basis, X = grids(rng, 5, shape), grids(rng, 4, shape)
    wide = np.full((4, 14), -99.0)
    rigid(basis, X, *shape, 1, wide[:, 2:7])
    deformable(basis, X, *shape, 1, 1, wide[:, 8:13])
    np.testing.assert_allclose(
        wide[:, 2:7], reference_matrix(reference_rigid, basis, X, *shape, 1), rtol=1e-10
    )
    np.testing.assert_allclose(
        wide[:, 8:13], reference_matrix(reference_deformable, basis, X, *shape, 1, 1), rtol=1e-10
    )
    assert (wide[:, [0, 1, 7, 13]] == -99.0).all()


def test_accumulation_is_float64_on_large_values():
    # float32 accumulation would lose the +1 against 1e8-sized terms.
    b = np.array([1e8, 1.0, -1e8])
    x = np.array([1.0, 1.0, 1.0])
    assert grid_kernels.rigid_pair(b, x, 1, 3, 1, 0) == 1.0
    assert grid_kernels.deformable_pair(b, x, 3, 1, 1, 0, 0) == 1.0
