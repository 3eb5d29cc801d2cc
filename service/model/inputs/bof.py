r"""Images as bags of visual words on a spatial pyramid: the fitted ``bof`` transform.

The sensing-aware kernel paper (section 5) classifies scenes this way, after Lazebnik et al.:

1. a descriptor of every ``patch x patch`` patch, every ``step`` pixels (SIFT-like: 4 x 4
   spatial bins of 8 orientations, L2-Hys; scikit-image's HOG blocks, see
   :mod:`service.model.kernels.bof`);
2. each descriptor becomes the nearest of ``words`` centres, learned by k-means on descriptors
   sampled from the training images (``training.estimator.visual_words``);
3. level ``l`` of the pyramid cuts the image into ``2^l x 2^l`` cells, and each cell of levels
   ``0..L`` (``L = levels``; with ``single=1`` level L alone) counts its words: an image is
   that many documents over the same vocabulary.

A measure on two images is the documents measure (``sensing0/1/2``, tf-idf ``linear`` and
``rbf``, :mod:`service.model.inputs.words`) on each pair of same cells, summed with the cell's
weight. For the pyramid the weights are Lazebnik et al.'s, by level:

.. math:: \alpha_0 = \frac{1}{2^L}, \qquad \alpha_l = \frac{1}{2^{L - l + 1}} \ (l \ge 1),
          \qquad K(x, y) = \sum_{l=0}^{L} \alpha_l \sum_{c=1}^{4^l} \kappa(x_{l,c}, y_{l,c})

and 1 for a single level. "L = 2, single" is ``bof(levels=2, single=1): sensing0``, "L = 2,
pyramid" ``bof(levels=2): sensing0``; such terms join other measures on one basis as any do.

What a model stores for the transform (:class:`BagOfFeatures`): the ``words x 128`` centres, and
the smooth idf of each visual word over the training images' cells (the tf-idf view of
``linear`` and ``rbf``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp

from service.model import threads
from service.model.errors import ArtifactIntegrityError, SpecError
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import CellDocuments, Documents, stored_counts
from service.model.kernels import bof as bof_kernels
from service.model.similarity import BoundSimilarity, SimilaritySpec

DESCRIPTOR_LENGTH = bof_kernels.DESCRIPTOR_LENGTH


def pyramid_weights(levels: tuple[int, ...]) -> dict[int, float]:
    """The weight of each level: Lazebnik et al.'s for a pyramid ``0..L``, 1 for one level."""
    if len(levels) == 1:
        return {levels[0]: 1.0}
    top = max(levels)
    return {level: 1.0 / 2 ** (top if level == 0 else top - level + 1) for level in levels}


@dataclass(frozen=True, eq=False)
class PyramidLayout:
    """Where the patches of an image lie: which patches each pyramid cell holds, and the cells'
    weights. It depends only on the transform and the image size.

    Attributes
    ----------
    bin_size, step_bins, patch_rows, patch_cols : int
        A spatial bin in pixels, the step in bins, and the patches down and across.
    cell_indptr : ndarray of shape (n_cells + 1,), int64
    cell_patches : ndarray of shape (cell_indptr[-1],), int64
        The patches (row-major) of cell ``c``: ``cell_patches[cell_indptr[c]:cell_indptr[c+1]]``.
    cell_weights : ndarray of shape (n_cells,)
    cell_levels : ndarray of shape (n_cells,), int64
        The level of each cell; cells are numbered level by level, row-major within one.
    """

    bin_size: int
    step_bins: int
    patch_rows: int
    patch_cols: int
    cell_indptr: np.ndarray
    cell_patches: np.ndarray
    cell_weights: np.ndarray
    cell_levels: np.ndarray

    @classmethod
    def of(cls, transform: InputTransform, spec: InputSpec) -> PyramidLayout:
        """The layout of ``transform`` (a ``bof``) on images of ``spec``.

        A patch belongs, at each level, to the cell holding its centre pixel
        (``(row * 2^l) // height``, likewise across).

        Raises
        ------
        SpecError
            The transform does not apply to the images.
        """
        bin_size, step_bins, rows, cols = transform.bof_geometry(spec)
        height, width, _ = spec.shape
        patch = dict(transform.params)["patch"]
        step = step_bins * bin_size
        centre_rows = np.repeat(np.arange(rows) * step + patch // 2, cols)
        centre_cols = np.tile(np.arange(cols) * step + patch // 2, rows)
        levels = transform.bof_levels()
        weights = pyramid_weights(levels)
        patches, counts, cell_weights, cell_levels = [], [], [], []
        for level in levels:
            side = 2**level
            cell = (centre_rows * side // height) * side + centre_cols * side // width
            for c in range(side * side):
                members = np.flatnonzero(cell == c)
                patches.append(members)
                counts.append(members.size)
            cell_weights += [weights[level]] * side * side
            cell_levels += [level] * side * side
        return cls(
            bin_size,
            step_bins,
            rows,
            cols,
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            np.concatenate(patches).astype(np.int64),
            np.asarray(cell_weights, dtype=np.float64),
            np.asarray(cell_levels, dtype=np.int64),
        )

    @property
    def n_patches(self) -> int:
        return self.patch_rows * self.patch_cols

    @property
    def n_cells(self) -> int:
        return int(self.cell_weights.shape[0])


@dataclass(frozen=True, eq=False)
class BagOfFeatures:
    """A ``bof`` transform fitted on training images: its visual words and their idf.

    Parameters
    ----------
    transform : InputTransform
        A ``bof`` transform.
    centres : ndarray of shape (words, 128)
        The visual words: k-means centres of training descriptors.
    idf : ndarray of shape (words,)
        Smooth idf of each word over the training images' cells (the tf-idf view).

    Raises
    ------
    SpecError
        ``transform`` is not a ``bof``, or the arrays do not fit it.
    """

    transform: InputTransform
    centres: np.ndarray
    idf: np.ndarray

    def __post_init__(self) -> None:
        if self.transform.name != "bof":
            raise SpecError(f"visual words belong to a bof transform, not {self.transform}")
        object.__setattr__(self, "centres", np.ascontiguousarray(self.centres, dtype=np.float64))
        object.__setattr__(self, "idf", np.ascontiguousarray(self.idf, dtype=np.float64))
        problems = self.problems()
        if problems:
            raise SpecError(f"transform {self.transform}: {problems[0]}")

    @property
    def n_words(self) -> int:
        return int(dict(self.transform.params)["words"])

    def problems(self, suffix: str = "") -> list[str]:
        """What is inconsistent in the arrays (named as the artifact names them)."""
        expected = {
            f"visual_words{suffix}": (self.centres, (self.n_words, DESCRIPTOR_LENGTH)),
            f"visual_word_idf{suffix}": (self.idf, (self.n_words,)),
        }
        problems = [
            f"{name} has shape {array.shape}, expected {shape}"
            for name, (array, shape) in expected.items()
            if array.shape != shape
        ]
        return problems or [
            f"{name} holds NaN or infinity"
            for name, (array, _) in expected.items()
            if not np.isfinite(array).all()
        ]

    def bind(self, spec: InputSpec) -> BoundBagOfFeatures:
        """This transform on images of ``spec``, its layout computed once.

        Raises
        ------
        SpecError
            The transform does not apply to the images.
        """
        return BoundBagOfFeatures(self, spec, PyramidLayout.of(self.transform, spec))


@dataclass(frozen=True, eq=False)
class BoundBagOfFeatures:
    """A fitted ``bof`` transform bound to the images it reads: :meth:`apply` only computes.

    Parameters
    ----------
    bag : BagOfFeatures
    input_spec : InputSpec
    layout : PyramidLayout

    Attributes
    ----------
    geometry : tuple of int
        The kernels' arguments after the images: height, width, channels, the spatial bin,
        the step in bins, the patches down and across (:mod:`service.model.kernels.bof`).
    """

    bag: BagOfFeatures
    input_spec: InputSpec
    layout: PyramidLayout
    geometry: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        height, width, channels = self.input_spec.shape
        layout = self.layout
        geometry = (
            height, width, channels, layout.bin_size, layout.step_bins, layout.patch_rows,
            layout.patch_cols,
        )  # fmt: skip
        object.__setattr__(self, "geometry", geometry)

    @property
    def transform(self) -> InputTransform:
        return self.bag.transform

    @property
    def n_words(self) -> int:
        return self.bag.n_words

    @property
    def n_features(self) -> int:
        """Cells times words: the length of an image's counts laid side by side."""
        return self.layout.n_cells * self.n_words

    @property
    def grid_shape(self) -> None:
        return None

    def words(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The word of every patch of every image.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)

        Returns
        -------
        words : ndarray of shape (n_samples, n_patches), int64
        finite : ndarray of shape (n_samples,), bool
            False for images whose descriptors could not be computed (values too large).
        """
        X = np.ascontiguousarray(X, dtype=np.float64)
        words = np.empty((X.shape[0], self.layout.n_patches), dtype=np.int64)
        finite = np.empty(X.shape[0], dtype=np.bool_)
        self._run(
            bof_kernels.bof_words, bof_kernels.bof_words_serial, X, self.bag.centres, words, finite
        )
        return words, finite

    def descriptors(self, X: np.ndarray) -> np.ndarray:
        """The descriptor of every patch of every image: ndarray of shape (n_samples,
        n_patches, 128), patches row-major (what the visual words are learned from)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.empty((X.shape[0], self.layout.n_patches, DESCRIPTOR_LENGTH))
        self._run(bof_kernels.bof_descriptors, bof_kernels.bof_descriptors_serial, X, out)
        return out

    def apply(self, X: np.ndarray) -> CellDocuments:
        """The images as bags of visual words on the pyramid.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)
            Flat raw images.

        Returns
        -------
        CellDocuments
            ``n_samples * n_cells`` documents over the vocabulary, with the cells' weights and
            the idf; ``unreadable`` marks images whose descriptors could not be computed.
        """
        words, finite = self.words(X)
        return self.cells_of(words, ~finite)

    def cells_of(self, words: np.ndarray, unreadable: np.ndarray | None = None) -> CellDocuments:
        """Pyramid counts of images given as the word of each patch (see :meth:`words`)."""
        layout = self.layout
        n_rows = words.shape[0] * layout.n_cells
        capacity = words.shape[0] * layout.cell_patches.shape[0]
        indptr = np.empty(n_rows + 1, dtype=np.int64)
        indices = np.empty(capacity, dtype=np.int64)
        counts = np.empty(capacity)
        nnz = bof_kernels.pyramid_counts(
            words, layout.cell_indptr, layout.cell_patches, indptr, indices, counts
        )
        matrix = sp.csr_matrix((counts[:nnz], indices[:nnz], indptr), shape=(n_rows, self.n_words))
        # scipy may narrow the index arrays; the kernels are compiled for int64 ones.
        matrix.indices = matrix.indices.astype(np.int64)
        matrix.indptr = matrix.indptr.astype(np.int64)
        return CellDocuments(Documents(matrix, self.bag.idf), layout.cell_weights, unreadable)

    def work(self, n_samples: int) -> float:
        """Multiply-adds of :meth:`apply` on ``n_samples`` images: the nearest-centre search,
        which dominates (each descriptor against every word)."""
        return float(n_samples) * self.layout.n_patches * self.n_words * DESCRIPTOR_LENGTH

    def runs_serially(self, n_samples: int) -> bool:
        """Whether :meth:`apply` to ``n_samples`` images is light work on the calling thread:
        under :data:`service.model.threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS`, so no
        parallel region (see :meth:`service.model.inputs.transforms.BoundTransform.
        runs_serially`)."""
        return self.work(n_samples) < threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS

    def driver_for(self, n_samples: int, parallel: Callable, serial: Callable) -> Callable:
        """The parallel driver for heavy work on two or more images with two or more numba
        threads, else the serial one (one image is one row of the parallel loop)."""
        if self.runs_serially(n_samples) or n_samples < 2 or numba.get_num_threads() < 2:
            return serial
        return parallel

    def _run(self, parallel: Callable, serial: Callable, X: np.ndarray, *outputs) -> None:
        driver = self.driver_for(X.shape[0], parallel, serial)
        if driver is parallel:
            with threads.PARALLEL_REGION:
                driver(X, *self.geometry, *outputs)
        else:
            driver(X, *self.geometry, *outputs)


class BagSpace:
    """The space of a fitted ``bof`` transform in a model over images: the images as bags of
    visual words, not normalised, and the basis as such bags. It answers what
    :class:`service.model.inputs.dense.NormalisedSpace` answers for the other transforms.

    Artifact arrays (``suffix`` as for the model's other spaces): ``visual_words`` (the
    centres), ``visual_word_idf``, and the basis cells as CSR ``cell_basis_indptr``,
    ``cell_basis_indices``, ``cell_basis_counts`` (rows ``item * n_cells + cell``).

    Parameters
    ----------
    bound : BoundBagOfFeatures
    basis : CellDocuments
        The basis items as bags of visual words (their cells' weights are the layout's).
    """

    has_normalized_form = False
    grid_shape = None
    ARRAYS = frozenset(
        {
            "visual_words",
            "visual_word_idf",
            "cell_basis_indptr",
            "cell_basis_indices",
            "cell_basis_counts",
        }
    )

    def __init__(self, bound: BoundBagOfFeatures, basis: CellDocuments):
        self.bound = bound
        weights = bound.layout.cell_weights
        if basis.n_cells != weights.shape[0] or not np.array_equal(basis.cell_weights, weights):
            raise SpecError(
                f"transform {bound.transform}: the basis has {basis.n_cells} cells, the "
                f"pyramid {weights.shape[0]}"
            )
        # The basis reads the vocabulary's idf (the tf-idf view), whatever it was given with.
        self.basis = CellDocuments(Documents(basis.documents.counts, bound.bag.idf), weights)

    @property
    def transform(self) -> InputTransform:
        return self.bound.transform

    @property
    def n_features(self) -> int:
        return self.bound.n_features

    @property
    def n_values(self) -> int:
        return int(self.basis.documents.counts.nnz)

    def prepare(self, batch: np.ndarray) -> CellDocuments:
        return self.bound.apply(batch)

    def prepare_measured(self, batch: np.ndarray) -> tuple[CellDocuments, np.ndarray, float]:
        """:meth:`prepare`, :meth:`distances` of the items and the largest (NaN if any)."""
        items = self.prepare(batch)
        distances = self.distances(items)
        return items, distances, float(distances.max())

    def runs_serially(self, n_samples: int) -> bool:
        return self.bound.runs_serially(n_samples)

    def distances(self, items: CellDocuments) -> np.ndarray:
        """0 for every image (word counts lie at no distance from the training data), NaN for
        the images whose descriptors could not be computed, which the model then refuses."""
        out = np.zeros(len(items))
        if items.unreadable is not None:
            out[items.unreadable] = np.nan
        return out

    def bind(self, spec: SimilaritySpec) -> BoundSimilarity:
        return spec.bind(self.bound.n_words, cells=self.bound.layout.n_cells)

    def problems(self, suffix: str, n_basis: int) -> list[str]:
        counts = self.basis.documents.counts
        expected = (n_basis * self.basis.n_cells, self.bound.n_words)
        if counts.shape != expected:
            return [f"cell_basis{suffix} has shape {counts.shape}, expected {expected}"]
        return self.bound.bag.problems(suffix)

    def arrays(self, suffix: str) -> dict[str, np.ndarray]:
        counts = self.basis.documents.counts
        return {
            f"visual_words{suffix}": self.bound.bag.centres,
            f"visual_word_idf{suffix}": self.bound.bag.idf,
            f"cell_basis_indptr{suffix}": counts.indptr,
            f"cell_basis_indices{suffix}": counts.indices,
            f"cell_basis_counts{suffix}": counts.data,
        }

    @classmethod
    def from_arrays(
        cls, transform: InputTransform, spec: InputSpec, arrays: dict, suffix: str, path
    ) -> tuple[BagOfFeatures, CellDocuments]:
        """The fitted transform and the basis cells an artifact holds for space ``suffix``.

        Raises
        ------
        ArtifactIntegrityError
            The arrays do not form visual words and cell counts of ``transform``.
        """
        try:
            bag = BagOfFeatures(
                transform, arrays[f"visual_words{suffix}"], arrays[f"visual_word_idf{suffix}"]
            )
            layout = PyramidLayout.of(transform, spec)
        except SpecError as error:
            raise ArtifactIntegrityError(f"{path}: {error}") from None
        counts = _cell_counts(path, arrays, suffix, bag.n_words, layout.n_cells)
        return bag, CellDocuments(Documents(counts, bag.idf), layout.cell_weights)


def _cell_counts(path, arrays: dict, suffix: str, n_words: int, n_cells: int) -> sp.csr_matrix:
    """The basis cells from their three CSR arrays, checked before use."""
    matrix = stored_counts(
        *(arrays[f"cell_basis_{name}{suffix}"] for name in ("indptr", "indices", "counts")),
        n_words,
    )
    if (
        matrix is None
        or matrix.shape[0] % n_cells
        or not np.isfinite(matrix.data).all()
        or (matrix.data < 0).any()
    ):
        raise ArtifactIntegrityError(
            f"{path}: cell_basis_indptr/indices/counts{suffix} are not word counts of "
            f"{n_cells} cells per image"
        )
    return matrix
