r"""Grid similarity kernels compiled with numba: rigid and deformable matching of cell grids.

An item is a grid of ``height x width`` cells with ``channels`` numbers per cell, flattened
row-major as ``(height, width, channels)``: cell ``(r, c)`` holds the entries
``[(r * width + c) * channels, (r * width + c + 1) * channels)``. Cells outside the grid are zero
vectors (zero padding): their inner product with any cell is 0, and that 0 takes part in every
maximum. Shifts may be larger than the grid. A rigid shift that moves everything off the grid
scores exactly 0, as does any larger one, so the kernels compute only the shifts that keep some
overlap and start their maximum at 0 when there are others (:func:`_reach`).

The same layout as :mod:`service.model.kernels.dense`: pure serial kernels on a pair and on a
row (one input against the whole basis), a parallel driver over input rows and a serial one beside
it. Accumulators are float64.

- Rigid matching builds each input's zero-padded shifted copies once, then scores every basis
  item against them with contiguous dot products, four items by three shifts at a time so that
  each loaded value feeds several multiply-adds (:func:`_max_dots`).
- Deformable matching computes, per cell, the products of each basis item with the input's cell
  at every total offset once, then the local maxima as separable box maxima over offsets, then
  the rigid sums and their maximum; the row kernel does this for a block of basis items at once,
  vectorised over the items (:func:`_deformable_blocks`).
- With one channel the local maximum depends on the basis item only through its sign:
  :math:`\max_z b\,x_z = b \max_z x_z` for :math:`b \ge 0` and :math:`b \min_z x_z` otherwise,
  exactly, in floating point too. The row kernel then box-filters the input once, and deformable
  matching becomes rigid matching of ``[max(b, 0), min(b, 0)]`` against the filtered input
  ``[max, min]`` (:func:`_extreme_copies`): about twice the cost of rigid matching.
"""

import numba
import numpy as np

from service.model.kernels import Drivers, row_drivers
from service.model.threads import FASTMATH

# Shifts scored together per tile of 4 basis items in :func:`_max_dots`.
_SHIFT_TILE = 3
# Basis items per vector in :func:`_deformable_blocks`: loops this long amortise their setup.
_BASIS_BLOCK = 128


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _reach(h, h_l, size):
    """Largest rigid shift worth computing along an axis of ``size`` cells.

    With local shifts up to ``h_l``, a rigid shift of ``size + h_l`` or more moves every local
    window off the grid: its sum is exactly 0, the same as for any larger shift.
    """
    return min(h, size - 1 + h_l)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _tiles_of(n, size):
    """Number of tiles of ``size`` that hold ``n`` things."""
    return (n + size - 1) // size


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rigid_pair(b, x, height, width, channels, h):
    r"""Rigid (translation invariant) similarity of one basis item and one input grid.

    .. math:: s(b, x) = \max_{z \in \{-h..h\}^2} \sum_{p} \langle b_p, x_{p+z} \rangle

    with cells outside the grid equal to zero.

    Parameters
    ----------
    b, x : ndarray of shape (height * width * channels,)
        Grids flattened row-major as ``(height, width, channels)``.
    height, width, channels : int
    h : int
        Largest shift along each axis, ``>= 0``.

    Returns
    -------
    float
    """
    hy = _reach(h, 0, height)
    hx = _reach(h, 0, width)
    best = 0.0 if hy < h or hx < h else -np.inf
    for dy in range(-hy, hy + 1):
        for dx in range(-hx, hx + 1):
            c0 = max(0, -dx)
            run = (min(width, width - dx) - c0) * channels
            acc = 0.0
            for r in range(max(0, -dy), min(height, height - dy)):
                bo = (r * width + c0) * channels
                xo = ((r + dy) * width + c0 + dx) * channels
                br, xr = b[bo : bo + run], x[xo : xo + run]
                for i in range(run):
                    acc += br[i] * xr[i]
            best = max(best, acc)
    return best


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _max_dots(basis, copies, spans, floor):
    r"""The largest dot product of each basis item with a row of ``copies``.

    .. math:: \mathrm{out}_j = \max\left(f, \max_k \sum_{i} B_{ji} S_{ki}\right)

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n)
    copies : ndarray of shape (3 * n_tiles, n)
        Rows taken three at a time; repeat a row to fill the last tile (it cannot change a max).
    spans : ndarray of shape (n_tiles, 2), int
        ``[start, stop)`` of the entries of a tile's rows that may be non-zero.
    floor : float
        ``f``: ``-inf``, or 0 when some shift leaves the grid altogether.

    Returns
    -------
    ndarray of shape (n_basis,)
    """
    n_basis = basis.shape[0]
    last = n_basis - 1
    out = np.empty(n_basis)
    for j in range(0, n_basis, 4):
        # A tile that runs past the end repeats the last item and drops its results.
        b0 = basis[j]
        b1 = basis[min(j + 1, last)]
        b2 = basis[min(j + 2, last)]
        b3 = basis[min(j + 3, last)]
        m0 = m1 = m2 = m3 = floor
        for t in range(spans.shape[0]):
            # Slices, so that the loop index starts at 0: numba wraps an index it cannot prove
            # non-negative, and LLVM then gathers instead of loading (several times slower).
            lo, hi = spans[t, 0], spans[t, 1]
            s0 = copies[_SHIFT_TILE * t, lo:hi]
            s1 = copies[_SHIFT_TILE * t + 1, lo:hi]
            s2 = copies[_SHIFT_TILE * t + 2, lo:hi]
            c0, c1, c2, c3 = b0[lo:hi], b1[lo:hi], b2[lo:hi], b3[lo:hi]
            a00 = a01 = a02 = a10 = a11 = a12 = 0.0
            a20 = a21 = a22 = a30 = a31 = a32 = 0.0
            for i in range(hi - lo):
                v0, v1, v2 = s0[i], s1[i], s2[i]
                a00 += c0[i] * v0
                a01 += c0[i] * v1
                a02 += c0[i] * v2
                a10 += c1[i] * v0
                a11 += c1[i] * v1
                a12 += c1[i] * v2
                a20 += c2[i] * v0
                a21 += c2[i] * v1
                a22 += c2[i] * v2
                a30 += c3[i] * v0
                a31 += c3[i] * v1
                a32 += c3[i] * v2
            m0 = max(m0, max(a00, max(a01, a02)))
            m1 = max(m1, max(a10, max(a11, a12)))
            m2 = max(m2, max(a20, max(a21, a22)))
            m3 = max(m3, max(a30, max(a31, a32)))
        out[j] = m0
        if j + 1 <= last:
            out[j + 1] = m1
        if j + 2 <= last:
            out[j + 2] = m2
        if j + 3 <= last:
            out[j + 3] = m3
    return out


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _rigid_copies(x, height, width, channels, hy, hx):
    r"""Zero-padded shifted copies of one input, and the span of each tile that may be non-zero.

    .. math:: S_{k, p} = x_{p + z_k}, \quad z_k = (dy, dx) \in \{-h_y..h_y\} \times \{-h_x..h_x\}

    Shift ``k = (dy + hy) * (2 hx + 1) + dx + hx``; the last tile is filled with the last shift.

    Returns
    -------
    copies : ndarray of shape (3 * n_tiles, d)
    spans : ndarray of shape (n_tiles, 2), int
        Rows of the grid that a shift ``dy`` leaves empty are outside the span of its tile.
    """
    n_dx = 2 * hx + 1
    n_shifts = (2 * hy + 1) * n_dx
    n_tiles = _tiles_of(n_shifts, _SHIFT_TILE)
    row = width * channels
    copies = np.zeros((_SHIFT_TILE * n_tiles, x.shape[0]))
    spans = np.empty((n_tiles, 2), dtype=np.int64)
    for t in range(n_tiles):
        spans[t, 0] = height * row
        spans[t, 1] = 0
    for k in range(_SHIFT_TILE * n_tiles):
        shift = min(k, n_shifts - 1)
        dy = shift // n_dx - hy
        dx = shift % n_dx - hx
        c0 = max(0, -dx)
        run = (min(width, width - dx) - c0) * channels
        r0 = max(0, -dy)
        r1 = min(height, height - dy)
        for r in range(r0, r1):
            dst = copies[k, (r * width + c0) * channels :]
            src = x[((r + dy) * width + c0 + dx) * channels :]
            for i in range(run):
                dst[i] = src[i]
        t = k // _SHIFT_TILE
        spans[t, 0] = min(spans[t, 0], r0 * row)
        spans[t, 1] = max(spans[t, 1], r1 * row)
    return copies, spans


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _rigid_scores(basis, x, height, width, channels, h):
    """``rigid_pair(basis[j], x, ...)`` for every basis item, as a new array.

    The input's shifted copies are built once (:func:`_rigid_copies`), then :func:`_max_dots`.
    """
    hy = _reach(h, 0, height)
    hx = _reach(h, 0, width)
    floor = 0.0 if hy < h or hx < h else -np.inf
    copies, spans = _rigid_copies(x, height, width, channels, hy, hx)
    return _max_dots(basis, copies, spans, floor)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _write(scores, out_row):
    """Copy ``scores`` into ``out_row``, a row of the output, possibly strided.

    The kernels return new arrays rather than write into ``out_row``, so that they are compiled
    once and not again for each layout of the output.
    """
    for j in range(scores.shape[0]):
        out_row[j] = scores[j]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rigid_row(basis, x, height, width, channels, h, out_row):
    """Fill ``out_row[j] = rigid_pair(basis[j], x, height, width, channels, h)`` for one input."""
    _write(_rigid_scores(basis, x, height, width, channels, h), out_row)


def rigid_similarities(basis, X, height, width, channels, h, out):
    """Fill ``out[i, j] = rigid_pair(basis[j], X[i], height, width, channels, h)``, in parallel.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, height * width * channels)
    X : ndarray of shape (n_samples, height * width * channels)
    height, width, channels : int
    h : int
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    for i in numba.prange(X.shape[0]):
        rigid_row(basis, X[i], height, width, channels, h, out[i])


rigid_similarities, rigid_similarities_serial = row_drivers(rigid_similarities, fastmath=FASTMATH)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _basis_blocks(basis, block):
    """Basis items side by side in blocks of ``block``, for vectorising over items.

    Row ``k * d + i`` holds entry ``i`` of the items of block ``k``; zero past the last item.

    Returns
    -------
    ndarray of shape (n_blocks * d, block)
    """
    n_basis, d = basis.shape
    blocks = np.zeros((_tiles_of(n_basis, block) * d, block))
    for j in range(n_basis):
        rows = blocks[(j // block) * d : (j // block + 1) * d]
        for i in range(d):
            rows[i, j % block] = basis[j, i]
    return blocks


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _deformable_blocks(blocks, x, height, width, channels, h_r, h_l, n_basis):
    r"""Deformable similarity of one input and blocks of basis items, vectorised over the items.

    For each cell ``p`` and each item ``j`` of a block: the products at every total offset, the
    local maxima along ``dx`` then ``dy``, added into the rigid sums:

    .. math::

        G_{o, j} = \langle b_{j, p}, x_{p+o} \rangle, \qquad
        S_{z_r, j} \mathrel{+}= \max_{z_l \in \{-h_l..h_l\}^2} G_{z_r + z_l, j}, \qquad
        \mathrm{out}_j = \max\left(f, \max_{z_r} S_{z_r, j}\right)

    with ``f = 0`` when some rigid shift moves every window off the grid, else ``-inf``. Every
    loop runs over the items of a block, contiguous and long, where a loop over cells would be
    as short as the grid (16 cells of HOG). Offsets are clamped to the grid's size: beyond it
    every product is 0, the same as at the grid's size.

    Parameters
    ----------
    blocks : ndarray of shape (n_blocks * height * width * channels, block)
        :func:`_basis_blocks` of the basis.
    x : ndarray of shape (height * width * channels,)
    height, width, channels : int
    h_r, h_l : int
    n_basis : int

    Returns
    -------
    ndarray of shape (n_basis,)
    """
    ry = _reach(h_r, h_l, height)
    rx = _reach(h_r, h_l, width)
    oy = min(ry + h_l, height)
    ox = min(rx + h_l, width)
    floor = 0.0 if ry < h_r or rx < h_r else -np.inf
    out = np.empty(n_basis)
    block = blocks.shape[1]
    n_cells = height * width
    n_dx = 2 * ox + 1
    n_zx = 2 * rx + 1
    products = np.empty(((2 * oy + 1) * n_dx, block))
    row_max = np.empty(((2 * oy + 1) * n_zx, block))
    col = np.empty(block)
    for k in range(blocks.shape[0] // x.shape[0]):
        sums = np.zeros(((2 * ry + 1) * n_zx, block))
        for p in range(n_cells):
            start = (k * n_cells + p) * channels
            cell = blocks[start : start + channels]
            for o in range(products.shape[0]):
                g = products[o]
                qy = p // width + o // n_dx - oy
                qx = p % width + o % n_dx - ox
                if qy < 0 or qy >= height or qx < 0 or qx >= width:
                    for jj in range(block):
                        g[jj] = 0.0
                    continue
                xq = x[(qy * width + qx) * channels : (qy * width + qx + 1) * channels]
                v, b = xq[0], cell[0]
                for jj in range(block):
                    g[jj] = v * b[jj]
                for ch in range(1, channels):
                    v, b = xq[ch], cell[ch]
                    for jj in range(block):
                        g[jj] += v * b[jj]
            for yi in range(2 * oy + 1):
                for zx in range(-rx, rx + 1):
                    lo = max(zx - h_l, -ox) + ox
                    hi = min(zx + h_l, ox) + ox
                    m = row_max[yi * n_zx + zx + rx]
                    g = products[yi * n_dx + lo]
                    for jj in range(block):
                        m[jj] = g[jj]
                    for xi in range(lo + 1, hi + 1):
                        g = products[yi * n_dx + xi]
                        for jj in range(block):
                            m[jj] = max(m[jj], g[jj])
            for zy in range(-ry, ry + 1):
                lo = max(zy - h_l, -oy) + oy
                hi = min(zy + h_l, oy) + oy
                for zxi in range(n_zx):
                    m = row_max[lo * n_zx + zxi]
                    for jj in range(block):
                        col[jj] = m[jj]
                    for yi in range(lo + 1, hi + 1):
                        m = row_max[yi * n_zx + zxi]
                        for jj in range(block):
                            col[jj] = max(col[jj], m[jj])
                    s = sums[(zy + ry) * n_zx + zxi]
                    for jj in range(block):
                        s[jj] += col[jj]
        best = np.full(block, floor)
        for z in range(sums.shape[0]):
            s = sums[z]
            for jj in range(block):
                best[jj] = max(best[jj], s[jj])
        for jj in range(min(block, n_basis - k * block)):
            out[k * block + jj] = best[jj]
    return out


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def deformable_pair(b, x, height, width, channels, h_r, h_l):
    r"""Deformable similarity of one basis item and one input grid.

    .. math::

        s(b, x) = \max_{z_r \in \{-h_r..h_r\}^2} \sum_{p}
            \max_{z_l \in \{-h_l..h_l\}^2} \langle b_p, x_{p + z_r + z_l} \rangle

    with cells outside the grid equal to zero. ``h_l = 0`` is :func:`rigid_pair`.

    Parameters
    ----------
    b, x : ndarray of shape (height * width * channels,)
        Grids flattened row-major as ``(height, width, channels)``.
    height, width, channels : int
    h_r, h_l : int
        Largest rigid and local shifts along each axis, ``>= 0``.

    Returns
    -------
    float
    """
    if h_l == 0:
        return rigid_pair(b, x, height, width, channels, h_r)
    blocks = np.empty((b.shape[0], 1))
    for i in range(b.shape[0]):
        blocks[i, 0] = b[i]
    return _deformable_blocks(blocks, x, height, width, channels, h_r, h_l, 1)[0]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _extreme_copies(x, height, width, h_l, ry, rx):
    r"""Rigid copies of the box maxima and minima of a one-channel input, for :func:`_max_dots`.

    .. math::

        U_q = \max_{z_l \in \{-h_l..h_l\}^2} x_{q + z_l}, \quad
        L_q = \min_{z_l} x_{q + z_l}, \qquad
        S_k = [U_{p + z_k}, L_{p + z_k}]_p

    with ``x`` zero outside the grid, and ``z_k = (dy, dx)``, ``k = (dy + ry) * (2 rx + 1) + dx +
    rx``; the last tile is filled with the last shift. Every entry may be non-zero: each span
    covers a whole row.

    Returns
    -------
    copies : ndarray of shape (3 * n_tiles, 2 * height * width)
    spans : ndarray of shape (n_tiles, 2), int
    """
    d = height * width
    ext_w = width + 2 * rx
    upper = np.empty((height + 2 * ry, ext_w))
    lower = np.empty((height + 2 * ry, ext_w))
    for qy in range(upper.shape[0]):
        cy = qy - ry
        for qx in range(ext_w):
            cx = qx - rx
            padded = cy - h_l < 0 or cy + h_l >= height or cx - h_l < 0 or cx + h_l >= width
            hi = 0.0 if padded else -np.inf
            lo = 0.0 if padded else np.inf
            for r in range(max(cy - h_l, 0), min(cy + h_l, height - 1) + 1):
                for c in range(max(cx - h_l, 0), min(cx + h_l, width - 1) + 1):
                    hi = max(hi, x[r * width + c])
                    lo = min(lo, x[r * width + c])
            upper[qy, qx] = hi
            lower[qy, qx] = lo
    n_dx = 2 * rx + 1
    n_shifts = (2 * ry + 1) * n_dx
    n_tiles = _tiles_of(n_shifts, _SHIFT_TILE)
    copies = np.empty((_SHIFT_TILE * n_tiles, 2 * d))
    for k in range(copies.shape[0]):
        shift = min(k, n_shifts - 1)
        qy, qx = shift // n_dx, shift % n_dx
        for r in range(height):
            for c in range(width):
                copies[k, r * width + c] = upper[qy + r, qx + c]
                copies[k, d + r * width + c] = lower[qy + r, qx + c]
    spans = np.empty((n_tiles, 2), dtype=np.int64)
    for t in range(n_tiles):
        spans[t, 0] = 0
        spans[t, 1] = 2 * d
    return copies, spans


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def deformable_basis(basis, channels, h_l):
    r"""The basis as :func:`deformable_row` takes it, prepared once per call of a driver.

    ``h_l = 0``: the basis itself (rigid matching). One channel: the sign split
    :math:`[\max(b, 0), \min(b, 0)]` of each item, shape ``(n_basis, 2 d)``. Otherwise
    :func:`_basis_blocks` in blocks of up to :data:`_BASIS_BLOCK` items.
    """
    n_basis, d = basis.shape
    if h_l == 0:
        return basis
    if channels == 1:
        split = np.empty((n_basis, 2 * d))
        for j in range(n_basis):
            for i in range(d):
                split[j, i] = max(basis[j, i], 0.0)
                split[j, d + i] = min(basis[j, i], 0.0)
        return split
    return _basis_blocks(basis, max(min(n_basis, _BASIS_BLOCK), 1))


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def deformable_row(prepared, x, height, width, channels, h_r, h_l, out_row):
    """Fill ``out_row[j] = deformable_pair(basis[j], x, ...)`` for one input.

    ``prepared`` is :func:`deformable_basis` of the basis: ``h_l = 0`` is rigid matching, one
    channel is :func:`_max_dots` of the sign split against :func:`_extreme_copies`, more channels
    are :func:`_deformable_blocks`.
    """
    if h_l == 0:
        scores = _rigid_scores(prepared, x, height, width, channels, h_r)
    elif channels == 1:
        ry = _reach(h_r, h_l, height)
        rx = _reach(h_r, h_l, width)
        floor = 0.0 if ry < h_r or rx < h_r else -np.inf
        copies, spans = _extreme_copies(x, height, width, h_l, ry, rx)
        scores = _max_dots(prepared, copies, spans, floor)
    else:
        scores = _deformable_blocks(
            prepared, x, height, width, channels, h_r, h_l, out_row.shape[0]
        )
    _write(scores, out_row)


def deformable_similarities(basis, X, height, width, channels, h_r, h_l, out):
    """Fill ``out[i, j] = deformable_pair(basis[j], X[i], ...)``, rows in parallel.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, height * width * channels)
    X : ndarray of shape (n_samples, height * width * channels)
    height, width, channels : int
    h_r, h_l : int
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    prepared = deformable_basis(basis, channels, h_l)
    for i in numba.prange(X.shape[0]):
        deformable_row(prepared, X[i], height, width, channels, h_r, h_l, out[i])


deformable_similarities, deformable_similarities_serial = row_drivers(
    deformable_similarities, fastmath=FASTMATH
)


RIGID = Drivers(rigid_similarities_serial, rigid_similarities)
DEFORMABLE = Drivers(deformable_similarities_serial, deformable_similarities)
