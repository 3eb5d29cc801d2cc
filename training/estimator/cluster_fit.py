"""Fitting a :class:`~training.estimator.estimator.BasisExpandingSVC` on a Dask cluster.

The estimator's ``fit`` comes here when it has a ``cluster``, runs inside ``with
distributed.Client(...)``, or is given a :class:`~training.cluster.shards.ShardedData`. The steps
are
the one-process fit's, each where its data lives:

1. The rows live on the workers: each shard is read there (its lineage is the file, so a lost
   worker's shards are read again), or, for arrays given to ``fit``, scattered in row blocks.
2. The labels' classes, the input normalisation's mean and scale, and the feature
   normalisation's statistics (``besvm``, ``zscore``) are reductions over the shards.
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
:func:`draw_sample` draws a stratified sample of sharded data where the shards are (the model
selection searches it, :class:`training.selection.forward_selection.ForwardSelectionCV`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from service.model import SpecError
from service.model.inputs.spec import InputSpec
from service.model.similarity import parse_specs
from training.cluster.connection import client_for, in_process_client
from training.cluster.reductions import tree_sum
from training.cluster.rows import (
    PIECES_PER_THREAD,
    class_counts_by_piece,
    classes_of,
    items_at,
    row_pieces,
)
from training.cluster.shards import ShardedData, read_shard
from training.estimator.distributed_solver import (
    FeatureBlock,
    fit_along_C,
    fit_one_vs_rest_distributed,
)
from training.estimator.expansion import BasisExpansion
from training.estimator.preparation import DensePreparation, is_texts
from training.estimator.preprocessing import InputNormalizer

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


def _sources(client, estimator, X, y):
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


def _transformed_moments(source, transform, spec, mean):
    """Sums for a space's normaliser: the rows' sum (mean None), else the centred squares'."""
    rows = transform.apply(source[0], spec)
    if mean is None:
        return rows.sum(axis=0), np.array(len(rows), dtype=np.float64)
    centred = rows - mean
    return (centred * centred).sum(axis=0), np.array(len(rows), dtype=np.float64)


def _centred_norms(source, transform, spec, mean, std) -> np.ndarray:
    centred = transform.apply(source[0], spec) - mean
    if std is not None:
        centred /= std
    return np.array(np.linalg.norm(centred, axis=1).sum())


def _normalizers(client, sources, preparation, n_samples: int) -> list[InputNormalizer]:
    """Each space's InputNormalizer from reductions, as InputNormalizer.fit learns it."""
    scaling = preparation.input_normalization
    spec = preparation.spec
    normalizers = []
    for transform in preparation.transforms:
        sums = client.map(
            _transformed_moments, sources, transform=transform, spec=spec, mean=None, pure=False
        )
        mean = tree_sum(client, sums)[0] / n_samples
        std = None
        if scaling == "per-feature":
            squares = client.map(
                _transformed_moments, sources, transform=transform, spec=spec, mean=mean, pure=False
            )
            std = np.sqrt(tree_sum(client, squares)[0] / n_samples)
            std[std <= 0.0] = 1.0
        norms = client.map(
            _centred_norms, sources, transform=transform, spec=spec, mean=mean, std=std, pure=False
        )
        scale = float(tree_sum(client, norms)) / n_samples
        scale = scale if scale > 0.0 else 1.0
        normalizers.append(
            InputNormalizer.from_statistics(
                scaling, mean, std * scale if std is not None else scale
            )
        )
    return normalizers


def _sample(client, sources, preparation, classes, per_class: int, evenly: bool):
    """Each class's items that the basis is drawn from, in the order a one-process fit sees
    them: ``evenly``, the ``index`` strategy's own picks (evenly spaced over the class); else
    the class's first ``per_class`` items."""
    counts = class_counts_by_piece(client, sources, classes)
    wanted = []
    for total in counts.sum(axis=0):
        k = min(per_class, int(total))
        wanted.append((np.arange(k) * total) // k if evenly else np.arange(k))
    return items_at(client, sources, classes, counts, wanted, preparation.prepare)


def _feature_block(source, preparation, expansion, classes) -> FeatureBlock:
    """A shard's training features and codes (a worker's task, kept there)."""
    features = expansion.transform(preparation.prepare(source[0]))
    return FeatureBlock(features, np.searchsorted(classes, source[1]))


def _design_sums(block: FeatureBlock, offset, n_measures: int):
    """Sums over a block's raw features: of the features (offset None), else of their squares
    and per-measure norms after subtracting ``offset``."""
    if offset is None:
        return block.design.sum(axis=0)
    centred = block.design - offset
    blocks = centred.reshape(len(centred), n_measures, -1)
    return (centred * centred).sum(axis=0), np.linalg.norm(blocks, axis=2).sum(axis=0)


def _normalized(block: FeatureBlock, offset: np.ndarray, scale: np.ndarray) -> FeatureBlock:
    """A block's raw features normalised as :func:`service.model.features.expand` does
    (subtract, then divide, in place of a new array: the same numbers)."""
    design = block.design - offset
    design /= scale
    return FeatureBlock(design, block.codes)


def _feature_blocks(client, sources, preparation, expansion, classes, n_samples: int) -> list:
    """Every shard's training features and codes (futures of :class:`FeatureBlock` kept on the
    workers), each computed once.

    ``besvm`` and ``zscore`` normalisation take their offset and scale from reductions over the
    raw features of every shard (what expansion.normalization_statistics computes on the whole
    set in one process), then apply them to the blocks where they are.
    """
    normalized = expansion.normalization_ in ("besvm", "zscore")
    if normalized:  # offset 0 and scale 1: the raw features
        n_features = len(expansion.offset_)
        expansion.offset_, expansion.scale_ = np.zeros(n_features), np.ones(n_features)
    blocks = client.map(
        _feature_block,
        sources,
        preparation=preparation,
        expansion=_shared(client, expansion),
        classes=classes,
        pure=False,
    )
    if not normalized:
        return blocks
    n_measures = len(expansion.specs_)
    sums = client.map(_design_sums, blocks, offset=None, n_measures=n_measures, pure=False)
    mean = tree_sum(client, sums) / n_samples
    parts = client.map(_design_sums, blocks, offset=mean, n_measures=n_measures, pure=False)
    squares, norms = tree_sum(client, parts)
    if expansion.normalization_ == "zscore":
        std = np.sqrt(squares / n_samples)
        expansion.offset_, expansion.scale_ = mean, np.where(std > 0, std, 1.0)
    else:
        mean_norms = norms / n_samples
        n_basis = n_features // len(mean_norms)
        scale = np.repeat(np.where(mean_norms > 0, mean_norms, 1.0), n_basis)
        expansion.offset_, expansion.scale_ = mean, scale
    return client.map(
        _normalized, blocks, offset=expansion.offset_, scale=expansion.scale_, pure=False
    )


def _shared(client, expansion: BasisExpansion):
    """The fitted expansion on every worker, sent once (its basis and Gram matrices are
    megabytes: inside each task they would travel once a shard)."""
    return client.scatter(expansion, broadcast=True, hash=False)


def _fit(estimator, client, X, y, C_grid=None):
    started = time.perf_counter()
    sources, spec, n_samples = _sources(client, estimator, X, y)
    logger.info("cluster fit: %d items in %d pieces", n_samples, len(sources))
    classes = classes_of(client, sources)
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
    preparation.use_normalizers(_normalizers(client, sources, preparation, n_samples))
    logger.info("cluster fit: drawing the basis")
    evenly = estimator.basis_strategy == "index"
    per_class = estimator.basis_per_class * (1 if evenly else SAMPLE_PER_BASIS_ITEM)
    items, codes = _sample(client, sources, preparation, classes, per_class, evenly)
    expansion = estimator.basis_expansion(preparation)
    try:
        expansion.fit(items, codes)
    except SpecError as error:
        raise ValueError(str(error)) from None
    logger.info("cluster fit: features on %d basis items", len(items))
    blocks = _feature_blocks(client, sources, preparation, expansion, classes, n_samples)
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
