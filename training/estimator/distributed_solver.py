r"""The squared-hinge solver on feature blocks held by Dask workers.

Features that one worker holds with room to spare (:func:`one_task_limit`) are solved in one
task by the one in-memory solve (:func:`training.estimator.solver.fit_one_vs_rest`). Larger ones
are solved by :class:`DistributedSquaredHinge`, the :class:`~training.estimator.squared_hinge.
SquaredHingeLoss` that :func:`training.estimator.newton_cg.minimize_squared_hinge` minimises:
every value, gradient and Hessian product is a sum over the blocks, each term computed by a
task on the worker that holds the block (the same kernels as in one process,
:mod:`training.estimator.hessian_kernels`), for every problem still iterating at once, and the
terms are added up in a tree of tasks on the workers
(:func:`training.cluster.reductions.tree_sum`), so that the driver receives a few
``(n_features + 1) x k`` blocks a call. Spark's ``treeAggregate`` and dask-glm's ``lbfgs`` have
this shape: the driver holds vectors, the workers hold the data.

The only state between calls is, per shard, which items have positive slack at the points last
evaluated (a boolean n_shard x k array, a future on the shard's worker); it is a function of
the shard and those points alone, so a lost worker costs Dask one recomputation of each of its
shards' features and active sets, never the fit.

Nothing here starts or names a cluster: the caller passes a ``distributed.Client``
(:func:`training.cluster.connection.connect`) and the blocks as futures
(:func:`training.estimator.cluster_fit.feature_blocks`).
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from training.cluster.connection import cluster_workers
from training.cluster.reductions import tree_sum
from training.estimator.newton_cg import TOLERANCE, liblinear_tolerance, minimize_squared_hinge
from training.estimator.solver import (
    correct_predictions,
    fit_one_vs_rest,
    one_vs_rest_problems,
    one_vs_rest_weights,
    problem_signs,
    problem_weights,
    warn_unconverged,
)
from training.estimator.squared_hinge import (
    SquaredHingeLoss,
    active_items,
    squared_hinge_hessian_product,
    squared_hinge_terms,
)

__all__ = [
    "ONE_TASK_BYTES",
    "ONE_TASK_MEMORY_SHARE",
    "DistributedSquaredHinge",
    "FeatureBlock",
    "fit_along_C",
    "fit_one_vs_rest_distributed",
    "one_task_limit",
    "uniform_by_row",
]

logger = logging.getLogger(__name__)


# The one-task solve (fit_one_vs_rest_distributed) uses every thread of the machine it runs on:
# on a cluster of one machine, all of them. There it is chosen whenever the features fit
# ONE_TASK_MEMORY_SHARE of a worker's memory limit (the task holds every block and their
# concatenation, twice the features), since each product over shards costs a round trip
# through the scheduler and a fit makes 100-150 of them, which costs more than one task's lost
# parallelism on a small cluster. Products use every machine of a larger cluster, so there one
# task is chosen only up to ONE_TASK_BYTES, a size at which one task is faster even on one
# thread (docs/measurements/benchmarks.md, "Cost curves").
ONE_TASK_BYTES = 512 * 2**20
ONE_TASK_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class FeatureBlock:
    """One piece's training features and classes, as a worker holds them.

    Attributes
    ----------
    design : ndarray of shape (n_rows, n_features), float64, C-contiguous
    codes : ndarray of shape (n_rows,), int
        Class index of each row.
    """

    design: np.ndarray
    codes: np.ndarray

    @property
    def n_rows(self) -> int:
        return self.design.shape[0]

    def class_counts(self, n_classes: int) -> np.ndarray:
        """Rows of each class: shape (n_classes,)."""
        return np.bincount(self.codes, minlength=n_classes)


@dataclass(frozen=True)
class _Evaluation:
    """A shard's part of one evaluation: the loss's terms and the active items."""

    values: np.ndarray
    gradient: np.ndarray
    active: np.ndarray


def _evaluate(block: FeatureBlock, W: np.ndarray, classes: np.ndarray, C: float) -> _Evaluation:
    """The squared hinge's value and gradient on one shard (a worker's task)."""
    signs = problem_signs(block.codes, classes)
    return _Evaluation(*squared_hinge_terms(block.design, signs, W, C))


def _active(block: FeatureBlock, W: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The items with positive slack at ``W`` (a worker's task)."""
    return active_items(block.design, problem_signs(block.codes, classes), W)


def _active_of(state) -> np.ndarray:
    return state.active if isinstance(state, _Evaluation) else state


def _hessian_part(block: FeatureBlock, state, columns: np.ndarray, V: np.ndarray, C: float):
    """One shard's term of the Hessian products (a worker's task)."""
    return squared_hinge_hessian_product(block.design, _active_of(state)[:, columns], V, C)


def _value_part(evaluation: _Evaluation) -> tuple[np.ndarray, np.ndarray]:
    return evaluation.values, evaluation.gradient


class DistributedSquaredHinge(SquaredHingeLoss):
    """:class:`~training.estimator.squared_hinge.SquaredHingeLoss` over feature shards held by Dask
    workers.

    Parameters
    ----------
    client : distributed.Client
    blocks : list of Future
        Each a :class:`FeatureBlock` on a worker.
    n_features : int
    classes : ndarray of shape (K,), int
        The class index that is each problem's positive side.
    C : float
    """

    def __init__(self, client, blocks: Sequence, n_features: int, classes: np.ndarray, C: float):
        self.client, self.blocks, self.C = client, list(blocks), float(C)
        self.classes = np.asarray(classes)
        self.n_features, self.n_problems = n_features, len(self.classes)
        # The shards' active sets: for the problems listed, at their columns of the point.
        self._states: list | None = None
        self._state_problems = np.empty(0, dtype=np.int64)
        self._state_point = np.empty((n_features + 1, 0))

    def _remember(self, states, W: np.ndarray, problems: np.ndarray) -> None:
        self._states, self._state_problems, self._state_point = states, problems.copy(), W.copy()

    def _columns(self, W: np.ndarray, problems: np.ndarray) -> np.ndarray | None:
        """Where ``problems`` are in the shards' states, if they are there at ``W``."""
        if self._states is None:
            return None
        where = {int(p): j for j, p in enumerate(self._state_problems)}
        if not all(int(p) in where for p in problems):
            return None
        columns = np.array([where[int(p)] for p in problems], dtype=np.int64)
        return columns if np.array_equal(self._state_point[:, columns], W) else None

    def value_and_gradient(self, W, problems):
        # The (n_features + 1) x k blocks travel inside the tasks: scattering them first costs
        # another round trip through the scheduler, more than the blocks' bytes.
        classes = self.classes[problems]
        states = self.client.map(_evaluate, self.blocks, W=W, classes=classes, C=self.C, pure=False)
        self._remember(states, W, problems)
        return tree_sum(self.client, self.client.map(_value_part, states, pure=False))

    def hessian_product(self, W, V, problems):
        columns = self._columns(W, problems)
        if columns is None:
            classes = self.classes[problems]
            states = self.client.map(_active, self.blocks, W=W, classes=classes, pure=False)
            self._remember(states, W, problems)
            columns = np.arange(len(problems))
        parts = self.client.map(
            _hessian_part, self.blocks, self._states, columns=columns, V=V, C=self.C, pure=False
        )
        return tree_sum(self.client, parts)


def _n_rows(block: FeatureBlock) -> int:
    return block.n_rows


def _class_counts(block: FeatureBlock, n_classes: int) -> np.ndarray:
    return block.class_counts(n_classes)


def _correct(block: FeatureBlock, coef: np.ndarray, intercept: np.ndarray) -> int:
    return correct_predictions(block.design, block.codes, coef, intercept)


def _fit_in_one_task(blocks, n_classes, n_threads, **solver):
    """Every block fitted in one worker's memory by the one in-memory solve in ``n_threads``
    threads (a worker's task); with the warnings it gave, for the driver to give again."""
    design = np.vstack([block.design for block in blocks])
    codes = np.concatenate([block.codes for block in blocks])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        fitted = fit_one_vs_rest(design, codes, n_classes, n_jobs=n_threads, **solver)
    return fitted, [str(warning.message) for warning in caught]


def fit_one_vs_rest_distributed(
    client,
    blocks: Sequence,
    n_features: int,
    n_classes: int,
    *,
    C: float,
    max_iter: int,
    tol: float = TOLERANCE,
    start: tuple[np.ndarray, np.ndarray] | None = None,
    one_task_bytes: int | None = None,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """:func:`training.estimator.solver.fit_one_vs_rest` on blocks held by Dask workers: the
    same problems, the same trust-region Newton-CG, all classes in one pass over the blocks.

    Features that one worker holds with room to spare (``one_task_bytes``) are solved in one
    task by ``fit_one_vs_rest`` itself, on the worker holding the most blocks, in the threads
    of its machine: the solver's products would each cost a round trip through the scheduler.
    Larger ones are solved by :class:`DistributedSquaredHinge`, each product a task on every
    block where it is, on the blocks' features as they are (no shift around medians: the same
    model, since dense features are trained on as they are in one process too). Dask reruns a
    lost worker's tasks either way.

    Parameters
    ----------
    client : distributed.Client
    blocks : list of Future
        :class:`FeatureBlock` futures (:func:`training.estimator.cluster_fit.feature_blocks`).
    n_features : int
    n_classes : int
        At least 2.
    C : float
    max_iter : int
    tol : float, default=TOLERANCE
    start : (coef, intercept), optional
        A model to start from (a warm start: the solution at a nearby C).
    one_task_bytes : int, optional
        Features of at most this many bytes (counted dense, with the bias column) are solved
        in one task; default :func:`one_task_limit` of the cluster's workers. 0: always by
        products on every block.

    Returns
    -------
    coef : ndarray of shape (n_classes, n_features)
    intercept : ndarray of shape (n_classes,)
    n_iter : int
    train_accuracy : float
    """
    counts = tree_sum(client, client.map(_class_counts, blocks, n_classes=n_classes, pure=False))
    n_samples = int(counts.sum())
    workers = cluster_workers(client)
    if n_samples * (n_features + 1) * 8 <= one_task_limit(workers.values(), one_task_bytes):
        worker, n_threads = _one_task_site(client, blocks, workers)
        logger.info("solving in one task on %s, %d threads", worker, n_threads)
        fitted, messages = client.submit(
            _fit_in_one_task, blocks, n_classes, n_threads, C=C, max_iter=max_iter, tol=tol,
            start=start, workers=[worker], allow_other_workers=True, pure=False,
        ).result()  # fmt: skip
        for message in messages:
            warnings.warn(message, ConvergenceWarning, stacklevel=2)
        return fitted
    logger.info("solving by products over %d blocks", len(blocks))
    problems = one_vs_rest_problems(n_classes)
    tolerance = liblinear_tolerance(counts[problems], n_samples, tol)
    start_W = None if start is None else problem_weights(*start)
    loss = DistributedSquaredHinge(client, blocks, n_features, problems, C)
    solution = minimize_squared_hinge(loss, max_iter, tolerance, start_W)
    warn_unconverged([solution], max_iter)
    coef, intercept = one_vs_rest_weights(solution.W, n_classes)
    parts = client.map(_correct, blocks, coef=coef, intercept=intercept, pure=False)
    correct = sum(client.gather(parts))
    return coef, intercept, int(solution.n_iter.max()), correct / n_samples


def one_task_limit(workers: Iterable[dict], one_task_bytes: int | None = None) -> float:
    """The largest features (bytes) :func:`fit_one_vs_rest_distributed` solves in one task.

    Parameters
    ----------
    workers : iterable of dict
        The cluster's workers as ``Client.scheduler_info()["workers"]`` describes them (their
        ``host`` and ``memory_limit``, 0 or None for none).
    one_task_bytes : int, optional
        Returned as it is when given.

    Returns
    -------
    float
        :data:`ONE_TASK_MEMORY_SHARE` of the smallest memory limit (of the workers that have
        one) on a cluster of one machine; on several, that and :data:`ONE_TASK_BYTES` at most;
        where no worker has a limit, :data:`ONE_TASK_BYTES`.
    """
    if one_task_bytes is not None:
        return float(one_task_bytes)
    workers = list(workers)
    limits = [info["memory_limit"] for info in workers if (info.get("memory_limit") or 0) > 0]
    if not limits:
        return float(ONE_TASK_BYTES)
    limit = ONE_TASK_MEMORY_SHARE * min(limits)
    one_machine = len({info["host"] for info in workers}) == 1
    return limit if one_machine else min(limit, float(ONE_TASK_BYTES))


def _one_task_site(client, blocks, workers: dict[str, dict]) -> tuple[str, int]:
    """The worker holding the most blocks (the one-task solve runs there, fetching fewer), and
    the threads of every worker on its machine (``workers``: the scheduler's description):
    the fit has nothing else for them while it solves."""
    held = Counter(
        worker
        for holders in client.who_has(blocks).values()
        for worker in holders
        if worker in workers
    )
    worker = held.most_common(1)[0][0] if held else next(iter(workers))
    host = workers[worker]["host"]
    return worker, sum(info["nthreads"] for info in workers.values() if info["host"] == host)


def uniform_by_row(rows: np.ndarray, seed: int) -> np.ndarray:
    r"""A number in [0, 1) for each row number, a function of the row number and the seed alone
    (SplitMix64 of them), so that the same rows get the same numbers however they are cut into
    blocks.

    .. math:: u = \operatorname{splitmix64}(2^{40} s + r) / 2^{64}

    Parameters
    ----------
    rows : ndarray of int, shape (n,)
        Row numbers in the whole data, below :math:`2^{40}`.
    seed : int

    Returns
    -------
    ndarray of shape (n,), float64
    """
    z = (np.uint64(seed) << np.uint64(40)) + rows.astype(np.uint64)
    z += np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _held_part(block: FeatureBlock, first_row: int, held: bool, share: float, seed: int):
    """The rows of a block held out (``held``) or kept for training: each row of the data is
    held out with probability ``share``, drawn from its number (the block's first row is
    ``first_row``) and the seed, the same however the data was cut into blocks."""
    out = uniform_by_row(first_row + np.arange(block.n_rows), seed) < share
    rows = np.flatnonzero(out if held else ~out)
    return FeatureBlock(block.design[rows], block.codes[rows])


def fit_along_C(
    client,
    blocks: Sequence,
    n_features: int,
    n_classes: int,
    Cs: Sequence[float],
    *,
    max_iter: int,
    held_out: float,
    seed: int,
    one_task_bytes: int | None = None,
) -> tuple[list[dict], tuple[float, tuple[np.ndarray, np.ndarray]]]:
    """Fits along a grid of C on every block's training rows, each warm-started from the one
    before (in increasing C, as liblinear's path runs), scored on the rows held out.

    Parameters
    ----------
    client : distributed.Client
    blocks : list of Future
        :class:`FeatureBlock` futures.
    n_features, n_classes : int
    Cs : sequence of float
    max_iter : int
    held_out : float
        Share of the rows held out, each row drawn by its number in the data and ``seed``
        (:func:`uniform_by_row`): the same rows however the data is cut into blocks.
    seed : int
    one_task_bytes : int, optional
        As :func:`fit_one_vs_rest_distributed`'s.

    Returns
    -------
    path : list of dict
        In increasing C: ``C``, ``held_out_accuracy``, ``newton_steps``.
    best : (C, (coef, intercept))
        The most accurate C (the smallest among equals) and its model, to warm-start the fit on
        every row.
    """
    sizes = client.gather(client.map(_n_rows, blocks, pure=False))
    first_rows = [int(row) for row in np.cumsum([0, *sizes[:-1]])]
    kept = client.map(_held_part, blocks, first_rows, held=False, share=held_out, seed=seed,
                      pure=False)  # fmt: skip
    held = client.map(_held_part, blocks, first_rows, held=True, share=held_out, seed=seed,
                      pure=False)  # fmt: skip
    n_held = sum(client.gather(client.map(_n_rows, held, pure=False)))
    path: list[dict] = []
    start = best = None
    for C in sorted(float(c) for c in Cs):
        coef, intercept, n_iter, _ = fit_one_vs_rest_distributed(
            client, kept, n_features, n_classes, C=C, max_iter=max_iter, start=start,
            one_task_bytes=one_task_bytes,
        )  # fmt: skip
        correct = client.map(_correct, held, coef=coef, intercept=intercept, pure=False)
        accuracy = sum(client.gather(correct)) / max(n_held, 1)
        path.append({"C": C, "held_out_accuracy": accuracy, "newton_steps": n_iter})
        start = (coef, intercept)
        if best is None or accuracy > best[0]:
            best = (accuracy, C, start)
    return path, best[1:]
