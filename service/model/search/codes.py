"""Sparse codes over the atoms, and learning one from examples.

A class's classifier is ``w = D z``; on projected items ``x' = D^T x`` it scores
``z^T x' + b``. :class:`SparseCode` keeps only the non-zeros of ``z``, strongest first, and
:func:`sparse_svm_code` learns one from projected positives and negatives with ``D`` fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.model.errors import InvalidInputError
from service.model.kernels.l1svm import first_entry_c, l1_svm_path

# The regularisation path of learned codes: from the smallest C with a non-zero weight (without
# class weights: the weighted one is larger), C doubles for at most 7 points (up to 64 times the
# start). Solved exactly, points beyond fit a few positives too closely: the top-20 precision on
# a digits catalogue of the training split holds up to 7 points and falls beyond them
# (docs/measurements/benchmarks.md, "Codes from examples").
LEARN_C_FACTOR = 2.0
LEARN_C_STEPS = 7
# Each point is solved until its summed optimality violation is this fraction of the one at
# w = 0 (liblinear's rule, tighter than scikit-learn's default, which Newton steps reach at
# little cost), or for at most this many Newton steps (1 to 5 are usual).
LEARN_TOLERANCE = 1e-6
LEARN_MAX_NEWTON_STEPS = 50
# The most a learned code may score an example before its bias (and the largest bias): the
# hinge's margin is 1, and codes learned on digits score their examples at most 2.5 (150 draws
# of 1 to 5 positives). A code far beyond that separates examples that differ by a hair, as an
# instance does from itself times 1.0000001 (scored at 1e7): nearly the same items.
MAX_LEARNED_SCORE = 1e3


@dataclass(frozen=True)
class SparseCode:
    """A linear classifier over the atoms: ``score = weights . x'[atoms] + bias``.

    Entries are ordered by decreasing ``|weight|``: the strongest atoms first.

    Parameters
    ----------
    atoms : ndarray of shape (nnz,), int64
        Distinct atom indices in ``0..A-1``.
    weights : ndarray of shape (nnz,), float64
    bias : float
    """

    atoms: np.ndarray
    weights: np.ndarray
    bias: float

    @classmethod
    def from_dense(cls, code: np.ndarray, bias: float, n_nonzero: int | None = None) -> SparseCode:
        """The non-zeros of a dense code of shape (A,), the ``n_nonzero`` largest kept."""
        atoms = np.flatnonzero(code)
        order = np.argsort(-np.abs(code[atoms]), kind="stable")
        if n_nonzero is not None:
            order = order[:n_nonzero]
        atoms = atoms[order].astype(np.int64)
        return cls(atoms, code[atoms].astype(np.float64), float(bias))

    @property
    def n_nonzero(self) -> int:
        return int(self.atoms.shape[0])

    def pruned(self, n_nonzero: int | None) -> SparseCode:
        """The ``n_nonzero`` strongest entries (all of them for None)."""
        if n_nonzero is None or n_nonzero >= self.n_nonzero:
            return self
        return SparseCode(self.atoms[:n_nonzero], self.weights[:n_nonzero], self.bias)


def sparse_svm_code(X: np.ndarray, y: np.ndarray, n_nonzero: int) -> SparseCode:
    """An l1-regularised linear SVM (squared hinge, balanced classes) with at most
    ``n_nonzero`` weights, learned along its regularisation path.

    The path starts at scikit-learn's ``l1_min_c`` (the smallest C at which, without class
    weights, a weight leaves zero) and doubles C for at most :data:`LEARN_C_STEPS` points, each
    warm-started from the last (:func:`service.model.kernels.l1svm.l1_svm_path`); the code is
    the last point with at most ``n_nonzero`` non-zeros. Pruning one l1 model to a few
    non-zeros after the fact ranks far worse (docs/measurements/benchmarks.md, "Codes from
    examples"), because the large weights of a dense solution partly cancel each other. Classes are
    balanced: a few positives face many negatives. Each point solves scikit-learn's
    ``LinearSVC(penalty="l1", dual=False, class_weight="balanced")`` at that C (the bias
    penalised as a feature of value 1, as liblinear does).

    Parameters
    ----------
    X : ndarray of shape (n_samples, A)
    y : ndarray of shape (n_samples,)
        +1 for positives, -1 for negatives; both present.
    n_nonzero : int

    Returns
    -------
    SparseCode

    Raises
    ------
    InvalidInputError
        Nothing separates the positives from the negatives (the same examples on both sides),
        or only a code scoring them beyond :data:`MAX_LEARNED_SCORE` does (examples nearly the
        same).
    """
    Z, weights = svm_problem(X, y)
    # scikit-learn's start (no class weights); where that is 0, the balanced one.
    C_start = first_entry_c(Z, np.ones_like(weights)) or first_entry_c(Z, weights)
    w = np.zeros(Z.shape[0])
    status = 0
    if C_start > 0.0:
        status, _ = l1_svm_path(
            Z, weights, C_start, LEARN_C_FACTOR, LEARN_C_STEPS, int(n_nonzero),
            LEARN_TOLERANCE, LEARN_MAX_NEWTON_STEPS, w,
        )  # fmt: skip
    if status == 0:
        # No weight ever leaves zero: rank by the most discriminative atom, if any is.
        gap = X[y > 0].mean(axis=0) - X[y < 0].mean(axis=0)
        best = int(np.argmax(np.abs(gap)))
        if gap[best] == 0.0:
            raise InvalidInputError(
                "nothing separates the positives from the negatives: they are the same items"
            )
        return SparseCode(np.array([best], dtype=np.int64), np.array([np.sign(gap[best])]), 0.0)
    scale = max(float(np.abs(X @ w[:-1]).max()), abs(float(w[-1])))
    if not scale <= MAX_LEARNED_SCORE:
        raise InvalidInputError(
            "the positives and the negatives are nearly the same items: a code that tells them "
            f"apart scores them at {scale:.3g}, beyond {MAX_LEARNED_SCORE:g} times the margin; "
            "give examples that differ"
        )
    return SparseCode.from_dense(w[:-1], w[-1], n_nonzero)


def svm_problem(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The l1 SVM's data as its solver reads them: ``Z = (y [X, 1])^T`` feature major, and the
    balanced class weights ``n / (2 n_class)`` of every sample.

    Parameters
    ----------
    X : ndarray of shape (n_samples, A)
    y : ndarray of shape (n_samples,), +1 or -1

    Returns
    -------
    Z : ndarray of shape (A + 1, n_samples), float64, C-contiguous
    weights : ndarray of shape (n_samples,), float64
    """
    y = np.asarray(y, dtype=np.float64)
    n_samples = y.shape[0]
    Z = np.empty((X.shape[1] + 1, n_samples))
    np.multiply(X.T, y, out=Z[:-1])
    Z[-1] = y
    positive = y > 0
    n_positive = int(positive.sum())
    if n_positive in (0, n_samples):
        raise InvalidInputError("learning a code needs positives and negatives")
    weights = np.where(
        positive, n_samples / (2.0 * n_positive), n_samples / (2.0 * (n_samples - n_positive))
    )
    return Z, weights
