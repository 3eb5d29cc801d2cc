"""The hot path of a model's scores: prepared items' raw similarities times weights with every
normalisation folded in (:class:`Scorer`), and the best classes of each row, best first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.model.errors import InvalidInputError
from service.model.features import raw_similarities
from service.model.kernels.scores import affine_rows
from service.model.threads import SCORES_BLAS_MIN_MULTIPLY_ADDS, SCORES_BLAS_MIN_SAMPLES


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
    """

    computed: tuple
    computed_weights: np.ndarray | None
    on_inputs: tuple
    intercept: np.ndarray
    computed_positions: tuple = ()
    weights: np.ndarray | None = None

    def __call__(self, items, basis) -> np.ndarray:
        return self.scored(items, basis)[0]

    def scored(self, items, basis) -> tuple[np.ndarray, np.ndarray | None]:
        """The scores, shape (n_samples, K), and the raw similarities of :attr:`computed`,
        shape (n_samples, len(computed) * B) (None when none is computed)."""
        n_samples, n_classes = len(items), self.intercept.shape[0]
        similarities = None
        if not self.computed:
            scores = np.tile(self.intercept, (n_samples, 1))
        elif (
            n_samples < SCORES_BLAS_MIN_SAMPLES
            and n_samples * self.computed_weights.size < SCORES_BLAS_MIN_MULTIPLY_ADDS
        ):
            similarities = raw_similarities(items, basis, self.computed)
            scores = np.empty((n_samples, n_classes))
            affine_rows(similarities, self.computed_weights, self.intercept, scores)
        else:
            similarities = raw_similarities(items, basis, self.computed)
            scores = similarities @ self.computed_weights
            scores += self.intercept
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
