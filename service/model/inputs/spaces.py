"""Items in several transformed spaces at once: what measures on different input transforms of
the same raw input read (``hog(8): rbf + pixels: rbf``, see :mod:`service.model.similarity`).

A model over one transform passes plain arrays; one over several passes :class:`Spaces`, one
array per distinct transform, and each bound measure reads its own space
(:attr:`~service.model.similarity.BoundSimilarity.space`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass(frozen=True, eq=False)
class Spaces:
    """One batch of items, transformed and normalised in each of a model's spaces.

    Parameters
    ----------
    arrays : tuple of ndarray, each of shape (n_samples, d_s), float64, C-contiguous
        Space ``s``'s items; every array has the same rows. A fitted transform's items are
        bags of visual words (:class:`~service.model.inputs.words.CellDocuments`) instead.
    """

    arrays: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        arrays = tuple(
            np.ascontiguousarray(a, dtype=np.float64) if isinstance(a, np.ndarray) else a
            for a in self.arrays
        )
        if len({len(a) for a in arrays}) > 1:
            raise ValueError("every space holds the same items: the row counts differ")
        object.__setattr__(self, "arrays", arrays)

    @classmethod
    def split(cls, X: np.ndarray, widths: Sequence[int]) -> Spaces:
        """The spaces laid side by side in the columns of ``X``, of ``widths`` numbers each."""
        edges = np.cumsum([0, *widths])
        if edges[-1] != X.shape[1]:
            raise ValueError(f"spaces of {list(widths)} numbers do not make {X.shape[1]} columns")
        return cls(tuple(X[:, a:b] for a, b in pairwise(edges)))

    @property
    def shape(self) -> tuple[int, int]:
        """(n_samples, total numbers over every space)."""
        return len(self), sum(a.shape[1] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, rows) -> Spaces:
        """The items ``rows`` (a slice or indices) in every space."""
        return Spaces(tuple(a[rows] for a in self.arrays))

    def joined(self) -> np.ndarray:
        """Every space side by side: ndarray of shape (n_samples, sum of d_s)."""
        return np.hstack(self.arrays)
