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
    r""":math:`x' = D^T x` and :math:`s = Z^T x' + b`, written into ``x_proj`` and ``scores``."""
    d, A = D.shape
    # Row by row (D is C-ordered), each x_proj[a] summed over i in increasing order.
    for a in range(A):
        x_proj[a] = 0.0
    for i in range(d):
        x_i = x[i]
        for a in range(A):
            x_proj[a] += D[i, a] * x_i
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
def _difference(U, V, Z):
    r""":math:`Z = U - V`, written into ``Z``."""
    A, K = U.shape
    for a in range(A):
        for k in range(K):
            Z[a, k] = U[a, k] - V[a, k]


@numba.njit(cache=True, nogil=True)
def code_step(
    D, gram, x, y, U, V, b, lr, alpha, beta, r, bias_multiplier, nonnegative,
    x_proj, scores, y_hat, Z,
):  # fmt: skip
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
    x_proj : ndarray of shape (A,)
        Workspace: :math:`D^T x` on return.
    scores, y_hat : ndarray of shape (K,)
        Workspaces: the scores before the step and :math:`\hat y` on return.
    Z : ndarray of shape (A, K)
        Workspace: :math:`U - V` before the step on return.
    """
    A, K = U.shape
    _difference(U, V, Z)
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
def dictionary_step(D, ZZt, x, y, Z, b, lr, alpha, x_proj, scores, y_hat, z_y, shrink, norms):
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
    x_proj : ndarray of shape (A,)
        Workspace: :math:`D^T x` before the step on return.
    scores, y_hat : ndarray of shape (K,)
        Workspaces: the scores before the step and :math:`\hat y` on return.
    z_y : ndarray of shape (A,)
        Workspace: :math:`Z \hat y` on return.
    shrink : ndarray of shape (d, A)
        Workspace: :math:`D Z Z^T` before the step on return (written only when ``alpha > 0``).
    norms : ndarray of shape (A,)
        Workspace: the columns' norms before the projection on return.
    """
    d, A = D.shape
    K = Z.shape[1]
    _projected_scores(D, x, Z, b, x_proj, scores)
    _hinge_active(y, scores, y_hat)
    for a in range(A):
        acc = 0.0
        for k in range(K):
            acc += Z[a, k] * y_hat[k]
        z_y[a] = acc
    for a in range(A):
        norms[a] = 0.0
    if alpha > 0.0:
        np.dot(D, ZZt, shrink)  # computed before D changes
        for i in range(d):
            for a in range(A):
                D[i, a] += lr * (x[i] * z_y[a] - alpha * shrink[i, a])
                norms[a] += D[i, a] * D[i, a]
    else:
        for i in range(d):
            step = lr * x[i]
            for a in range(A):
                D[i, a] += step * z_y[a]
                norms[a] += D[i, a] * D[i, a]
    outside = False
    for a in range(A):
        norms[a] = np.sqrt(norms[a])
        outside |= norms[a] > 1.0
    if outside:
        for i in range(d):
            for a in range(A):
                if norms[a] > 1.0:
                    D[i, a] /= norms[a]


@numba.njit(cache=True, nogil=True)
def sgd_epochs(
    D, X, Y, U, V, b, order, block_size,
    lambda_z, t0_z, lambda_d, t0_d, alpha, beta, r, bias_multiplier, nonnegative,
):  # fmt: skip
    """Algorithm 1 over the samples in ``order``: blocks of ``block_size`` code steps, each
    followed (if ``lambda_d > 0``) by a block of dictionary steps; t counts every step.

    The steps' workspaces are allocated once here; :math:`D^T D` is refreshed before every block
    of code steps and :math:`Z Z^T` before every block of dictionary steps (only when
    ``alpha > 0``: they are read only then).

    Returns
    -------
    int
        The number of steps taken.
    """
    d, A = D.shape
    K = U.shape[1]
    x_proj = np.empty(A)
    scores = np.empty(K)
    y_hat = np.empty(K)
    z_y = np.empty(A)
    norms = np.empty(A)
    Z = np.empty((A, K))
    gram = np.zeros((A, A))
    ZZt = np.zeros((A, A))
    shrink = np.empty((d, A) if alpha > 0.0 else (0, 0))
    t = 0
    n = order.shape[0]
    position = 0
    while position < n:
        if alpha > 0.0:
            np.dot(D.T, D, gram)
        stop = min(position + block_size, n)
        for p in range(position, stop):
            i = order[p]
            code_step(
                D, gram, X[i], Y[i], U, V, b, lambda_z / (t + t0_z),
                alpha, beta, r, bias_multiplier, nonnegative, x_proj, scores, y_hat, Z,
            )  # fmt: skip
            t += 1
        if lambda_d > 0.0:
            _difference(U, V, Z)
            if alpha > 0.0:
                np.dot(Z, Z.T, ZZt)
            for p in range(position, stop):
                i = order[p]
                dictionary_step(
                    D, ZZt, X[i], Y[i], Z, b, lambda_d / (t + t0_d), alpha,
                    x_proj, scores, y_hat, z_y, shrink, norms,
                )  # fmt: skip
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

    The defaults were tuned on validation splits of two real data sets (scikit-learn's digits,
    normalised pixels; BE-SVM ``sensing1`` features of Debian's fortunes, 32 classes) for the
    mAP of codes pruned to a few non-zeros (see :mod:`training.retrieval.evaluation`): Pegasos-like
    large code rates (:math:`\\lambda_z / t_{z,0} = 1`, decaying as :math:`1/t`), a fast-moving
    dictionary, large blocks and alpha = 0. ``beta`` is the knob to cross-validate first (the
    paper's advice, with ``lambda_z`` and ``lambda_d``): larger gives sparser codes that rank
    better at 1-5 non-zeros (digits liked 2e-3 to 1e-2), smaller suits data with weaker
    per-class signal (fortunes liked 5e-4); 1e-3 serves both. ``lambda_d`` trades the training
    classes against :meth:`transfer`: a faster dictionary (300) ranked the training classes
    slightly better, a slower one (30, or 0: atoms stay training items) transferred better to
    classes it never saw; 100 is between.

    Parameters
    ----------
    n_atoms : int, default=64
        A, the dictionary's columns.
    alpha : float, default=0.0
        Weight of :math:`\\lVert D z \\rVert^2 / 2`; 0 is the fast case (alpha > 0 costs
        :math:`O(d A^2)` per dictionary step and did not rank better in tuning).
    beta : float, default=1e-3
        Weight of the elastic-net penalty on the codes.
    l1_ratio : float, default=1.0
        r: 1 is US-SVM (l1), below 1 the elastic net (US-SVM-E).
    nonnegative : bool, default=False
        US-SVM-N: codes >= 0.
    lambda_z, lambda_d : float, default=1e4, 100.0
        Learning-rate numerators of codes and dictionary; ``lambda_d = 0`` keeps D fixed.
    t0_z, t0_d : float, default=1e4, 100.0
        Learning-rate offsets: the rate at step t is ``lambda / (t + t0)``, t counting the code
        and dictionary steps together.
    bias_multiplier : float, default=1.0
        mu, the bias's learning-rate multiplier.
    n_epochs : int, default=20
    block_size : int, default=1000
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
        beta=1e-3,
        l1_ratio=1.0,
        nonnegative=False,
        lambda_z=1e4,
        lambda_d=100.0,
        t0_z=1e4,
        t0_d=100.0,
        bias_multiplier=1.0,
        n_epochs=20,
        block_size=1000,
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
            raise ValueError(f"needs at least two classes, got {len(self.classes_)} class")
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
            raise ValueError(f"needs at least two classes, got {len(new.classes_)} class")
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

    def class_scores(self, X, n_nonzero: int | None = None):
        """Every class's score ``x^T D z_k + b_k``, shape (n_samples, K), two classes included
        (each class has its own code); with ``n_nonzero``, of the pruned codes."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        codes = self.codes_ if n_nonzero is None else prune_codes(self.codes_, n_nonzero)
        return (X @ self.dictionary_) @ codes + self.intercept_

    def decision_function(self, X):
        """Scores in scikit-learn's convention: :meth:`class_scores`, shape (n_samples, K); for
        two classes the difference of the second's and the first's, shape (n_samples,)."""
        scores = self.class_scores(X)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict(self, X):
        """The class with the highest score, shape (n_samples,)."""
        check_is_fitted(self)
        return self.classes_[self.class_scores(X).argmax(axis=1)]
