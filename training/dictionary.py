r"""Union-of-Subspaces SVM: class classifiers as sparse codes over a learned dictionary
(US-SVM paper, section 3, Algorithm 1).

Each one-vs-rest classifier is :math:`w_k = D z_k` with a dictionary :math:`D` (d x A, columns
of norm at most 1) and a sparse code :math:`z_k` (A entries). Per class and sample the objective
is

.. math:: f = \max(0, 1 - y ((D z)^T x + b)) + \frac{\alpha}{2} \lVert D z \rVert^2
          + \beta \left(r \lVert z \rVert_1 + (1 - r) \lVert z \rVert_2^2\right)

learned by SGD with :math:`z = u - v`, :math:`u, v \ge 0` (the l1 term then has a gradient),
alternating blocks of code updates and dictionary updates, learning rates
:math:`\lambda / (t + t_0)`, and D's columns projected onto the unit ball after every step.
Variants: US-SVM (r = 1), US-SVM-E (elastic net, r < 1), US-SVM-N (z >= 0: v stays 0) and
US-SVM-NE; alpha = 0 skips the fourth-order term (the fast case). After learning, codes are
pruned to a target number of non-zeros (the largest magnitudes kept). ``transfer`` learns codes
for new classes with D fixed.

The SGD loops are numba kernels: one code step and one dictionary step on one sample, written
into the arrays in place. Accumulators are float64.
"""

from __future__ import annotations

import numba
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import unique_labels
from sklearn.utils.validation import check_is_fitted, validate_data


@numba.njit(cache=True, nogil=True)
def _projected_scores(D, x, Z, b, x_proj, scores):
    """``x_proj = D^T x`` and ``scores = Z^T x_proj + b``, in place."""
    d, A = D.shape
    for a in range(A):
        acc = 0.0
        for i in range(d):
            acc += D[i, a] * x[i]
        x_proj[a] = acc
    for k in range(Z.shape[1]):
        acc = b[k]
        for a in range(A):
            acc += Z[a, k] * x_proj[a]
        scores[k] = acc


@numba.njit(cache=True, nogil=True)
def _hinge_active(y, scores, y_hat):
    r""":math:`\hat y_k = y_k` where the margin is violated, :math:`y_k s_k < 1`, else 0."""
    for k in range(y.shape[0]):
        y_hat[k] = y[k] if y[k] * scores[k] < 1.0 else 0.0


@numba.njit(cache=True, nogil=True)
def code_step(D, gram, x, y, U, V, b, lr, alpha, beta, r, bias_multiplier, nonnegative):
    r"""One SGD step on the codes and biases for one sample (Algorithm 1, inner block).

    .. math:: U \leftarrow \left[U - \lambda_t \left(r\beta J - D^T x \hat y^T + \alpha D^T D Z
              + 2\beta(1 - r) Z\right)\right]_+

    and V likewise with the data and alpha terms negated; :math:`b \leftarrow b + \mu
    \lambda_t \hat y`.

    Parameters
    ----------
    D : ndarray of shape (d, A)
    gram : ndarray of shape (A, A)
        :math:`D^T D` (read only when ``alpha > 0``).
    x : ndarray of shape (d,)
    y : ndarray of shape (K,)
        +1 for the sample's class, -1 for the others.
    U, V : ndarray of shape (A, K)
        Updated in place; V stays 0 when ``nonnegative``.
    b : ndarray of shape (K,)
    lr, alpha, beta, r, bias_multiplier : float
    nonnegative : bool
    """
    A, K = U.shape
    x_proj = np.empty(A)
    scores = np.empty(K)
    y_hat = np.empty(K)
    Z = U - V
    _projected_scores(D, x, Z, b, x_proj, scores)
    _hinge_active(y, scores, y_hat)
    for k in range(K):
        for a in range(A):
            smooth = 2.0 * beta * (1.0 - r) * Z[a, k]
            if alpha > 0.0:
                acc = 0.0
                for c in range(A):
                    acc += gram[a, c] * Z[c, k]
                smooth += alpha * acc
            data = x_proj[a] * y_hat[k]
            U[a, k] = max(U[a, k] - lr * (r * beta - data + smooth), 0.0)
            if not nonnegative:
                V[a, k] = max(V[a, k] - lr * (r * beta + data - smooth), 0.0)
        b[k] += bias_multiplier * lr * y_hat[k]


@numba.njit(cache=True, nogil=True)
def dictionary_step(D, ZZt, x, y, Z, b, lr, alpha):
    r"""One SGD step on the dictionary for one sample, then the projection onto the unit balls.

    .. math:: D \leftarrow D - \lambda_t \left(-x \hat y^T Z^T + \alpha D Z Z^T\right), \qquad
              d_j \leftarrow d_j / \max(\lVert d_j \rVert, 1)

    Parameters
    ----------
    D : ndarray of shape (d, A)
        Updated in place.
    ZZt : ndarray of shape (A, A)
        :math:`Z Z^T` (read only when ``alpha > 0``).
    x : ndarray of shape (d,)
    y : ndarray of shape (K,)
    Z : ndarray of shape (A, K)
    b : ndarray of shape (K,)
    lr, alpha : float
    """
    d, A = D.shape
    K = Z.shape[1]
    x_proj = np.empty(A)
    scores = np.empty(K)
    y_hat = np.empty(K)
    _projected_scores(D, x, Z, b, x_proj, scores)
    _hinge_active(y, scores, y_hat)
    z_y = np.zeros(A)  # Z y_hat
    for a in range(A):
        acc = 0.0
        for k in range(K):
            acc += Z[a, k] * y_hat[k]
        z_y[a] = acc
    if alpha > 0.0:
        shrink = D @ ZZt  # computed before D changes
        for i in range(d):
            for a in range(A):
                D[i, a] += lr * (x[i] * z_y[a] - alpha * shrink[i, a])
    else:
        for i in range(d):
            for a in range(A):
                D[i, a] += lr * x[i] * z_y[a]
    for a in range(A):
        norm = 0.0
        for i in range(d):
            norm += D[i, a] * D[i, a]
        norm = np.sqrt(norm)
        if norm > 1.0:
            for i in range(d):
                D[i, a] /= norm


@numba.njit(cache=True, nogil=True)
def sgd_epochs(
    D, X, Y, U, V, b, order, block_size,
    lambda_z, t0_z, lambda_d, t0_d, alpha, beta, r, bias_multiplier, nonnegative,
):  # fmt: skip
    """Algorithm 1 over the samples in ``order``: blocks of ``block_size`` code steps, each
    followed (if ``lambda_d > 0``) by a block of dictionary steps; t counts every step.

    Returns
    -------
    int
        The number of steps taken.
    """
    t = 0
    n = order.shape[0]
    position = 0
    while position < n:
        gram = D.T @ D
        stop = min(position + block_size, n)
        for p in range(position, stop):
            i = order[p]
            code_step(
                D, gram, X[i], Y[i], U, V, b, lambda_z / (t + t0_z),
                alpha, beta, r, bias_multiplier, nonnegative,
            )  # fmt: skip
            t += 1
        if lambda_d > 0.0:
            Z = U - V
            ZZt = Z @ Z.T
            for p in range(position, stop):
                i = order[p]
                dictionary_step(D, ZZt, X[i], Y[i], Z, b, lambda_d / (t + t0_d), alpha)
                t += 1
        position = stop
    return t


def prune_codes(codes: np.ndarray, n_nonzero: int) -> np.ndarray:
    """Keep the ``n_nonzero`` largest magnitudes of every code (column), zero the rest.

    Parameters
    ----------
    codes : ndarray of shape (A, K)
    n_nonzero : int

    Returns
    -------
    ndarray of shape (A, K)
    """
    if n_nonzero < 0:
        raise ValueError(f"n_nonzero must be >= 0, got {n_nonzero}")
    pruned = np.zeros_like(codes)
    if n_nonzero == 0:
        return pruned
    keep = np.argsort(-np.abs(codes), axis=0, kind="stable")[:n_nonzero]
    columns = np.arange(codes.shape[1])
    pruned[keep, columns] = codes[keep, columns]
    return pruned


class UnionOfSubspacesSVM(ClassifierMixin, BaseEstimator):
    """One-vs-rest linear classifiers ``w_k = D z_k`` with sparse codes over a learned dictionary.

    Parameters
    ----------
    n_atoms : int, default=64
        A, the dictionary's columns.
    alpha : float, default=0.0
        Weight of :math:`\\lVert D z \\rVert^2 / 2`; 0 is the fast case.
    beta : float, default=1e-4
        Weight of the elastic-net penalty on the codes.
    l1_ratio : float, default=1.0
        r: 1 is US-SVM (l1), below 1 the elastic net (US-SVM-E).
    nonnegative : bool, default=False
        US-SVM-N: codes >= 0.
    lambda_z, lambda_d : float, default=1.0, 0.1
        Learning-rate numerators of codes and dictionary; ``lambda_d = 0`` keeps D fixed.
    t0_z, t0_d : float, default=100.0
        Learning-rate offsets: the rate at step t is ``lambda / (t + t0)``.
    bias_multiplier : float, default=0.1
        mu, the bias's learning-rate multiplier.
    n_epochs : int, default=10
    block_size : int, default=100
        Samples per block of code (and then dictionary) steps.
    random_state : int or None, default=None

    Attributes
    ----------
    classes_ : ndarray of shape (K,)
    dictionary_ : ndarray of shape (n_features, A)
    codes_ : ndarray of shape (A, K)
        ``z_k`` in column k.
    intercept_ : ndarray of shape (K,)
    n_steps_ : int
    n_features_in_ : int
    """

    def __init__(
        self,
        n_atoms=64,
        alpha=0.0,
        beta=1e-4,
        l1_ratio=1.0,
        nonnegative=False,
        lambda_z=1.0,
        lambda_d=0.1,
        t0_z=100.0,
        t0_d=100.0,
        bias_multiplier=0.1,
        n_epochs=10,
        block_size=100,
        random_state=None,
    ):
        self.n_atoms = n_atoms
        self.alpha = alpha
        self.beta = beta
        self.l1_ratio = l1_ratio
        self.nonnegative = nonnegative
        self.lambda_z = lambda_z
        self.lambda_d = lambda_d
        self.t0_z = t0_z
        self.t0_d = t0_d
        self.bias_multiplier = bias_multiplier
        self.n_epochs = n_epochs
        self.block_size = block_size
        self.random_state = random_state

    def _check_params(self) -> None:
        for name in ("n_atoms", "n_epochs", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("alpha", "beta", "lambda_d", "bias_multiplier"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("lambda_z", "t0_z", "t0_d"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.l1_ratio <= 1.0:
            raise ValueError(f"l1_ratio must be in [0, 1], got {self.l1_ratio!r}")

    def fit(self, X, y):
        """Learn the dictionary, codes and biases (Algorithm 1).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64, order="C")
        self.classes_ = unique_labels(y)
        if len(self.classes_) < 2:
            raise ValueError("needs at least two classes")
        rng = np.random.default_rng(self.random_state)
        # Start from normalised training items: atoms in the data's span, inside the unit ball.
        start = X[rng.choice(len(X), size=self.n_atoms, replace=len(X) < self.n_atoms)].T
        norms = np.linalg.norm(start, axis=0)
        dictionary = np.ascontiguousarray(start / np.where(norms > 0, norms, 1.0))
        self.dictionary_ = dictionary
        self._learn_codes(X, y, self.lambda_d, rng)
        return self

    def transfer(self, X, y):
        """Learn codes for the classes of ``(X, y)`` with the dictionary fixed.

        Returns
        -------
        UnionOfSubspacesSVM
            A new fitted estimator sharing this dictionary (a copy).
        """
        check_is_fitted(self)
        X, y = validate_data(self, X, y, dtype=np.float64, order="C", reset=False)
        new = self.__class__(**self.get_params())
        new.n_features_in_ = self.n_features_in_
        new.classes_ = unique_labels(y)
        if len(new.classes_) < 2:
            raise ValueError("needs at least two classes")
        new.dictionary_ = self.dictionary_.copy()
        new._learn_codes(X, y, 0.0, np.random.default_rng(self.random_state))
        return new

    def _learn_codes(self, X, y, lambda_d: float, rng) -> None:
        Y = np.where(y[:, None] == self.classes_[None, :], 1.0, -1.0)
        A, K = self.dictionary_.shape[1], len(self.classes_)
        U, V, b = np.zeros((A, K)), np.zeros((A, K)), np.zeros(K)
        order = np.concatenate([rng.permutation(len(X)) for _ in range(self.n_epochs)])
        self.n_steps_ = int(
            sgd_epochs(
                self.dictionary_, X, Y, U, V, b, order.astype(np.int64), int(self.block_size),
                float(self.lambda_z), float(self.t0_z), float(lambda_d), float(self.t0_d),
                float(self.alpha), float(self.beta), float(self.l1_ratio),
                float(self.bias_multiplier), bool(self.nonnegative),
            )
        )  # fmt: skip
        self.codes_ = U - V
        self.intercept_ = b

    def decision_function(self, X, n_nonzero: int | None = None):
        """Scores ``x^T D z_k + b_k``, shape (n_samples, K); with ``n_nonzero``, of the pruned
        codes."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        codes = self.codes_ if n_nonzero is None else prune_codes(self.codes_, n_nonzero)
        return (X @ self.dictionary_) @ codes + self.intercept_

    def predict(self, X):
        """The class with the highest score, shape (n_samples,)."""
        return self.classes_[self.decision_function(X).argmax(axis=1)]
