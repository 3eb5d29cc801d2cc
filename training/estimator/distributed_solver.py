r"""The squared-hinge solver's data term summed over feature shards held by Dask workers.

:class:`DistributedSquaredHinge` is the :class:`~training.estimator.solver.SquaredHingeLoss` that
:func:`training.estimator.solver.minimize_squared_hinge` minimises when the features are larger than
one
worker holds with room to spare (:func:`one_task_limit`; smaller ones are solved in one task):
every value, gradient and Hessian product is a sum over the shards, each term computed by a
task on the worker that holds the shard (the same kernels as in one process,
:mod:`training.estimator.hessian_kernels`), for every problem still iterating at once, and the terms
are added up in a tree of tasks on the workers (:func:`tree_sum`), so that the driver receives a
few ``(n_features + 1) x k`` blocks a call. Spark's ``treeAggregate`` and dask-glm's ``lbfgs`` have
this shape: the driver holds vectors, the workers hold the data.

The only state between calls is, per shard, which items have positive slack at the points last
evaluated (a boolean n_shard x k array, a future on the shard's worker); it is a function of
the shard and those points alone, so a lost worker costs Dask one recomputation of each of its
shards' features and active sets, never the fit.

Nothing here starts or names a cluster: the caller passes a ``distributed.Client``
(:func:`training.cluster.connection.connect`) and the shards as futures (:func:`persist_blocks`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from service.model.threads import limit_threads
from training.cluster.reductions import tree_sum
from training.estimator.solver import (
    TOLERANCE,
    InMemorySquaredHinge,
    SquaredHingeLoss,
    active_items,
    liblinear_tolerance,
    minimize_squared_hinge,
    one_vs_rest_problems,
    one_vs_rest_weights,
    problem_signs,
    problem_weights,
    squared_hinge_hessian_product,
    squared_hinge_terms,
    warn_unconverged,
)

__all__ = [
    "ONE_TASK_BYTES",
    "ONE_TASK_MEMORY_SHARE",
    "DistributedSquaredHinge",
    "FeatureBlock",
    "fit_along_C",
    "fit_one_vs_rest_distributed",
    "one_task_limit",
    "persist_blocks",
    "shard_blocks",
    "shard_classes",
    "uniform_by_row",
]

logger = logging.getLogger(__name__)


# The one-task solve (fit_one_vs_rest_distributed) uses every thread of the machine it runs on:
# on a cluster of one machine, all of them. There it is chosen whenever the features fit
# ONE_TASK_MEMORY_SHARE of a worker's memory limit (the task holds every block and their
# concatenation, twice the features), since each product over shards costs a round trip
# through the scheduler (10-15 ms here) and a fit makes 100-150 of them. Measured, local:2 on
# 2 cores, B = 1,000, 50,000 items (400 MB): 1.15x one process's time in one task, 1.44x by
# products. Products use every machine of a larger cluster, so there one task is chosen only
# up to ONE_TASK_BYTES: on two one-thread workers one task on one thread was still the faster
# at 400 MB (1.15x against 1.44x, before the task took its machine's threads).
ONE_TASK_BYTES = 512 * 2**20
ONE_TASK_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class FeatureBlock:
    """One shard's training features and classes, as a worker holds them.

    Attributes
    ----------
    design : ndarray (C-contiguous) or csr_matrix of shape (n_rows, n_features)
    codes : ndarray of shape (n_rows,), int
        Class index of each row.
    """

    design: np.ndarray | sp.csr_matrix
    codes: np.ndarray

    @property
    def n_rows(self) -> int:
        return self.design.shape[0]


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
    """:class:`~training.estimator.solver.SquaredHingeLoss` over feature shards held by Dask
    workers.

    Parameters
    ----------
    client : distributed.Client
    blocks : list of Future
        Each a :class:`FeatureBlock` on a worker (persisted: :func:`persist_blocks`).
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
        # another round trip (measured: 50 ms against 30 ms a call).
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


def _block_of(design, codes) -> FeatureBlock:
    design = design if sp.issparse(design) else np.ascontiguousarray(design, dtype=np.float64)
    return FeatureBlock(design, np.asarray(codes, dtype=np.int64))


def persist_blocks(client, designs: Sequence, codes: Sequence) -> list:
    """Futures of :class:`FeatureBlock` from futures (or arrays) of shards' features and codes,
    kept on the workers."""
    return client.map(_block_of, designs, codes, pure=False)


def _n_rows(block: FeatureBlock) -> int:
    return block.n_rows


def _class_counts(block: FeatureBlock, n_classes: int) -> np.ndarray:
    return np.bincount(block.codes, minlength=n_classes)


def _correct(block: FeatureBlock, coef: np.ndarray, intercept: np.ndarray) -> int:
    scores = block.design @ coef.T + intercept
    return int((scores.argmax(axis=1) == block.codes).sum())


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
    """:func:`training.estimator.solver.fit_one_vs_rest` on shards held by Dask workers: the same
    problems, the same trust-region Newton-CG, all classes in one pass over the shards.

    Features that one worker holds with room to spare (``one_task_bytes``) are solved in one
    task, on the worker holding the most blocks, in the threads of its machine: the solver's
    products would each cost a round trip through the scheduler. Larger ones are solved by
    :class:`DistributedSquaredHinge`, each product a task on every block where it is. Dask
    reruns a lost worker's tasks either way.

    The design is each block's features as they are (no shift around medians: a dense or
    sparse block is used as given), so the model equals the one-process fit's wherever that
    trains on the features themselves (dense features: always).

    Parameters
    ----------
    client : distributed.Client
    blocks : list of Future
        :class:`FeatureBlock` futures (:func:`persist_blocks`).
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
    problems = one_vs_rest_problems(n_classes)
    counts = tree_sum(client, client.map(_class_counts, blocks, n_classes=n_classes, pure=False))
    n_samples = int(counts.sum())
    tolerance = liblinear_tolerance(counts[problems], n_samples, tol)
    start_W = None if start is None else problem_weights(*start)
    workers = client.scheduler_info()["workers"]
    if n_samples * (n_features + 1) * 8 <= one_task_limit(workers.values(), one_task_bytes):
        worker, n_threads = _one_task_site(client, blocks, workers)
        logger.info("solving in one task on %s, %d threads", worker, n_threads)
        solution, correct = client.submit(
            _solve_in_one_task, blocks, n_classes, C, max_iter, tolerance, start_W, n_threads,
            workers=[worker], allow_other_workers=True, pure=False,
        ).result()  # fmt: skip
        coef, intercept = one_vs_rest_weights(solution.W, n_classes)
    else:
        logger.info("solving by products over %d blocks", len(blocks))
        loss = DistributedSquaredHinge(client, blocks, n_features, problems, C)
        solution = minimize_squared_hinge(loss, max_iter, tolerance, start_W)
        coef, intercept = one_vs_rest_weights(solution.W, n_classes)
        parts = client.map(_correct, blocks, coef=coef, intercept=intercept, pure=False)
        correct = sum(client.gather(parts))
    warn_unconverged([solution], max_iter)
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


def _solve_in_one_task(blocks, n_classes, C, max_iter, tolerance, start, n_threads):
    """The problems solved on one worker's copy of every block, by the one-process loss in
    ``n_threads`` threads (a worker's task): the :class:`~training.estimator.solver.Solution` and
    the items it classifies correctly."""
    designs = [block.design for block in blocks]
    design = sp.vstack(designs, format="csr") if sp.issparse(designs[0]) else np.vstack(designs)
    codes = np.concatenate([block.codes for block in blocks])
    signs = problem_signs(codes, one_vs_rest_problems(n_classes))
    with limit_threads(blas_threads=1):
        solution = minimize_squared_hinge(
            InMemorySquaredHinge(design, signs, C, n_threads=n_threads), max_iter, tolerance, start
        )
    coef, intercept = one_vs_rest_weights(solution.W, n_classes)
    correct = int(((design @ coef.T + intercept).argmax(axis=1) == codes).sum())
    return solution, correct


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


def _shard_block(shard, classes: np.ndarray, featurize) -> FeatureBlock:
    """Read a shard and compute its features (a worker's task): its block."""
    from training.cluster.shards import read_shard

    X, y = read_shard(shard)
    codes = np.searchsorted(classes, y)
    unknown = (codes >= len(classes)) | (classes[np.minimum(codes, len(classes) - 1)] != y)
    if unknown.any():
        raise ValueError(f"{shard.path}: label {y[np.argmax(unknown)]!r} is not a known class")
    return _block_of(X if featurize is None else featurize(X), codes)


def _labels(shard) -> np.ndarray:
    from training.cluster.shards import read_shard

    return np.unique(read_shard(shard)[1])


def shard_classes(client, shards: Sequence) -> np.ndarray:
    """The sorted labels (as text) of every shard, each shard's found where it is read."""
    return np.unique(np.concatenate(client.gather(client.map(_labels, shards, pure=False))))


def shard_blocks(client, shards: Sequence, classes: np.ndarray, featurize=None) -> list:
    """Futures of each shard's :class:`FeatureBlock`, computed and kept on the workers.

    Each block is a task that reads its shard and computes its features, so that a lost
    worker's blocks are computed again from the files (Dask keeps that lineage); Dask spills
    blocks to disk when a worker's memory runs short.

    Parameters
    ----------
    client : distributed.Client
    shards : sequence of training.cluster.shards.Shard
    classes : ndarray of str
        The sorted labels (:func:`shard_classes`): a row's class is its label's index.
    featurize : callable, optional
        Rows (n, d) to features (n, B), picklable (a fitted expansion's ``transform``); None:
        the rows are the features.
    """
    return client.map(_shard_block, shards, classes=classes, featurize=featurize, pure=False)
