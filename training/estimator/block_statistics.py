"""Statistics of a training set learned from sums over blocks of its rows, so that one process
and a cluster learn them by the same code: one process holds one block, every row; a cluster's
blocks are the rows its workers hold, each block's sums computed where it is and added up in a
tree (:func:`training.cluster.reductions.tree_sum`).

A statistic that needs what an earlier one found (a spread needs the mean) takes several
passes: each pass adds up every block's sums (:meth:`BlockStatistics.sums`), then finishes from
the totals (:meth:`BlockStatistics.finish`), which the next pass reads. The input normalisation
(:mod:`training.estimator.preprocessing`) and the similarities' normalisations
(:mod:`training.estimator.normalization`) are learned this way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

# What the passes have found so far, by name (a mean, a spread), as :meth:`finish` returns it.
Learned = dict[str, Any]


class BlockStatistics(ABC):
    """Statistics learned in :attr:`passes` passes over blocks of rows.

    Attributes
    ----------
    passes : int
        Passes over the rows; 0 for statistics that read no rows.
    """

    passes: ClassVar[int] = 0

    @abstractmethod
    def sums(self, block: np.ndarray, step: int, learned: Learned) -> tuple[np.ndarray, ...]:
        """One block's sums in pass ``step``, which add up over the blocks.

        Parameters
        ----------
        block : ndarray of shape (n_rows, n_features)
        step : int
            The pass, from 0.
        learned : dict
            What the passes before found.

        Returns
        -------
        tuple of ndarray
        """

    @abstractmethod
    def finish(
        self, totals: tuple[np.ndarray, ...], step: int, learned: Learned, n_samples: int
    ) -> Learned:
        """What pass ``step`` finds from the totals of every block's sums over ``n_samples``
        rows: ``learned`` with its findings added."""


def learn(
    statistics: BlockStatistics,
    n_samples: int,
    add_up: Callable[[int, Learned], tuple[np.ndarray, ...]],
) -> Learned:
    """Run the passes of ``statistics``.

    Parameters
    ----------
    statistics : BlockStatistics
    n_samples : int
        Rows in all the blocks.
    add_up : callable
        ``add_up(step, learned)``: the totals of ``statistics.sums(block, step, learned)`` over
        every block (:func:`learn_in_one_block` for one process).

    Returns
    -------
    dict
        What the last pass found.
    """
    learned: Learned = {}
    for step in range(statistics.passes):
        learned = statistics.finish(add_up(step, learned), step, learned, n_samples)
    return learned


def learn_in_one_block(statistics: BlockStatistics, block: np.ndarray) -> Learned:
    """:func:`learn` in one process: ``block`` holds every row."""
    return learn(
        statistics, len(block), lambda step, learned: statistics.sums(block, step, learned)
    )
