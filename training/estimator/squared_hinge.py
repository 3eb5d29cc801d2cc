"""The squared-hinge loss term of the one-vs-rest problems, read only through its products
(:class:`SquaredHingeLoss`): its value and gradient at some weights, and products of its
generalised Hessian with a vector. :class:`InMemorySquaredHinge` holds the design in this
process; :mod:`training.estimator.distributed_solver` sums the same terms over a cluster's rows.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from training.estimator.hessian_kernels import dense_active_product, sparse_active_product


class SquaredHingeLoss(ABC):
    r"""The data term of K one-vs-rest squared-hinge problems, as the solver reads it.

    .. math:: L_k(w_k, b_k) = C \sum_i \max(0, 1 - y_{ik} (w_k \cdot x_i + b_k))^2

    Weights are blocks of columns, one per problem: the problem's weights, then its bias, so
    a block has ``n_features + 1`` rows. Every method takes the weights of some of the problems,
    ``W[:, j]`` those of problem ``problems[j]``, and answers for those only: the solver stops
    asking about a problem once it has converged. Implementations decide where the items live;
    a sum over shards held elsewhere serves as well as a matrix in memory, since every answer is
    a sum over items.

    The generalised Hessian of problem k at ``w_k`` is :math:`2C X_A^\top X_A` (with the bias
    column), A the items with positive slack there: implementations may keep the active sets
    of the points they were last asked about, per problem.

    Attributes
    ----------
    n_features : int
        Features of an item (the bias is not counted).
    n_problems : int
        K, the problems solved together.
    """

    n_features: int
    n_problems: int

    @abstractmethod
    def value_and_gradient(
        self, W: np.ndarray, problems: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:math:`L_k` for each problem listed, and its gradient.

        Parameters
        ----------
        W : ndarray of shape (n_features + 1, len(problems))
        problems : ndarray of int

        Returns
        -------
        values : ndarray of shape (len(problems),)
        gradient : ndarray of shape (n_features + 1, len(problems))
        """

    @abstractmethod
    def hessian_product(self, W: np.ndarray, V: np.ndarray, problems: np.ndarray) -> np.ndarray:
        r"""Each listed problem's generalised Hessian at its column of ``W`` times its column of
        ``V`` (:math:`2C X_A^\top X_A v`, with the bias); an array of the shape of ``V``."""


# The in-memory loss sums over row blocks of about this many items (at most MAX_ROW_BLOCKS of them),
# computed in a pool of n_jobs threads and added in their order: the blocks depend only on the
# data, so a model is the same whatever the cores it was trained on, to the bit.
ROWS_PER_BLOCK = 4096
MAX_ROW_BLOCKS = 32


def row_blocks(n_samples: int) -> list[slice]:
    """The fixed row blocks of :class:`InMemorySquaredHinge` for ``n_samples`` items."""
    n_blocks = int(np.clip(-(-n_samples // ROWS_PER_BLOCK), 1, MAX_ROW_BLOCKS))
    bounds = np.linspace(0, n_samples, n_blocks + 1).astype(np.int64)
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _rows_of(design, rows: slice):
    """A block of rows without copying the matrix's values (a CSR view shares them)."""
    if not sp.issparse(design):
        return design[rows]
    start, stop = design.indptr[rows.start], design.indptr[rows.stop]
    return sp.csr_matrix(
        (
            design.data[start:stop],
            design.indices[start:stop],
            design.indptr[rows.start : rows.stop + 1] - start,
        ),
        shape=(rows.stop - rows.start, design.shape[1]),
        copy=False,
    )


class InMemorySquaredHinge(SquaredHingeLoss):
    """:class:`SquaredHingeLoss` over a feature matrix held in this process.

    Every evaluation is a sum over fixed row blocks (:func:`row_blocks`), each block's term
    computed for all the problems asked about at once (matrix products, and the active-rows
    kernel of :func:`active_rows_product`), the blocks in a pool of ``n_threads`` threads
    (numpy and numba release the GIL). The items with positive slack are kept per problem, for
    the point last evaluated, and found again only for the problems whose point changed.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, K)
        +1 for the problem's class, -1 for the others.
    C : float
    n_threads : int, default=1
        Threads computing the blocks' terms. The result does not depend on it.
    """

    def __init__(self, design, signs: np.ndarray, C: float, n_threads: int = 1):
        self.design = design if sp.issparse(design) else np.ascontiguousarray(design)
        self.signs, self.C = signs, C
        self.n_features, self.n_problems = design.shape[1], signs.shape[1]
        self.n_threads = n_threads
        self._blocks = [(rows, _rows_of(self.design, rows)) for rows in row_blocks(len(signs))]
        # Per problem: the point its active set was found at (NaN: none yet), and the set.
        self._point = np.full((self.n_features + 1, self.n_problems), np.nan)
        self._active = np.zeros(signs.shape, dtype=bool)

    def _each_block(self, term):
        """``term(rows, block)`` for every block, in block order."""
        if self.n_threads == 1 or len(self._blocks) == 1:
            return [term(rows, block) for rows, block in self._blocks]
        with ThreadPoolExecutor(min(self.n_threads, len(self._blocks))) as pool:
            return list(pool.map(lambda item: term(*item), self._blocks))

    def _remember(self, W: np.ndarray, problems: np.ndarray, active: np.ndarray) -> None:
        self._point[:, problems] = W
        self._active[:, problems] = active

    def _active_at(self, W: np.ndarray, problems: np.ndarray) -> np.ndarray:
        stale = np.flatnonzero((self._point[:, problems] != W).any(axis=0))
        if len(stale):
            some = problems[stale]
            parts = self._each_block(
                lambda rows, block: active_items(block, self.signs[rows][:, some], W[:, stale])
            )
            self._remember(W[:, stale], some, np.vstack(parts))
        return self._active[:, problems]

    def value_and_gradient(self, W, problems):
        parts = self._each_block(
            lambda rows, block: squared_hinge_terms(block, self.signs[rows][:, problems], W, self.C)
        )
        self._remember(W, problems, np.vstack([active for _, _, active in parts]))
        return _added([values for values, _, _ in parts]), _added([g for _, g, _ in parts])

    def hessian_product(self, W, V, problems):
        active = self._active_at(W, problems)
        return _added(
            self._each_block(
                lambda rows, block: squared_hinge_hessian_product(block, active[rows], V, self.C)
            )
        )


def _added(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of the blocks' terms, in block order."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _scores(design, W: np.ndarray) -> np.ndarray:
    scores = design @ W[:-1]
    scores += W[-1]
    return scores


def active_items(design, signs: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Which items have positive slack in each problem at its column of ``W``.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, k)
    W : ndarray of shape (n_features + 1, k)

    Returns
    -------
    ndarray of shape (n_samples, k), bool
    """
    margins = _scores(design, W)
    margins *= signs
    return margins < 1.0


def squared_hinge_terms(
    design, signs: np.ndarray, W: np.ndarray, C: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The squared hinge's value and gradient for each problem, and its active items: what
    :meth:`SquaredHingeLoss.value_and_gradient` sums, over the items of ``design``.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, k)
    W : ndarray of shape (n_features + 1, k)
    C : float

    Returns
    -------
    values : ndarray of shape (k,)
    gradient : ndarray of shape (n_features + 1, k)
    active : ndarray of shape (n_samples, k), bool
    """
    slack = _scores(design, W)
    slack *= signs
    np.subtract(1.0, slack, out=slack)  # 1 - y (w . x + b)
    active = slack > 0.0
    np.maximum(slack, 0.0, out=slack)
    values = C * np.einsum("ij,ij->j", slack, slack)
    slack *= signs
    slack *= -2.0 * C  # the loss's derivative by each score
    gradient = np.empty((W.shape[0], W.shape[1]))
    gradient[:-1] = design.T @ slack
    gradient[-1] = slack.sum(axis=0)
    return values, gradient, active


def squared_hinge_hessian_product(design, active: np.ndarray, V: np.ndarray, C: float):
    r"""The generalised Hessian products :math:`2C X_{A_k}^\top X_{A_k} v_k` (bias included)
    over the items of ``design``; ``active`` from :func:`active_items`. The shape of ``V``."""
    out = active_rows_product(design, active, V)
    out *= 2.0 * C
    return out


def active_rows_product(design, active: np.ndarray, V: np.ndarray) -> np.ndarray:
    r"""Each problem's :math:`X_{A_k}^\top X_{A_k} v_k`, the bias column included, reading only
    the active items' rows (:mod:`training.estimator.hessian_kernels`).

    Parameters
    ----------
    design : ndarray (C-contiguous) or csr_matrix of shape (n_samples, n_features)
    active : ndarray of shape (n_samples, k), bool
    V : ndarray of shape (n_features + 1, k)

    Returns
    -------
    ndarray of shape (n_features + 1, k)
    """
    out = np.zeros((V.shape[1], V.shape[0]))
    vectors = np.ascontiguousarray(V.T)
    active = np.ascontiguousarray(active)
    if sp.issparse(design):
        sparse_active_product(design.data, design.indices, design.indptr, active, vectors, out)
    else:
        dense_active_product(design, active, vectors, out)
    return out.T
