"""Choosing the basis: a class-balanced subset of the training items.

``index`` takes evenly spaced items of each class (deterministic, the paper's default);
``random`` draws them uniformly without replacement from each class; ``kmedoids`` clusters
each class with kernel k-medoids under the model's own similarity measures and takes the
medoids, so the basis covers the modes of every class.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

BASIS_STRATEGIES = ("index", "random", "kmedoids")

# k-medoids holds an n x n distance matrix per class: larger classes are clustered on a seeded
# sample of this many items (32 MB of distances).
KMEDOIDS_MAX_CANDIDATES = 2000
KMEDOIDS_MAX_ITER = 100
KMEDOIDS_N_INIT = 8

# f(rows) -> S of shape (M, n, n), S[m, i, j] = measure m of basis item rows[j] against rows[i].
SimilarityBlocks = Callable[[np.ndarray], np.ndarray]


def select_basis(
    y: np.ndarray | None,
    n_samples: int,
    n_per_class: int,
    strategy: str = "index",
    random_state: int | np.random.Generator | None = None,
    similarity: SimilarityBlocks | None = None,
) -> np.ndarray:
    """Indices of a class-balanced basis.

    Parameters
    ----------
    y : ndarray of shape (n_samples,) or None
        Class labels; ``None`` treats all items as one class.
    n_samples : int
    n_per_class : int
        Items wanted per class; a class with fewer items contributes all of them.
    strategy : {"index", "random", "kmedoids"}
    random_state : int, Generator or None
        Seed for ``random`` and for the initialisation of ``kmedoids``.
    similarity : callable, optional
        Required by ``kmedoids``; see :data:`SimilarityBlocks`.

    Returns
    -------
    indices : ndarray of shape (n_basis,), int64
        Grouped by class (in sorted label order), ascending within a class.
    """
    if strategy not in BASIS_STRATEGIES:
        raise ValueError(
            f"unknown basis strategy {strategy!r}; known: {', '.join(BASIS_STRATEGIES)}"
        )
    if not isinstance(n_per_class, (int, np.integer)) or n_per_class < 1:
        raise ValueError(f"n_per_class must be a positive integer, got {n_per_class!r}")
    if strategy == "kmedoids" and similarity is None:
        raise ValueError("the kmedoids basis strategy needs the similarity measures")
    rng = np.random.default_rng(random_state)
    if y is None:
        groups = [np.arange(n_samples)]
    else:
        _, inverse = np.unique(y, return_inverse=True)
        groups = [np.flatnonzero(inverse == c) for c in range(inverse.max() + 1)]
    chosen = []
    for members in groups:
        k = min(int(n_per_class), len(members))
        if strategy == "index":
            picks = members[(np.arange(k) * len(members)) // k]
        elif strategy == "random" or k == len(members):
            picks = np.sort(rng.choice(members, size=k, replace=False))
        else:
            if len(members) > KMEDOIDS_MAX_CANDIDATES:
                members = np.sort(rng.choice(members, KMEDOIDS_MAX_CANDIDATES, replace=False))
            distances = kernel_distances(similarity(members))
            picks = members[kmedoids(distances, k, rng)]
        chosen.append(picks)
    return np.concatenate(chosen).astype(np.int64)


def kernel_distances(similarities: np.ndarray) -> np.ndarray:
    r"""Dissimilarities induced by M similarity matrices, each measure weighted equally.

    .. math:: D = \sum_m \frac{D_m}{\overline{D_m}}, \quad
              D_m(i, j) = \max(0,\ S_m(i, i) + S_m(j, j) - S_m(i, j) - S_m(j, i))

    the squared feature-space distance for a kernel, and its symmetrised analogue for an
    indefinite measure (clipped at zero, where no such space exists).

    Parameters
    ----------
    similarities : ndarray of shape (M, n, n)

    Returns
    -------
    ndarray of shape (n, n)
    """
    total = np.zeros(similarities.shape[1:])
    for S in similarities:
        diagonal = np.diag(S)
        D = np.maximum(diagonal[:, None] + diagonal[None, :] - S - S.T, 0.0)
        mean = D.mean()
        total += D / mean if mean > 0 else D
    return total


def kmedoids(
    distances: np.ndarray,
    k: int,
    rng: np.random.Generator,
    n_init: int = KMEDOIDS_N_INIT,
    max_iter: int = KMEDOIDS_MAX_ITER,
) -> np.ndarray:
    """k-medoids by alternating assignment and medoid update from k-medoids++ starts; the best
    of ``n_init`` runs (alternation alone stops in local optima).

    Parameters
    ----------
    distances : ndarray of shape (n, n)
        Symmetric, non-negative, zero diagonal.
    k : int
        At most n.
    rng : Generator
    n_init : int
    max_iter : int

    Returns
    -------
    medoids : ndarray of shape (k,), int64, ascending
    """
    n = distances.shape[0]
    if k >= n:
        return np.arange(n)
    runs = [_alternate(distances, _plus_plus(distances, k, rng), max_iter) for _ in range(n_init)]
    costs = [distances[:, medoids].min(axis=1).sum() for medoids in runs]
    return np.sort(runs[int(np.argmin(costs))]).astype(np.int64)


def _plus_plus(distances: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-medoids++: each next medoid drawn with probability proportional to its distance from
    the medoids so far, the first uniformly."""
    n = distances.shape[0]
    medoids = [int(rng.integers(n))]
    nearest = distances[medoids[0]].copy()
    for _ in range(1, k):
        weights = nearest.copy()
        weights[medoids] = 0.0
        if weights.sum() > 0:
            pick = int(rng.choice(n, p=weights / weights.sum()))
        else:  # every remaining item coincides with a medoid
            pick = int(rng.choice(np.setdiff1d(np.arange(n), medoids)))
        medoids.append(pick)
        np.minimum(nearest, distances[pick], out=nearest)
    return np.array(medoids)


def _alternate(distances: np.ndarray, medoids: np.ndarray, max_iter: int) -> np.ndarray:
    """Assign every item to its nearest medoid, move each medoid to its cluster's centre item,
    until nothing moves."""
    k = len(medoids)
    current = medoids
    for _ in range(max_iter):
        assignment = np.argmin(distances[:, current], axis=1)
        assignment[current] = np.arange(k)  # ties must not empty a cluster
        updated = current.copy()
        for cluster in range(k):
            members = np.flatnonzero(assignment == cluster)
            within = distances[np.ix_(members, members)].sum(axis=1)
            updated[cluster] = members[np.argmin(within)]
        if np.array_equal(np.sort(updated), np.sort(current)):
            break
        current = updated
    return current
