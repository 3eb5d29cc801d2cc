r"""Bag-of-words documents: a vocabulary, sparse count batches, and the views measures read.

A model with ``counts(W)`` inputs keeps its documents as word counts over a vocabulary of W
words, CSR (one row per document, column = word). Measures read one *view* of the counts:

- ``sensing0`` the counts themselves;
- ``sensing1(n)`` the frequencies scaled by n, :math:`n x_w / N_x`;
- ``sensing2(N)`` the counts after resampling the document to exactly N words, with a seed taken
  from the document's content, so the same document always gets the same resample;
- ``linear`` and ``rbf`` the tf-idf vector: counts times the idf fitted on the training set
  (:math:`\ln\frac{1 + n}{1 + \text{df}_w} + 1`, scikit-learn's smooth idf), each row scaled to
  unit L2 norm.

A batch of inputs is a :class:`Documents`; the basis is one too, and keeps its views as postings
(the CSC form: for every word, the basis items holding it), built once and cached.

The :class:`Vocabulary` is plain data (terms, lower-casing, token pattern) saved in the artifact;
encoding text needs no scikit-learn and runs no code from the artifact. Words not in the
vocabulary are dropped (stop words too, where the model's vocabulary left them out).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from service.model.errors import InvalidInputError, brief
from service.model.inputs.spec import instance_name
from service.model.kernels import Drivers
from service.model.kernels import sparse as sparse_kernels

# scikit-learn's CountVectorizer default: runs of two or more word characters.
DEFAULT_TOKEN_PATTERN = r"(?u)\b\w\w+\b"
# Most words one document may count: 2**53, the whole numbers float64 holds exactly (the counts
# are float64), which keeps word totals exact.
MAX_WORDS = 2**53


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Words a model knows, and how raw text is cut into them.

    Parameters
    ----------
    terms : sequence of str, length W
        Column ``i`` of a count vector counts ``terms[i]``.
    lowercase : bool, default=True
    token_pattern : str
        A regular expression whose matches are the tokens (scikit-learn's default).
    """

    terms: tuple[str, ...]
    lowercase: bool = True
    token_pattern: str = DEFAULT_TOKEN_PATTERN
    _index: dict[str, int] = field(init=False, repr=False)
    _pattern: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "terms", tuple(str(t) for t in self.terms))
        index = {term: i for i, term in enumerate(self.terms)}
        if len(index) != len(self.terms):
            raise ValueError("vocabulary terms must be distinct")
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_pattern", re.compile(self.token_pattern))

    @property
    def size(self) -> int:
        return len(self.terms)

    def tokens(self, text: str) -> list[str]:
        """The tokens of one text, in order (before the vocabulary drops unknown ones)."""
        return self._pattern.findall(text.lower() if self.lowercase else text)

    def encode(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Word counts of raw texts; words not in the vocabulary are dropped.

        Parameters
        ----------
        texts : sequence of str, length n

        Returns
        -------
        counts : csr_matrix of shape (n, W), float64, canonical (sorted, no duplicates)

        Raises
        ------
        InvalidInputError
            If an item is not a string.
        """
        indptr, indices, values = [0], [], []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInputError(f"texts[{i}] must be a string, got {type(text).__name__}")
            counted = Counter(
                word for token in self.tokens(text) if (word := self._index.get(token)) is not None
            )
            for word in sorted(counted):
                indices.append(word)
                values.append(counted[word])
            indptr.append(len(indices))
        matrix = sp.csr_matrix(
            (
                np.asarray(values, dtype=np.float64),
                np.asarray(indices, dtype=np.int64),
                np.asarray(indptr, dtype=np.int64),
            ),
            shape=(len(texts), self.size),
        )
        # scipy may narrow the index arrays; the kernels are compiled for int64 ones.
        matrix.indices = matrix.indices.astype(np.int64)
        matrix.indptr = matrix.indptr.astype(np.int64)
        return matrix

    def settings(self) -> dict[str, Any]:
        """Everything but the terms, as the manifest records it."""
        return {"lowercase": self.lowercase, "token_pattern": self.token_pattern}


def canonical_counts(counts, n_words: int | None = None) -> sp.csr_matrix:
    """A CSR float64 copy of ``counts`` with sorted, summed indices and int64 index arrays.

    Parameters
    ----------
    counts : sparse matrix or array-like of shape (n, W)
    n_words : int, optional
        Expected W.

    Raises
    ------
    InvalidInputError
        Wrong width, negative, non-integer or non-finite counts.
    """
    matrix = sp.csr_matrix(counts, dtype=np.float64, copy=True)
    if n_words is not None and matrix.shape[1] != n_words:
        raise InvalidInputError(f"expected counts over {n_words} words, got {matrix.shape[1]}")
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    data = matrix.data
    if not np.isfinite(data).all() or (data < 0).any() or (data != np.floor(data)).any():
        row = int(
            np.searchsorted(
                matrix.indptr,
                np.flatnonzero(~np.isfinite(data) | (data < 0) | (data != np.floor(data)))[0],
                side="right",
            )
            - 1
        )
        raise InvalidInputError(f"document {row}: counts must be non-negative whole numbers")
    matrix.indices = matrix.indices.astype(np.int64)
    matrix.indptr = matrix.indptr.astype(np.int64)
    return matrix


def stored_counts(
    indptr: np.ndarray, indices: np.ndarray, counts: np.ndarray, n_words: int
) -> sp.csr_matrix | None:
    """Word counts from the three CSR arrays an artifact stores, or None if they do not form
    a valid CSR matrix over ``n_words`` words (checked before scipy reads them)."""
    if (
        indptr.ndim != 1
        or indptr.shape[0] < 1
        or indptr[0] != 0
        or (np.diff(indptr) < 0).any()
        or indptr[-1] != indices.shape[0]
        or indices.ndim != 1
        or indices.shape != counts.shape
        or (indices.size and not 0 <= indices.min() <= indices.max() < n_words)
    ):
        return None
    matrix = sp.csr_matrix((counts, indices, indptr), shape=(indptr.shape[0] - 1, n_words))
    matrix.indices = matrix.indices.astype(np.int64)
    matrix.indptr = matrix.indptr.astype(np.int64)
    return matrix


def counts_from_pairs(
    documents: Sequence[Any], n_words: int, names: Sequence[str] | None = None
) -> sp.csr_matrix:
    """Count vectors from ``{"indices": [...], "counts": [...]}`` objects, one per document.

    Repeated indices add up. An empty document (no indices) is allowed. A document holds at
    most :data:`MAX_WORDS` words in all (its counts' sum).
    ``names`` are what messages call each document (default ``instances[i]``).

    Raises
    ------
    InvalidInputError
        Naming the first offending document.
    """
    indptr, indices, values = [0], [], []
    for i, document in enumerate(documents):
        where = instance_name(names, i)
        if not isinstance(document, dict) or set(document) != {"indices", "counts"}:
            raise InvalidInputError(
                f"{where} must be an object with exactly the keys indices and counts"
            )
        words, counts = document["indices"], document["counts"]
        if not isinstance(words, list) or not isinstance(counts, list):
            raise InvalidInputError(f"{where}: indices and counts must be lists")
        if len(words) != len(counts):
            raise InvalidInputError(
                f"{where}: {len(words)} indices but {len(counts)} counts; give one count per index"
            )
        for word in words:
            if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < n_words:
                raise InvalidInputError(
                    f"{where}: word index {brief(word)} is not an integer in [0, {n_words})"
                )
        for count in counts:
            if not _is_whole_count(count):
                raise InvalidInputError(
                    f"{where}: count {brief(count)} is not a non-negative whole number"
                )
        if sum(counts) > MAX_WORDS:
            raise InvalidInputError(
                f"{where} counts more than {MAX_WORDS:,} words in all (2**53: beyond it float64 "
                "holds no longer every whole number)"
            )
        indices.extend(words)
        values.extend(counts)
        indptr.append(len(indices))
    matrix = sp.csr_matrix(
        (
            np.asarray(values, dtype=np.float64),
            np.asarray(indices, dtype=np.int64),
            np.asarray(indptr, dtype=np.int64),
        ),
        shape=(len(documents), n_words),
    )
    return canonical_counts(matrix)


def _is_whole_count(count: Any) -> bool:
    if isinstance(count, bool) or not isinstance(count, int | float):
        return False
    if isinstance(count, int):  # exact, of any size (math.isfinite would overflow on 10**400)
        return count >= 0
    return math.isfinite(count) and count >= 0 and count == int(count)


def smooth_idf(counts: sp.csr_matrix) -> np.ndarray:
    r"""Inverse document frequencies :math:`\ln\frac{1 + n}{1 + \text{df}_w} + 1`, shape (W,)."""
    document_frequency = np.bincount(counts.indices, minlength=counts.shape[1])
    return np.log((1.0 + counts.shape[0]) / (1.0 + document_frequency)) + 1.0


def _row_scaled(matrix: sp.csr_matrix, factors: np.ndarray) -> sp.csr_matrix:
    scaled = matrix.copy()
    scaled.data = scaled.data * np.repeat(factors, np.diff(matrix.indptr))
    return scaled


def resampled(counts: sp.csr_matrix, n_words: int) -> sp.csr_matrix:
    """Every row of canonical ``counts`` resampled to ``n_words`` words, reproducibly.

    Each document draws from its own word distribution with a random stream seeded by its
    (sorted) words and counts (:func:`service.model.kernels.sparse.resample_row`), so the same
    document gets the same resample in training and serving, in any batch. An empty document
    stays empty.
    """
    drawn = np.empty_like(counts.data)
    sparse_kernels.resample_rows(counts.indptr, counts.indices, counts.data, n_words, drawn)
    # Copies: eliminate_zeros works in place, and must not touch the counts' own arrays.
    matrix = sp.csr_matrix((drawn, counts.indices.copy(), counts.indptr.copy()), shape=counts.shape)
    matrix.eliminate_zeros()
    return matrix


def _tfidf(counts: sp.csr_matrix, idf: np.ndarray) -> sp.csr_matrix:
    """Rows of ``counts * idf`` scaled to unit L2 norm (empty rows stay empty), on the CSR
    arrays directly: scipy's elementwise products cost hundreds of µs on one small row."""
    nnz = counts.indptr[-1]
    indices = counts.indices[:nnz]
    values = counts.data[:nnz] * idf[indices]
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
    norms = np.sqrt(np.bincount(rows, weights=values * values, minlength=counts.shape[0]))
    values /= norms[rows]
    return sp.csr_matrix((values, indices, counts.indptr), shape=counts.shape)


@dataclass(frozen=True)
class Postings:
    """One view of a basis, word by word (CSC), as the sparse kernels read it.

    Attributes
    ----------
    indptr : ndarray of shape (W + 1,), int64
    items, values, lgamma1 : ndarray of shape (nnz,)
        Basis item, value and :math:`\\ln\\Gamma(\\text{value} + 1)` of each entry.
    totals, lgamma_totals1, sq_norms : ndarray of shape (n_basis,)
        Row sums, :math:`\\ln\\Gamma(\\text{sum} + 1)` and squared L2 norms of the view.
    """

    indptr: np.ndarray
    items: np.ndarray
    values: np.ndarray
    lgamma1: np.ndarray
    totals: np.ndarray
    lgamma_totals1: np.ndarray
    sq_norms: np.ndarray

    @classmethod
    def of(cls, view: sp.csr_matrix) -> Postings:
        totals = np.asarray(view.sum(axis=1), dtype=np.float64).ravel()
        by_word = view.tocsc()
        by_word.sort_indices()
        values = np.ascontiguousarray(by_word.data, dtype=np.float64)
        return cls(
            indptr=by_word.indptr.astype(np.int64),
            items=by_word.indices.astype(np.int64),
            values=values,
            lgamma1=gammaln(values + 1.0),
            totals=totals,
            lgamma_totals1=gammaln(totals + 1.0),
            sq_norms=np.asarray(view.multiply(view).sum(axis=1), dtype=np.float64).ravel(),
        )


@dataclass(eq=False)
class Documents:
    """A batch of bag-of-words documents and the views measures read (cached).

    Parameters
    ----------
    counts : csr_matrix of shape (n, W)
        Canonical (see :func:`canonical_counts`).
    idf : ndarray of shape (W,), optional
        Needed by the tf-idf view.
    """

    counts: sp.csr_matrix
    idf: np.ndarray | None = None
    _views: dict[tuple, sp.csr_matrix] = field(default_factory=dict, init=False, repr=False)
    _postings: dict[tuple, Postings] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __len__(self) -> int:
        return self.counts.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.counts.shape

    @property
    def n_words(self) -> int:
        return self.counts.shape[1]

    def __getitem__(self, rows) -> Documents:
        return Documents(self.counts[rows], self.idf)

    def known_words(self) -> np.ndarray:
        """Word total of each document, shape (n,)."""
        return np.asarray(self.counts.sum(axis=1), dtype=np.float64).ravel()

    def view(self, name: str, parameter: float = 0.0) -> sp.csr_matrix:
        """The counts as a measure reads them: ``counts``, ``frequencies`` (times n),
        ``resampled`` (to N words) or ``tfidf``."""
        key = (name, parameter)
        with self._lock:
            cached = self._views.get(key)
        if cached is not None:
            return cached
        if name == "counts":
            result = self.counts
        elif name == "frequencies":
            totals = self.known_words()
            result = _row_scaled(self.counts, parameter / np.where(totals > 0, totals, 1.0))
        elif name == "resampled":
            result = resampled(self.counts, int(parameter))
        elif name == "tfidf":
            if self.idf is None:
                raise ValueError("the tf-idf view needs the idf fitted on the training set")
            result = _tfidf(self.view("counts"), self.idf)
        else:
            raise ValueError(f"unknown document view {name!r}")
        result.indices = result.indices.astype(np.int64)
        result.indptr = result.indptr.astype(np.int64)
        with self._lock:
            self._views[key] = result
        return result

    def postings(self, name: str, parameter: float = 0.0) -> Postings:
        """:meth:`view` word by word, for use as a basis (cached)."""
        key = (name, parameter)
        with self._lock:
            cached = self._postings.get(key)
        if cached is None:
            cached = Postings.of(self.view(name, parameter))
            with self._lock:
                self._postings[key] = cached
        return cached


@dataclass(frozen=True)
class CellPostings:
    """A basis of images as bags of visual words, one view, as the cell kernels read it: the
    postings over ``n_cells * W`` columns (cell ``c``'s word ``w`` at ``c * W + w``) and the
    per-cell statistics.

    Attributes
    ----------
    postings : Postings
        Its ``totals``, ``lgamma_totals1`` and ``sq_norms`` are of whole images (unused).
    totals, lgamma_totals1, sq_norms : ndarray of shape (n_cells, n_basis)
        Of every basis item's cells.
    """

    postings: Postings
    totals: np.ndarray
    lgamma_totals1: np.ndarray
    sq_norms: np.ndarray

    @classmethod
    def of(cls, view: sp.csr_matrix, n_cells: int) -> CellPostings:
        """From a view of the cells, rows ``i * n_cells + c`` (shape (n * n_cells, W))."""
        n_words = view.shape[1]
        n_items = view.shape[0] // n_cells
        rows = np.repeat(np.arange(view.shape[0]), np.diff(view.indptr))
        wide = sp.csr_matrix(
            (view.data, (rows // n_cells, (rows % n_cells) * n_words + view.indices)),
            shape=(n_items, n_cells * n_words),
        )
        per_cell = Postings.of(view)

        def by_cell(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(values.reshape(n_items, n_cells).T)

        return cls(
            Postings.of(wide),
            by_cell(per_cell.totals),
            by_cell(per_cell.lgamma_totals1),
            by_cell(per_cell.sq_norms),
        )


@dataclass(eq=False)
class CellDocuments:
    """Images as bags of visual words on a spatial pyramid: each image is ``n_cells``
    documents over the same W visual words, one per cell, and a measure on two images is the
    weighted sum over cells of the documents measure on their cells (see
    :mod:`service.model.inputs.bof`).

    Parameters
    ----------
    documents : Documents
        The cells, shape (n * n_cells, W): row ``i * n_cells + c`` is cell ``c`` of image ``i``;
        its views (counts, frequencies, resampled, tf-idf) are those of each cell.
    cell_weights : ndarray of shape (n_cells,)
        The weight of each cell in every measure (the pyramid's level weights).
    unreadable : ndarray of shape (n,), bool, optional
        Images whose descriptors could not be computed (values too large): their words mean
        nothing, and the service refuses them.
    """

    documents: Documents
    cell_weights: np.ndarray
    unreadable: np.ndarray | None = None
    _postings: dict[tuple, CellPostings] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.cell_weights = np.ascontiguousarray(self.cell_weights, dtype=np.float64)
        if len(self.documents) % self.n_cells:
            raise ValueError(
                f"{len(self.documents)} cell documents are not whole images of {self.n_cells}"
            )

    @property
    def n_cells(self) -> int:
        return int(self.cell_weights.shape[0])

    def __len__(self) -> int:
        return len(self.documents) // self.n_cells

    @property
    def shape(self) -> tuple[int, int]:
        """(images, cells times words)."""
        return len(self), self.n_cells * self.documents.n_words

    def __getitem__(self, rows) -> CellDocuments:
        """The images ``rows`` (a slice or indices), with all their cells."""
        images = np.arange(len(self))[rows]
        cells = (images[:, None] * self.n_cells + np.arange(self.n_cells)).ravel()
        unreadable = None if self.unreadable is None else self.unreadable[images]
        return CellDocuments(self.documents[cells], self.cell_weights, unreadable)

    def postings(self, name: str, parameter: float = 0.0) -> CellPostings:
        """The cells' :meth:`Documents.view` as postings over every cell's words, for use as a
        basis (cached)."""
        key = (name, parameter)
        with self._lock:
            cached = self._postings.get(key)
        if cached is None:
            cached = CellPostings.of(self.documents.view(name, parameter), self.n_cells)
            with self._lock:
                self._postings[key] = cached
        return cached


# -- the measures' drivers ----------------------------------------------------------------
#
# Each documents measure reads cached views of the documents (counts, frequencies, tf-idf,
# resampled counts) and their postings, then calls a kernel of service.model.kernels.sparse. Its
# drivers are called as the dense ones are, ``(basis, X, *params, out)``, and listed beside them
# in service.model.similarity.SIMILARITY_KINDS.


@dataclass(frozen=True)
class DocumentDriver:
    """A sparse kernel called on documents: ``arguments(basis, X, *params)`` gives the kernel's
    arguments before ``out`` from the documents' views."""

    arguments: Callable[..., tuple]
    kernel: Callable[..., None]

    def __call__(self, basis: Documents, X: Documents, *args) -> None:
        *params, out = args
        self.kernel(*self.arguments(basis, X, *params), out)


def _drivers(arguments: Callable[..., tuple], serial, parallel) -> Drivers:
    return Drivers(DocumentDriver(arguments, serial), DocumentDriver(arguments, parallel))


def _sensing0_arguments(basis: Documents, X: Documents) -> tuple:
    """Sensing 0 of every input against every basis item."""
    return _sensing0_of(basis.postings("counts"), X.view("counts"))


def _sensing2_arguments(basis: Documents, X: Documents, n_words: float) -> tuple:
    """Sensing 2: Sensing 0 of the documents resampled to ``n_words`` words."""
    return _sensing0_of(basis.postings("resampled", n_words), X.view("resampled", n_words))


def _sensing0_of(post: Postings, view: sp.csr_matrix) -> tuple:
    return (
        post.indptr, post.items, post.values, post.lgamma1, post.totals, post.lgamma_totals1,
        view.indptr, view.indices, view.data, float(view.shape[1]),
    )  # fmt: skip


def _sensing1_arguments(basis: Documents, X: Documents, n: float) -> tuple:
    """Sensing 1 on word frequencies scaled by ``n``."""
    post, view = basis.postings("frequencies", n), X.view("counts")
    return (
        post.indptr, post.items, post.values, post.lgamma1,
        view.indptr, view.indices, view.data, float(n),
    )  # fmt: skip


def _tfidf_linear_arguments(basis: Documents, X: Documents) -> tuple:
    """Inner products of the tf-idf vectors."""
    post, view = basis.postings("tfidf"), X.view("tfidf")
    return post.indptr, post.items, post.values, view.indptr, view.indices, view.data


def _tfidf_rbf_arguments(basis: Documents, X: Documents, gamma: float) -> tuple:
    """Gaussian RBF of the tf-idf vectors."""
    post, view = basis.postings("tfidf"), X.view("tfidf")
    return (
        post.indptr, post.items, post.values, post.sq_norms,
        view.indptr, view.indices, view.data, float(gamma),
    )  # fmt: skip


# On images as bags of visual words (CellDocuments), the same views cell by cell, summed with
# the cells' weights by the cell kernels.


def _cells_of(basis: CellDocuments, X: CellDocuments) -> tuple:
    """What every cell kernel takes after the inputs: W and the cell weights."""
    return float(X.documents.n_words), X.cell_weights


def _sensing0_cell_arguments(basis: CellDocuments, X: CellDocuments) -> tuple:
    return _sensing0_cells_of(basis, X, basis.postings("counts"), X.documents.view("counts"))


def _sensing2_cell_arguments(basis: CellDocuments, X: CellDocuments, n_words: float) -> tuple:
    post = basis.postings("resampled", n_words)
    return _sensing0_cells_of(basis, X, post, X.documents.view("resampled", n_words))


def _sensing0_cells_of(basis, X, cells: CellPostings, view: sp.csr_matrix) -> tuple:
    post = cells.postings
    return (
        post.indptr, post.items, post.values, post.lgamma1, cells.totals, cells.lgamma_totals1,
        view.indptr, view.indices, view.data, *_cells_of(basis, X),
    )  # fmt: skip


def _sensing1_cell_arguments(basis: CellDocuments, X: CellDocuments, n: float) -> tuple:
    post, view = basis.postings("frequencies", n).postings, X.documents.view("counts")
    return (
        post.indptr, post.items, post.values, post.lgamma1,
        view.indptr, view.indices, view.data, float(n), *_cells_of(basis, X),
    )  # fmt: skip


def _tfidf_linear_cell_arguments(basis: CellDocuments, X: CellDocuments) -> tuple:
    post, view = basis.postings("tfidf").postings, X.documents.view("tfidf")
    return (
        post.indptr, post.items, post.values, view.indptr, view.indices, view.data,
        *_cells_of(basis, X),
    )  # fmt: skip


def _tfidf_rbf_cell_arguments(basis: CellDocuments, X: CellDocuments, gamma: float) -> tuple:
    cells, view = basis.postings("tfidf"), X.documents.view("tfidf")
    post = cells.postings
    return (
        post.indptr, post.items, post.values, cells.sq_norms,
        view.indptr, view.indices, view.data, float(gamma), *_cells_of(basis, X),
    )  # fmt: skip


SENSING0 = _drivers(
    _sensing0_arguments,
    sparse_kernels.sensing0_similarities_serial,
    sparse_kernels.sensing0_similarities,
)
SENSING1 = _drivers(
    _sensing1_arguments,
    sparse_kernels.sensing1_similarities_serial,
    sparse_kernels.sensing1_similarities,
)
SENSING2 = _drivers(
    _sensing2_arguments,
    sparse_kernels.sensing0_similarities_serial,
    sparse_kernels.sensing0_similarities,
)
TFIDF_LINEAR = _drivers(
    _tfidf_linear_arguments,
    sparse_kernels.dot_similarities_serial,
    sparse_kernels.dot_similarities,
)
TFIDF_RBF = _drivers(
    _tfidf_rbf_arguments,
    sparse_kernels.rbf_similarities_serial,
    sparse_kernels.rbf_similarities,
)
SENSING0_CELLS = _drivers(
    _sensing0_cell_arguments,
    sparse_kernels.sensing0_cell_similarities_serial,
    sparse_kernels.sensing0_cell_similarities,
)
SENSING1_CELLS = _drivers(
    _sensing1_cell_arguments,
    sparse_kernels.sensing1_cell_similarities_serial,
    sparse_kernels.sensing1_cell_similarities,
)
SENSING2_CELLS = _drivers(
    _sensing2_cell_arguments,
    sparse_kernels.sensing0_cell_similarities_serial,
    sparse_kernels.sensing0_cell_similarities,
)
TFIDF_LINEAR_CELLS = _drivers(
    _tfidf_linear_cell_arguments,
    sparse_kernels.dot_cell_similarities_serial,
    sparse_kernels.dot_cell_similarities,
)
TFIDF_RBF_CELLS = _drivers(
    _tfidf_rbf_cell_arguments,
    sparse_kernels.rbf_cell_similarities_serial,
    sparse_kernels.rbf_cell_similarities,
)
