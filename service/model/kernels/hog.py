r"""HOG cells compiled with numba: the ``hog(cell_size, orientations)`` transform of a batch.

The numbers are scikit-image's (0.26): ``skimage.feature.hog(image, orientations,
pixels_per_cell=(cell, cell), cells_per_block=(1, 1), block_norm="L2-Hys",
feature_vector=False)`` of each image (``channel_axis=-1`` for colour), raveled, so models fitted
on its cells keep their meaning. Its quirks are kept on purpose:

- Gradients are central differences, zero on the first and last row (``g_row``) and column
  (``g_col``). A colour pixel takes the gradient of its channel of largest magnitude, the first
  one on ties.
- A pixel's orientation is ``atan2(g_row, g_col)`` in degrees, modulo 180; it votes its whole
  magnitude ``hypot(g_col, g_row)`` (no interpolation) into bin ``i`` when
  :math:`e_i \le \theta < e_{i+1}`, with float64 edges :math:`e_i = (180 / n) \cdot i`. An
  orientation at or above the last edge (one that rounds up to 180) falls in no bin.
- Cell ``(r, c)`` of size :math:`s` reads the pixels of ``[r s, (r + 1) s) x [c s, (c + 1) s)``;
  rows and columns past the last whole cell are not read.
- Each bin sums its votes in float32, in row-major order, then is divided by :math:`s^2` in
  float32: scikit-image's ``cell_hog`` keeps its total in a C ``float`` whatever the image's
  dtype (a float64 sum would differ by about 1e-7, relative, and change models' inputs).
- Each cell is L2-Hys normalised on its own, in float64, with :math:`\epsilon = 10^{-5}`:

  .. math::

      v = \frac{h}{\sqrt{\|h\|^2 + \epsilon^2}}, \quad w = \min(v, 0.2), \quad
      \mathrm{out} = \frac{w}{\sqrt{\|w\|^2 + \epsilon^2}}

  so a cell without gradient is all zeros.

The sums of squares of the normalisation are added in numpy's pairwise order
(:func:`numpy_sum`), so the cells equal scikit-image's to the bit wherever numpy computes
``arctan2`` and ``hypot`` as the C library does (these kernels call the C library's). On some
CPUs numpy has SIMD versions of its own (``arctan2`` on AVX-512), which differ from it in the last
bit now and then; that changes a pixel's bin only when its orientation is within a rounding error
of a bin edge.

Layout: an image is a flat row of ``height * width * channels`` numbers, row-major as
``(height, width, channels)``; its cells are a flat row of ``(height // cell) * (width // cell) *
orientations`` numbers, row-major as ``(cell row, cell column, bin)``. As elsewhere (see
:mod:`service.model.kernels.dense`): pure serial kernels on one image, a parallel driver over
images and a serial one beside it, both writing into a preallocated output; callers go through
:meth:`service.model.inputs.transforms.BoundTransform.apply`, which picks one and takes
:data:`service.model.threads.PARALLEL_REGION` for the parallel one. No fastmath: the votes and
bins must come out as scikit-image's.
"""

import math

import numba
import numpy as np

# L2-Hys as scikit-image normalises a block: eps = 1e-5, squared in Python (as numpy does).
_EPS_SQUARED = 1e-5**2
_HYS_CLIP = 0.2
_DEGREES = 180 / np.pi


@numba.njit(cache=True, nogil=True)
def orientation_edges(orientations):
    r"""Bin edges :math:`e_i = (180 / n) \cdot i`, ``i = 0..n``, in float64 as scikit-image
    computes them (so :math:`e_n` may miss 180 by a rounding error).

    Parameters
    ----------
    orientations : int
        ``n``, at least 1.

    Returns
    -------
    ndarray of shape (orientations + 1,), float64
    """
    edges = np.empty(orientations + 1)
    for i in range(orientations + 1):
        edges[i] = 180.0 / orientations * i
    return edges


@numba.njit(cache=True, nogil=True)
def pixel_gradient(x, height, width, channels, r, c):
    r"""Central-difference gradient of pixel ``(r, c)``, of its dominant channel.

    .. math::

        g_{row} = x_{r+1, c} - x_{r-1, c}, \quad g_{col} = x_{r, c+1} - x_{r, c-1}

    each 0 on the image's border along its axis; with several channels, those of the first
    channel ``k`` of largest ``hypot(g_row[k], g_col[k])``.

    Parameters
    ----------
    x : ndarray of shape (height * width * channels,)
    height, width, channels : int
    r, c : int
        Row and column of the pixel.

    Returns
    -------
    g_row, g_col : float
    """
    up = ((r - 1) * width + c) * channels
    down = ((r + 1) * width + c) * channels
    left = (r * width + c - 1) * channels
    right = (r * width + c + 1) * channels
    row_inside = 0 < r < height - 1
    col_inside = 0 < c < width - 1
    best_row = best_col = 0.0
    best = -1.0
    for k in range(channels):
        g_row = x[down + k] - x[up + k] if row_inside else 0.0
        g_col = x[right + k] - x[left + k] if col_inside else 0.0
        if channels == 1:
            return g_row, g_col
        magnitude = math.hypot(g_row, g_col)
        if magnitude > best:  # strictly: the first channel wins ties, as numpy's argmax
            best, best_row, best_col = magnitude, g_row, g_col
    return best_row, best_col


@numba.njit(cache=True, nogil=True)
def orientation_bin(g_row, g_col, edges):
    r"""The bin a gradient votes in: ``i`` with :math:`e_i \le \theta < e_{i+1}`, or ``n``
    (no bin) when :math:`\theta` rounds to 180.

    .. math:: \theta = \left(\operatorname{atan2}(g_{row}, g_{col}) \cdot 180 / \pi\right)
              \bmod 180 \in [0, 180]

    Parameters
    ----------
    g_row, g_col : float
    edges : ndarray of shape (n + 1,)
        :func:`orientation_edges`.

    Returns
    -------
    int in ``[0, n]``
    """
    n = edges.shape[0] - 1
    theta = math.atan2(g_row, g_col) * _DEGREES % 180.0
    i = min(int(theta * n / 180.0), n - 1)  # a guess; the edges settle it
    while i > 0 and theta < edges[i]:
        i -= 1
    while i < n and theta >= edges[i + 1]:
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def cell_votes(x, height, width, channels, cell, cell_row, cell_col, edges, votes):
    r"""The histogram of one cell, as scikit-image computes it: each pixel of the cell, in
    row-major order, adds ``hypot(g_col, g_row)`` to its bin's float32 total, and each total is
    then divided by ``cell * cell`` in float32.

    .. math:: h_i = \mathrm{fl}_{32}\Big(\sum_{p \in \mathrm{cell},\ \mathrm{bin}(p) = i}
              |g_p|\Big) \,/\, s^2

    Parameters
    ----------
    x : ndarray of shape (height * width * channels,)
    height, width, channels, cell, cell_row, cell_col : int
    edges : ndarray of shape (n + 1,)
        :func:`orientation_edges`.
    votes : ndarray of shape (n,), float32
        Overwritten with ``h``.
    """
    n = votes.shape[0]
    votes[:] = 0.0
    for r in range(cell_row * cell, (cell_row + 1) * cell):
        for c in range(cell_col * cell, (cell_col + 1) * cell):
            g_row, g_col = pixel_gradient(x, height, width, channels, r, c)
            i = orientation_bin(g_row, g_col, edges)
            if i < n:
                # float32 on purpose: scikit-image's `float total; total += <double>` sums in
                # double and rounds back to float at each vote.
                votes[i] = np.float32(np.float64(votes[i]) + math.hypot(g_col, g_row))
    area = np.float32(cell * cell)
    for i in range(n):
        votes[i] = votes[i] / area  # float / int in C: a float32 division


@numba.njit(cache=True, nogil=True)
def numpy_sum(a):
    r""":math:`\sum_i a_i` added in the order of numpy's ``np.sum`` of a contiguous float64
    array (pairwise: 8 running sums over blocks of up to 128, halves beyond), so that the
    normalisation rounds as scikit-image's does.

    Parameters
    ----------
    a : ndarray of shape (n,), float64

    Returns
    -------
    float
    """
    n = a.shape[0]
    if n < 8:
        total = 0.0
        for i in range(n):
            total += a[i]
        return total
    if n <= 128:
        r0, r1, r2, r3 = a[0], a[1], a[2], a[3]
        r4, r5, r6, r7 = a[4], a[5], a[6], a[7]
        i = 8
        while i < n - n % 8:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            total += a[i]
            i += 1
        return total
    half = n // 2
    half -= half % 8
    return numpy_sum(a[:half]) + numpy_sum(a[half:])


@numba.njit(cache=True, nogil=True)
def l2_hys(votes, squares, out_cell):
    r"""L2-Hys normalisation of one cell, in float64, as scikit-image's
    ``_hog_normalize_block`` computes it.

    .. math::

        v = \frac{h}{\sqrt{\sum_i h_i^2 + \epsilon^2}}, \quad w = \min(v, 0.2), \quad
        \mathrm{out} = \frac{w}{\sqrt{\sum_i w_i^2 + \epsilon^2}}, \quad \epsilon = 10^{-5}

    Parameters
    ----------
    votes : ndarray of shape (n,), float32
        ``h``, from :func:`cell_votes`.
    squares : ndarray of shape (n,), float64
        Scratch.
    out_cell : ndarray of shape (n,), float64
        Written.
    """
    n = votes.shape[0]
    for i in range(n):
        h = np.float64(votes[i])
        squares[i] = h * h
    norm = math.sqrt(numpy_sum(squares) + _EPS_SQUARED)
    for i in range(n):
        w = min(np.float64(votes[i]) / norm, _HYS_CLIP)
        out_cell[i] = w
        squares[i] = w * w
    norm = math.sqrt(numpy_sum(squares) + _EPS_SQUARED)
    for i in range(n):
        out_cell[i] = out_cell[i] / norm


@numba.njit(cache=True, nogil=True)
def hog_image(x, height, width, channels, cell, edges, votes, squares, out_row):
    """HOG cells of one image: :func:`cell_votes` then :func:`l2_hys` of every whole cell.

    Parameters
    ----------
    x : ndarray of shape (height * width * channels,)
    height, width, channels, cell : int
    edges : ndarray of shape (n + 1,)
        :func:`orientation_edges`.
    votes : ndarray of shape (n,), float32
        Scratch.
    squares : ndarray of shape (n,), float64
        Scratch.
    out_row : ndarray of shape ((height // cell) * (width // cell) * n,)
        Written, row-major as ``(cell row, cell column, bin)``.
    """
    n = votes.shape[0]
    n_cols = width // cell
    for cell_row in range(height // cell):
        for cell_col in range(n_cols):
            cell_votes(x, height, width, channels, cell, cell_row, cell_col, edges, votes)
            start = (cell_row * n_cols + cell_col) * n
            l2_hys(votes, squares, out_row[start : start + n])


@numba.njit(parallel=True, cache=True, nogil=True)
def hog_cells(X, height, width, channels, cell, orientations, out):
    """Fill ``out[i]`` with the HOG cells of image ``X[i]`` (:func:`hog_image`), images in
    parallel.

    Parameters
    ----------
    X : ndarray of shape (n_samples, height * width * channels), float64
    height, width, channels : int
        ``channels`` is 1 (grey) or 3 (colour); any count works.
    cell : int
        Cell size in pixels, at most ``min(height, width)``.
    orientations : int
    out : ndarray of shape (n_samples, (height // cell) * (width // cell) * orientations)
        Written in place.
    """
    edges = orientation_edges(orientations)
    for i in numba.prange(X.shape[0]):
        votes = np.empty(orientations, dtype=np.float32)
        squares = np.empty(orientations)
        hog_image(X[i], height, width, channels, cell, edges, votes, squares, out[i])


@numba.njit(cache=True, nogil=True)
def hog_cells_serial(X, height, width, channels, cell, orientations, out):
    """:func:`hog_cells` on the calling thread, for small batches."""
    edges = orientation_edges(orientations)
    votes = np.empty(orientations, dtype=np.float32)
    squares = np.empty(orientations)
    for i in range(X.shape[0]):
        hog_image(X[i], height, width, channels, cell, edges, votes, squares, out[i])
