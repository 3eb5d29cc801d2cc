"""Choosing the basis: a class-balanced subset of the training items.

``index`` takes evenly spaced items of each class (deterministic, the paper's default);
``random`` draws them uniformly without replacement from each class.
"""

from __future__ import annotations

import numpy as np

BASIS_STRATEGIES = ("index", "random")


def select_basis(
    y: np.ndarray | None,
    n_samples: int,
    n_per_class: int,
    strategy: str = "index",
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """Indices of a class-balanced basis.

    Parameters
    ----------
    y : ndarray of shape (n_samples,) or None
        Class labels; ``None`` treats all items as one class.
    n_samples : int
    n_per_class : int
        Items wanted per class; a class with fewer items contributes all of them.
    strategy : {"index", "random"}
    random_state : int, Generator or None
        Seed for ``random``.

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
        else:
            picks = np.sort(rng.choice(members, size=k, replace=False))
        chosen.append(picks)
    return np.concatenate(chosen).astype(np.int64)
