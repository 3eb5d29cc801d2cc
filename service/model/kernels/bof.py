r"""Images as bags of visual words, compiled with numba: the ``bof`` transform's descriptors,
word assignment and spatial-pyramid counts.

**Descriptors.** A patch of ``4 s x 4 s`` pixels is described as SIFT lays it out: 4 x 4 spatial
bins of ``s x s`` pixels, 8 orientation bins each, 128 numbers, L2-normalised, clipped at 0.2
and normalised again (L2-Hys). The numbers are scikit-image's HOG blocks:
``skimage.feature.hog(image, orientations=8, pixels_per_cell=(s, s), cells_per_block=(4, 4),
block_norm="L2-Hys", feature_vector=False)[r, c].ravel()`` is the descriptor of the patch whose
top-left pixel is ``(r s, c s)``, so the gradients are those of the whole image (a patch's
border pixels see their neighbours outside it, as in SIFT) and the cells are the HOG transform's
(:func:`service.model.kernels.hog.cell_votes`: float32 votes, unsigned orientations). Unlike
Lowe's SIFT there is no Gaussian weighting, no trilinear interpolation between bins, and the
orientations are unsigned (0-180 degrees): the HOG kernels' numbers, which are tested against
scikit-image, serve both transforms.

**Words.** Each descriptor becomes the index of its nearest vocabulary centre (squared Euclidean
distance, the first centre on ties, as ``numpy.argmin``).

.. math:: w(d) = \operatorname{arg\,min}_k \lVert d - c_k \rVert_2^2

**Pyramid counts.** Level ``l`` cuts the image into ``2^l x 2^l`` cells; a patch belongs to the
cell holding its centre pixel. Each cell of each level kept is one document of word counts:
row ``i * n_cells + c`` of a CSR matrix over the vocabulary, for image ``i`` and cell ``c``
(cells numbered level by level, row-major within a level). The layout (which patches fall in
which cell) depends only on the image size, so it is computed once per model
(:class:`service.model.inputs.bof.PyramidLayout`).

Layout of an image: a flat row of ``height * width * channels`` numbers, row-major as
``(height, width, channels)``, as everywhere. Patches are numbered row-major; ``patch_rows x
patch_cols`` of them, top-left pixels every ``step_cells * s`` pixels. As in the other kernel
modules, one loop over images is compiled into a parallel and a serial driver
(:func:`service.model.kernels.row_drivers`); callers go through
:class:`service.model.inputs.bof.BoundBagOfFeatures`, which picks one and takes
:data:`service.model.threads.PARALLEL_REGION` for the parallel one. The descriptors use no
fastmath (their numbers are scikit-image's); the nearest-centre search does.
"""

import numba
import numpy as np

from service.model.kernels import row_drivers
from service.model.kernels.dense import squared_euclidean_pair
from service.model.kernels.hog import cell_votes, l2_hys, orientation_edges
from service.model.threads import FASTMATH

# SIFT's layout: 4 x 4 spatial bins of 8 orientations.
SPATIAL_BINS = 4
ORIENTATIONS = 8
DESCRIPTOR_LENGTH = SPATIAL_BINS * SPATIAL_BINS * ORIENTATIONS


@numba.njit(cache=True, nogil=True)
def image_descriptors(
    x, height, width, channels, cell, step_cells, patch_rows, patch_cols, edges, votes, block,
    squares, out,
):  # fmt: skip
    r"""The descriptor of every patch of one image.

    .. math:: d_{rc} = \text{L2-Hys}\big(h_{r s', c s'} \dots h_{r s' + 3, c s' + 3}\big),
              \quad s' = \text{step\_cells}

    where :math:`h` are the image's HOG cells of ``cell`` pixels (8 bins, before any
    normalisation), the 16 cells of a patch laid row-major as ``(cell row, cell column, bin)``.

    Parameters
    ----------
    x : ndarray of shape (height * width * channels,)
    height, width, channels, cell, step_cells, patch_rows, patch_cols : int
    edges : ndarray of shape (9,)
        :func:`~service.model.kernels.hog.orientation_edges` of 8 bins.
    votes : ndarray of shape ((height // cell) * (width // cell) * 8,), float32
        Scratch: every cell's histogram.
    block : ndarray of shape (128,), float32
        Scratch.
    squares : ndarray of shape (128,), float64
        Scratch.
    out : ndarray of shape (patch_rows * patch_cols, 128)
        Written, patches row-major.
    """
    n = edges.shape[0] - 1
    cell_cols = width // cell
    for r in range(height // cell):
        for c in range(cell_cols):
            start = (r * cell_cols + c) * n
            cell_votes(x, height, width, channels, cell, r, c, edges, votes[start : start + n])
    for pr in range(patch_rows):
        for pc in range(patch_cols):
            k = 0
            for dr in range(SPATIAL_BINS):
                row = pr * step_cells + dr
                for dc in range(SPATIAL_BINS):
                    start = (row * cell_cols + pc * step_cells + dc) * n
                    for o in range(n):
                        block[k] = votes[start + o]
                        k += 1
            l2_hys(block, squares, out[pr * patch_cols + pc])


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def nearest_centre(descriptor, centres):
    r"""The index of the centre nearest ``descriptor``, the first one on ties.

    .. math:: w = \operatorname{arg\,min}_k \lVert d - c_k \rVert_2^2

    Parameters
    ----------
    descriptor : ndarray of shape (D,)
    centres : ndarray of shape (W, D)

    Returns
    -------
    int
    """
    best = np.inf
    best_word = 0
    for k in range(centres.shape[0]):
        distance = squared_euclidean_pair(centres[k], descriptor)
        if distance < best:
            best = distance
            best_word = k
    return best_word


def bof_descriptors(X, height, width, channels, cell, step_cells, patch_rows, patch_cols, out):
    """Fill ``out[i]`` with :func:`image_descriptors` of image ``X[i]``, images in parallel.

    Parameters
    ----------
    X : ndarray of shape (n_samples, height * width * channels), float64
    height, width, channels, cell, step_cells, patch_rows, patch_cols : int
    out : ndarray of shape (n_samples, patch_rows * patch_cols, 128)
    """
    edges = orientation_edges(ORIENTATIONS)
    n_votes = (height // cell) * (width // cell) * ORIENTATIONS
    for i in numba.prange(X.shape[0]):
        votes = np.empty(n_votes, dtype=np.float32)
        block = np.empty(DESCRIPTOR_LENGTH, dtype=np.float32)
        squares = np.empty(DESCRIPTOR_LENGTH)
        image_descriptors(
            X[i], height, width, channels, cell, step_cells, patch_rows, patch_cols, edges,
            votes, block, squares, out[i],
        )  # fmt: skip


bof_descriptors, bof_descriptors_serial = row_drivers(bof_descriptors)


def bof_words(
    X, height, width, channels, cell, step_cells, patch_rows, patch_cols, centres, words, finite
):
    """The word of every patch of every image (:func:`image_descriptors`, then
    :func:`nearest_centre`), images in parallel.

    Parameters
    ----------
    X : ndarray of shape (n_samples, height * width * channels), float64
    height, width, channels, cell, step_cells, patch_rows, patch_cols : int
    centres : ndarray of shape (W, 128), float64, C-contiguous
    words : ndarray of shape (n_samples, patch_rows * patch_cols), int64
        Written.
    finite : ndarray of shape (n_samples,), bool
        Written: False where a descriptor holds NaN or infinity (pixel values so large that
        the float32 votes overflow); that image's words mean nothing.
    """
    edges = orientation_edges(ORIENTATIONS)
    n_votes = (height // cell) * (width // cell) * ORIENTATIONS
    n_patches = patch_rows * patch_cols
    for i in numba.prange(X.shape[0]):
        votes = np.empty(n_votes, dtype=np.float32)
        block = np.empty(DESCRIPTOR_LENGTH, dtype=np.float32)
        squares = np.empty(DESCRIPTOR_LENGTH)
        descriptors = np.empty((n_patches, DESCRIPTOR_LENGTH))
        image_descriptors(
            X[i], height, width, channels, cell, step_cells, patch_rows, patch_cols, edges,
            votes, block, squares, descriptors,
        )  # fmt: skip
        finite[i] = np.isfinite(descriptors).all()
        for p in range(n_patches):
            words[i, p] = nearest_centre(descriptors[p], centres)


bof_words, bof_words_serial = row_drivers(bof_words)


@numba.njit(cache=True, nogil=True)
def pyramid_counts(words, cell_indptr, cell_patches, out_indptr, out_indices, out_counts):
    r"""Word counts of every cell of every image, as CSR rows ``i * n_cells + c``.

    .. math:: x_{i, c, w} = \lvert\{p \in \text{cell } c : w_{i p} = w\}\rvert

    Parameters
    ----------
    words : ndarray of shape (n_samples, n_patches), int64
        From :func:`bof_words`.
    cell_indptr : ndarray of shape (n_cells + 1,), int64
    cell_patches : ndarray of shape (cell_indptr[-1],), int64
        The patches of cell ``c`` are ``cell_patches[cell_indptr[c]:cell_indptr[c + 1]]``.
    out_indptr : ndarray of shape (n_samples * n_cells + 1,), int64
        Written.
    out_indices, out_counts : ndarray of shape (n_samples * cell_indptr[-1],)
        Written up to the returned length: each row's words ascending, with their counts.

    Returns
    -------
    int
        The entries written (the CSR's nnz).
    """
    n_cells = cell_indptr.shape[0] - 1
    scratch = np.empty(cell_patches.shape[0], dtype=np.int64)
    nnz = 0
    out_indptr[0] = 0
    for i in range(words.shape[0]):
        for c in range(n_cells):
            size = cell_indptr[c + 1] - cell_indptr[c]
            for k in range(size):
                scratch[k] = words[i, cell_patches[cell_indptr[c] + k]]
            cell_words = np.sort(scratch[:size])
            k = 0
            while k < size:
                word = cell_words[k]
                run = k
                while run < size and cell_words[run] == word:
                    run += 1
                out_indices[nnz] = word
                out_counts[nnz] = run - k
                nnz += 1
                k = run
            out_indptr[i * n_cells + c + 1] = nnz
    return nnz
