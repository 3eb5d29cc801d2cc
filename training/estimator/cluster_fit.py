"""Fitting a :class:`~training.estimator.estimator.BasisExpandingSVC` on a Dask cluster.

The estimator's ``fit`` comes here when it has a ``cluster``, runs inside ``with
distributed.Client(...)``, or is given a :class:`~training.cluster.shards.ShardedData`. The
steps are the one-process fit's, each where its data lives:

1. The rows live on the workers: each shard is read there (its lineage is the file, so a lost
   worker's shards are read again), or, for arrays given to ``fit``, scattered in row blocks.
2. The labels' classes, the input normalisation's mean and scale, and the feature
   normalisation's statistics (``besvm``, ``zscore``) are sums over the shards, added up where
   they are: the same statistics, learned by the same code, as one process learns them from
   one block of every row (:mod:`training.estimator.block_statistics`).
3. The basis is drawn on the driver from a sample of each class: for ``index``, the default
   strategy, the very items a one-process fit picks (evenly spaced over the class, located by
   the shards' class counts); ``random`` and ``kmedoids`` draw from the class's first
   :data:`SAMPLE_PER_BASIS_ITEM` times as many items.
4. Each worker expands its shards on the basis (the same kernels and normalisation as serving)
   and keeps the features, spilled to disk by Dask when memory runs short.
5. The one-vs-rest problems are solved over those features by the one solver
   (:func:`training.estimator.distributed_solver.fit_one_vs_rest_distributed`): the driver holds
   (B + 1) x K vectors.

Dense inputs only (vectors and images): documents need a vocabulary and the ``bof`` transform
its visual words, both learned from every item in one process (:class:`OneProcessOnly`).
:func:`feature_blocks` makes each piece's features where it is.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

import numpy as np

from service.model import SpecError
from service.model.inputs.spec import InputSpec
from service.model.similarity import parse_specs
from training.cluster.connection import client_for, cluster_workers, in_process_client
from training.cluster.reductions import tree_sum
from training.cluster.rows import (
    PIECES_PER_THREAD,
    class_counts_by_piece,
    classes_of,
    items_at,
    row_pieces,
)
from training.cluster.shards import ShardedData, read_shard
from training.estimator.block_statistics import BlockStatistics, Learned, learn
from training.estimator.distributed_solver import (
    FeatureBlock,
    fit_along_C,
    fit_one_vs_rest_distributed,
)
from training.estimator.expansion import BasisExpansion
from training.estimator.normalization import normalization_rule
from training.estimator.preparation import DensePreparation, is_texts
from training.estimator.preprocessing import InputNormalizer, InputStatistics

__all__ = [
    "ROWS_PER_SCATTERED_BLOCK",
    "SAMPLE_PER_BASIS_ITEM",
    "OneProcessOnly",
    "fit_on_cluster",
]

logger = logging.getLogger(__name__)

# Arrays given to fit are scattered to the workers in blocks of at most this many rows.
ROWS_PER_SCATTERED_BLOCK = 20_000
# The random and kmedoids strategies draw each class's basis from this many times as many of
# its first items.
SAMPLE_PER_BASIS_ITEM = 20
# The share of each shard's items held out to score a grid of C (fit_on_cluster's C_grid).
HELD_OUT_SHARE = 0.1


class OneProcessOnly(ValueError):
    """The inputs or the configuration train in one process only; the message says why."""


def fit_on_cluster(estimator, X, y=None, *, C_grid: Sequence[float] | None = None):
    """Fit ``estimator`` (a BasisExpandingSVC with fixed measures) on a Dask cluster.

    Parameters
    ----------
    estimator : BasisExpandingSVC
    X : ShardedData, or array-like of shape (n_samples, n_features) or images
    y : array-like of shape (n_samples,), or None with ShardedData
    C_grid : sequence of float, optional
        Choose C among these first (:func:`training.estimator.distributed_solver.fit_along_C`: a
        warm-started path on every shard, :data:`HELD_OUT_SHARE` of each shard's items held out to
        score it); the estimator is then fitted on every item at the C chosen, which its ``C``
        parameter is set to, and ``C_path_`` records the path.

    Returns
    -------
    estimator

    Raises
    ------
    OneProcessOnly
        Documents, or an input transform that learns from every item (``bof``): checked
        before any work is sent.
    """
    if is_texts(X):
        raise OneProcessOnly(
            "documents train in one process (their vocabulary is learned from every text)"
        )
    _refuse_learned_transforms(estimator)
    with client_for(estimator.cluster) as client:
        if client is None:  # sharded data and no cluster: this process reads every shard
            with in_process_client() as reader:
                return _fit(estimator, reader, X, y, C_grid)
        return _fit(estimator, client, X, y, C_grid)


def _refuse_learned_transforms(estimator) -> None:
    """Raise OneProcessOnly for an input transform that learns from every item (bof)."""
    transform = estimator.input_transform
    if transform is not None and transform.strip().lower().startswith("bof"):
        raise OneProcessOnly(
            f"input_transform {transform} learns its visual words from every training item, "
            "in one process"
        )


def _pieces(client, estimator, X, y):
    """Futures of the rows and labels on the workers, in pieces that keep every worker's
    threads busy (:data:`PIECES_PER_THREAD`), the input spec and the count."""
    n_pieces = PIECES_PER_THREAD * sum(client.nthreads().values())
    if isinstance(X, ShardedData):
        if y is not None:
            raise ValueError("sharded data holds its labels: pass no y")
        spec = (
            InputSpec.parse(estimator.input_shape)
            if estimator.input_shape
            else InputSpec("vector", (X.n_features,))
        )
        if spec.n_features != X.n_features:
            raise ValueError(
                f"input_shape {spec} has {spec.n_features} numbers, rows {X.n_features}"
            )
        pieces = row_pieces([shard.n_rows for shard in X.shards], n_pieces)
        shards, starts, stops = zip(*((X.shards[i], a, b) for i, a, b in pieces), strict=True)
        return client.map(read_shard, shards, starts, stops, pure=False), spec, X.n_samples
    preparation = DensePreparation(
        InputSpec.parse(estimator.input_shape) if estimator.input_shape else None
    )
    X, y = preparation.validate_fit(estimator, X, y)
    labels = np.asarray(y)
    n_pieces = max(n_pieces, -(-len(X) // ROWS_PER_SCATTERED_BLOCK))
    blocks = [(X[a:b], labels[a:b]) for _, a, b in row_pieces([len(X)], n_pieces)]
    return client.scatter(blocks), preparation.spec, len(X)


def _transformed(piece, transform, spec) -> np.ndarray:
    return transform.apply(piece[0], spec)


def _design(block: FeatureBlock) -> np.ndarray:
    return block.design


def _part_sums(part, rows, statistics: BlockStatistics, step: int, learned: Learned):
    """One part's sums in a pass of ``statistics`` over the rows ``rows(part)`` (a worker's
    task)."""
    return statistics.sums(rows(part), step, learned)


def _learn_on_workers(client, parts, rows, statistics: BlockStatistics, n_samples: int):
    """:func:`~training.estimator.block_statistics.learn` over the parts the workers hold, the
    rows of each being ``rows(part)``, its sums added up where they are."""

    def add_up(step: int, learned: Learned):
        sums = client.map(
            _part_sums,
            parts,
            rows=rows,
            statistics=statistics,
            step=step,
            learned=learned,
            pure=False,
        )
        return tree_sum(client, sums)

    return learn(statistics, n_samples, add_up)


def _normalizers(client, pieces, preparation, n_samples: int) -> list[InputNormalizer]:
    """Each space's InputNormalizer learned from the rows where they are, as
    InputNormalizer.fit learns it in one process."""
    scaling = preparation.input_normalization
    return [
        InputNormalizer.from_learned(
            scaling,
            _learn_on_workers(
                client,
                pieces,
                functools.partial(_transformed, transform=transform, spec=preparation.spec),
                InputStatistics(scaling),
                n_samples,
            ),
        )
        for transform in preparation.transforms
    ]


def _sample(client, pieces, preparation, classes, per_class: int, evenly: bool):
    """Each class's items that the basis is drawn from, in the order a one-process fit sees
    them: ``evenly``, the ``index`` strategy's own picks (evenly spaced over the class); else
    the class's first ``per_class`` items."""
    counts = class_counts_by_piece(client, pieces, classes)
    wanted = []
    for total in counts.sum(axis=0):
        k = min(per_class, int(total))
        wanted.append((np.arange(k) * total) // k if evenly else np.arange(k))
    return items_at(client, pieces, classes, counts, wanted, preparation.prepare)


def _raw_maps(rows: np.ndarray, preparation, expansion: BasisExpansion) -> np.ndarray:
    return expansion.raw_maps(preparation.prepare(rows))


def feature_blocks(client, pieces: Sequence, classes: np.ndarray, features, **arguments) -> list:
    """Futures of each piece's :class:`FeatureBlock`, computed and kept where the piece is
    (Dask computes a lost worker's again from its lineage, and spills them to disk when a
    worker's memory runs short).

    Parameters
    ----------
    client : distributed.Client
    pieces : sequence of Future
        Each ``(rows, labels)`` on a worker (:mod:`training.cluster.rows`).
    classes : ndarray
        The sorted labels (:func:`training.cluster.rows.classes_of`): a row's class is its
        label's index.
    features : callable
        ``features(rows, **arguments)``: the rows' features, picklable.
    **arguments
        Passed to ``features`` on the worker (a future, such as a scattered expansion, is
        there as its value).
    """
    return client.map(
        _feature_block, pieces, classes=classes, features=features, pure=False, **arguments
    )


def _feature_block(piece, classes, features, **arguments) -> FeatureBlock:
    design = np.ascontiguousarray(features(piece[0], **arguments), dtype=np.float64)
    return FeatureBlock(design, np.searchsorted(classes, piece[1]))


def _normalized(block: FeatureBlock, expansion: BasisExpansion) -> FeatureBlock:
    """A block's raw kernel maps normalised as one process normalises the training set's
    (:meth:`BasisExpansion.normalize`), in a copy: the raw block may be read again."""
    return FeatureBlock(expansion.normalize(block.design.copy()), block.codes)


def _feature_blocks(client, pieces, preparation, expansion, classes, n_samples: int) -> list:
    """Every piece's training features and codes (futures of :class:`FeatureBlock` kept on the
    workers), each computed once.

    The raw kernel maps first, then the normalisation learned from them by the rule one
    process learns it by (:func:`~training.estimator.normalization.normalization_rule`, its passes'
    sums added up over the workers' rows; Nystroem's reads the basis alone, fitted already),
    then each block normalised where it is.
    """
    shared = _shared(client, expansion)
    raw = feature_blocks(
        client, pieces, classes, _raw_maps, preparation=preparation, expansion=shared
    )
    rule = normalization_rule(
        expansion.normalization_,
        len(expansion.specs_),
        [spec.kind.positive_definite for spec in expansion.specs_],
    )
    if rule.passes:
        learned = _learn_on_workers(client, raw, _design, rule, n_samples)
        n_features = expansion.offset_.shape[0]
        expansion.offset_, expansion.scale_, expansion.projection_ = rule.statistics(
            learned, n_features, expansion.basis_gram_
        )
        shared = _shared(client, expansion)
    return client.map(_normalized, raw, expansion=shared, pure=False)


def _shared(client, expansion: BasisExpansion):
    """The fitted expansion on every worker, sent once (its basis and Gram matrices are
    megabytes: inside each task they would travel once a shard)."""
    return client.scatter(expansion, broadcast=True, hash=False)


def _fit(estimator, client, X, y, C_grid=None):
    started = time.perf_counter()
    cluster_workers(client)  # refuses a cluster without workers or a lost one, before any work
    pieces, spec, n_samples = _pieces(client, estimator, X, y)
    logger.info("cluster fit: %d items in %d pieces", n_samples, len(pieces))
    classes = classes_of(client, pieces)
    if len(classes) < 2:
        raise ValueError(f"a classifier needs at least two classes, got {list(classes)}")
    estimator.classes_ = classes
    estimator.n_features_in_ = spec.n_features
    preparation = DensePreparation(spec, estimator.input_transform, estimator.input_normalization)
    try:
        preparation.settle(parse_specs(estimator.similarity))
    except SpecError as error:
        raise ValueError(str(error)) from None
    learned = [str(t) for t in preparation.transforms if t.is_fitted]
    if learned:  # a transform _refuse_learned_transforms does not know by name
        raise OneProcessOnly(
            f"input_transform {', '.join(learned)} learns from every training item, in one process"
        )
    logger.info("cluster fit: input normalisation")
    preparation.use_normalizers(_normalizers(client, pieces, preparation, n_samples))
    logger.info("cluster fit: drawing the basis")
    evenly = estimator.basis_strategy == "index"
    per_class = estimator.basis_per_class * (1 if evenly else SAMPLE_PER_BASIS_ITEM)
    items, codes = _sample(client, pieces, preparation, classes, per_class, evenly)
    expansion = estimator.basis_expansion(preparation)
    try:
        expansion.fit(items, codes)
    except SpecError as error:
        raise ValueError(str(error)) from None
    logger.info("cluster fit: features on %d basis items", len(items))
    blocks = _feature_blocks(client, pieces, preparation, expansion, classes, n_samples)
    timings = {"expand_seconds": time.perf_counter() - started}
    started = time.perf_counter()
    n_features = expansion.offset_.shape[0]
    start = None
    if C_grid is not None:
        logger.info("cluster fit: C along %s", sorted(C_grid))
        estimator.C_path_, (best_C, start) = fit_along_C(
            client, blocks, n_features, len(classes), C_grid, max_iter=estimator.max_iter,
            held_out=HELD_OUT_SHARE, seed=estimator.random_state or 0,
        )  # fmt: skip
        estimator.set_params(C=best_C)  # the C it is fitted with below
    logger.info("cluster fit: solving at C=%g", estimator.C)
    coef, intercept, estimator.n_iter_, estimator.train_accuracy_ = fit_one_vs_rest_distributed(
        client,
        blocks,
        n_features,
        len(classes),
        C=estimator.C,
        max_iter=estimator.max_iter,
        start=start,
    )
    del blocks
    logger.info("cluster fit: model")
    timings["svm_seconds"] = time.perf_counter() - started
    timings["train_seconds"] = timings["expand_seconds"] + timings["svm_seconds"]
    class_names = tuple(str(c) for c in classes)
    estimator.set_fitted(preparation, expansion, class_names, coef, intercept, n_samples, timings)
    return estimator
