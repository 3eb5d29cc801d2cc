"""The hot path of a model's scores: prepared items' raw similarities times weights with every
normalisation folded in (:class:`Scorer`), and the best classes of each row, best first.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np

from service.model.errors import InvalidInputError
from service.model.features import raw_similarities
from service.model.kernels.scores import affine_rows
from service.model.threads import (
    SCORES_BLAS_MIN_MULTIPLY_ADDS,
    SCORES_BLAS_MIN_SAMPLES,
    SCORES_BLOCK_MAX_BYTES,
    SCORES_BLOCK_ROWS,
)

# A basis item whose weights on the normalised features (P w, in every computed measure and
# class) are all below this share of the largest is left out of the scores, its features taken
# at their offsets (not left out of explanations). With every training item as the basis under
# nystroem(clip), those weights are the kernel SVM's dual coefficients, zero off its support
# vectors but for rounding: breast cancer's every-item model (B = 426) has 71 items above 1e-6
# of its largest weight and 355 at most 3.3e-11 of it, 2.2e-8 together, which is what leaving
# them out moves a score by at most, times the largest normalised feature (there an rbf
# similarity: at most 1).
NEGLIGIBLE_WEIGHT = 1e-9
# Fewer items than this share of the basis are worth a copy of them beside the basis.
USED_SHARE_WORTH_A_COPY = 0.9


def items_in_use(weights: np.ndarray, n_measures: int, n_basis: int) -> np.ndarray | None:
    """The basis items whose weights are not negligible (:data:`NEGLIGIBLE_WEIGHT`).

    Parameters
    ----------
    weights : ndarray of shape (n_measures * n_basis, K)
        Weights on the normalised features of the computed measures, measure by measure.
    n_measures, n_basis : int

    Returns
    -------
    ndarray of int, or None
        Their positions in the basis, ascending; None when every item is in use (or none is:
        a model of zero weights keeps its basis).
    """
    if weights.size == 0:
        return None
    largest = np.abs(weights).max(axis=1).reshape(n_measures, n_basis).max(axis=0)
    used = np.flatnonzero(largest > NEGLIGIBLE_WEIGHT * largest.max())
    return None if len(used) in (0, n_basis) else used


@dataclass(frozen=True, eq=False)
class Scorer:
    """Scores of prepared items: ``raw similarities @ weights + inputs @ input weights +
    intercept``, with every normalisation folded in (see :meth:`Predictor._build_scorer`).

    Parameters
    ----------
    computed : tuple of BoundSimilarity
        The measures whose similarities are computed.
    computed_weights : ndarray of shape (len(computed) * B, K), or None when there are none
    on_inputs : tuple of (BoundSimilarity, ndarray of shape (d, K))
        Measures linear in the input, with their weights on the items they read.
    intercept : ndarray of shape (K,)
    computed_positions : tuple of int
        Where each of ``computed`` stands in the model's order of measures.
    weights : ndarray of shape (M * B, K)
        The folded weights of every measure, in the model's order (what explanations read).
    used_basis : items of the basis' kind, or None
        The basis items :meth:`__call__` reads (:func:`items_in_use`), B' of them; None: all.
    used_weights : ndarray of shape (len(computed) * B', K), or None
        Their rows of ``computed_weights``.
    used_intercept : ndarray of shape (K,), or None
        ``intercept`` with the other items' features taken at their offsets.
    """

    computed: tuple
    computed_weights: np.ndarray | None
    on_inputs: tuple
    intercept: np.ndarray
    computed_positions: tuple = ()
    weights: np.ndarray | None = None
    used_basis: object = None
    used_weights: np.ndarray | None = None
    used_intercept: np.ndarray | None = None

    @classmethod
    def reading_what_counts(cls, scorer: Scorer, basis, scales, offsets) -> Scorer:
        """``scorer``, its scores reading only the basis items in use (:func:`items_in_use`)
        where they are few enough (:data:`USED_SHARE_WORTH_A_COPY`); the others' features
        taken at their offsets, in the intercept.

        Parameters
        ----------
        scorer : Scorer
            One that computes at least one measure's similarities.
        basis : items of the basis' kind, B of them
        scales, offsets : ndarray of shape (len(computed) * B,)
            The affine normalisation of the computed measures' features (the folded weights
            times ``scales`` are the weights on the normalised features).
        """
        n_basis, n_computed = len(basis), len(scorer.computed)
        weights = scorer.computed_weights
        used = items_in_use(weights * scales[:, None], n_computed, n_basis)
        if used is None or len(used) > USED_SHARE_WORTH_A_COPY * n_basis:
            return scorer
        rows = (np.arange(n_computed)[:, None] * n_basis + used).ravel()
        dropped = np.setdiff1d(np.arange(n_computed * n_basis), rows)
        return replace(
            scorer,
            used_basis=basis[used],
            used_weights=np.ascontiguousarray(weights[rows]),
            used_intercept=scorer.intercept + offsets[dropped] @ weights[dropped],
        )

    def __call__(self, items, basis) -> np.ndarray:
        """The scores, shape (n_samples, K): of a large batch, block by block of
        :meth:`block_rows` rows; from the basis items in use only."""
        if self.used_basis is not None:
            basis, weights, intercept = self.used_basis, self.used_weights, self.used_intercept
        else:
            weights, intercept = self.computed_weights, self.intercept
        n_samples, rows = len(items), self.block_rows()
        if n_samples <= rows:
            return self._scored(items, basis, weights, intercept)[0]
        scores = np.empty((n_samples, self.intercept.shape[0]))
        for start in range(0, n_samples, rows):
            block = items[start : start + rows]
            scores[start : start + rows] = self._scored(block, basis, weights, intercept)[0]
        return scores

    def block_rows(self) -> int:
        """Rows scored at a time by :meth:`__call__`:
        :data:`~service.model.threads.SCORES_BLOCK_ROWS` where their similarities take at most
        :data:`~service.model.threads.SCORES_BLOCK_MAX_BYTES`, else the whole batch."""
        weights = self.computed_weights if self.used_weights is None else self.used_weights
        if weights is None:  # nothing computed: no similarities to keep in cache
            return sys.maxsize
        row_bytes = weights.shape[0] * np.dtype(np.float64).itemsize
        if SCORES_BLOCK_ROWS * row_bytes > SCORES_BLOCK_MAX_BYTES:
            return sys.maxsize
        return SCORES_BLOCK_ROWS

    def similarity_calls(
        self, n_samples: int, n_basis: int, *, every_item: bool = False
    ) -> tuple[int, int]:
        """The rows and basis items of each similarity computation that scores ``n_samples``
        items against a basis of ``n_basis``: :meth:`__call__`'s blocks of the items in use,
        or (``every_item``) :meth:`scored`'s whole batch against every item.

        Parameters
        ----------
        n_samples : int
            Items scored.
        n_basis : int
            Items of the whole basis.
        every_item : bool, default=False
            What explanations compute: every basis item, the batch whole.

        Returns
        -------
        rows, basis_items : int
        """
        if every_item:
            return n_samples, n_basis
        in_use = n_basis if self.used_basis is None else len(self.used_basis)
        return min(n_samples, self.block_rows()), in_use

    def scored(self, items, basis) -> tuple[np.ndarray, np.ndarray | None]:
        """The scores, shape (n_samples, K), and the raw similarities of :attr:`computed` on
        every basis item, shape (n_samples, len(computed) * B) (None when none is computed):
        what explanations read."""
        return self._scored(items, basis, self.computed_weights, self.intercept)

    def _scored(self, items, basis, weights, intercept) -> tuple[np.ndarray, np.ndarray | None]:
        n_samples, n_classes = len(items), self.intercept.shape[0]
        similarities = None
        if not self.computed:
            scores = np.tile(intercept, (n_samples, 1))
        elif (
            n_samples < SCORES_BLAS_MIN_SAMPLES
            and n_samples * weights.size < SCORES_BLAS_MIN_MULTIPLY_ADDS
        ):
            similarities = raw_similarities(items, basis, self.computed)
            scores = np.empty((n_samples, n_classes))
            affine_rows(similarities, weights, intercept, scores)
        else:
            similarities = raw_similarities(items, basis, self.computed)
            scores = similarities @ weights
            scores += intercept
        for measure, input_weights in self.on_inputs:
            scores += measure.items_of(items) @ input_weights
        return scores, similarities

    def all_similarities(self, items, basis, computed: np.ndarray | None, measures) -> np.ndarray:
        """The raw similarities of every measure, shape (n_samples, M * B) in the model's order:
        those of :attr:`computed` taken from ``computed`` (rows of :meth:`scored`'s), the
        others (folded into weights on the input) computed here."""
        if len(self.computed) == len(measures):  # every measure computed, in the model's order
            return computed
        n_basis = len(basis)
        out = np.empty((len(items), len(measures) * n_basis))
        at = dict(zip(self.computed_positions, range(len(self.computed)), strict=True))
        for m, measure in enumerate(measures):
            block = out[:, m * n_basis : (m + 1) * n_basis]
            if m in at:
                block[...] = computed[:, at[m] * n_basis : (at[m] + 1) * n_basis]
            else:
                measure.compute(basis, items, block)
        return out


# Up to this many scores in a batch, classify ranks them in Python: a sort of a few numbers
# costs less than the array calls around numpy's (negation, argsort, slice, conversion).
PYTHON_RANKING_MAX_SCORES = 256


def rank_classes(scores: np.ndarray, rows: list[list[float]], k: int) -> list[list[int]]:
    """:func:`best_first` as lists, one per row of ``scores`` (``rows``: the same as lists):
    the same order, ties to the lower index."""
    n_samples, n_classes = scores.shape
    if n_samples * n_classes > PYTHON_RANKING_MAX_SCORES:
        return best_first(scores, k).tolist()
    check_top_k(k)
    columns, kept = range(n_classes), min(k, n_classes)
    if kept == 1:  # max keeps the first of equal scores, as the stable sort does
        return [[max(columns, key=row.__getitem__)] for row in rows]
    # sorted is stable, reverse=True too: equal scores keep their columns' order.
    return [sorted(columns, key=row.__getitem__, reverse=True)[:kept] for row in rows]


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` largest scores of each row, best first (ties: lower index),
    shape (n_samples, min(k, K))."""
    check_top_k(k)
    if k == 1:  # argmax keeps the first of equal scores, as the stable sort does
        return scores.argmax(axis=1)[:, None]
    return np.argsort(-scores, axis=1, kind="stable")[:, : min(k, scores.shape[1])]


def check_top_k(k: int) -> None:
    if k < 1:
        raise InvalidInputError(f"top_k must be at least 1, got {k}")
