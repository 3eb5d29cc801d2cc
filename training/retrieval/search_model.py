"""The /search model of a trained model: a US-SVM dictionary and sparse class codes learned on
the model's features of its training split (:class:`~training.retrieval.dictionary.
UnionOfSubspacesSVM`, one of the paper's named :data:`VARIANTS`), the codes pruned, and measured
on the test split; written to ``<model>/search`` (:mod:`service.model.search` has the layout).
"""

from __future__ import annotations

import time

import numpy as np

from service.model import InvalidInputError, Predictor
from service.model.search import UnionOfSubspacesModel, feature_space_for, search_features
from training.data.datasets import Dataset
from training.retrieval.dictionary import UnionOfSubspacesSVM, prune_codes
from training.retrieval.evaluation import mean_average_precision

# Named variants of the paper: (l1_ratio, nonnegative); -E and -NE take r = 0.5 unless told.
VARIANTS: dict[str, tuple[float, bool]] = {
    "us-svm": (1.0, False),
    "us-svm-e": (0.5, False),
    "us-svm-n": (1.0, True),
    "us-svm-ne": (0.5, True),
}


DEFAULT_VARIANT = "us-svm"


DEFAULT_SPARSITY = 10


def estimator_for(variant: str = DEFAULT_VARIANT, **params) -> UnionOfSubspacesSVM:
    """A :class:`UnionOfSubspacesSVM` of a named variant; explicit ``params`` win.

    Parameters
    ----------
    variant : {"us-svm", "us-svm-e", "us-svm-n", "us-svm-ne"}
    **params
        Estimator parameters; None values are left at the estimator's default.
    """
    if variant not in VARIANTS:
        raise InvalidInputError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    l1_ratio, nonnegative = VARIANTS[variant]
    chosen = {"l1_ratio": l1_ratio, "nonnegative": nonnegative}
    chosen |= {k: v for k, v in params.items() if v is not None}
    return UnionOfSubspacesSVM(**chosen)


def fit_search_model(
    predictor: Predictor,
    dataset: Dataset,
    estimator: UnionOfSubspacesSVM,
    feature_space: str = "auto",
    sparsity: int = DEFAULT_SPARSITY,
) -> UnionOfSubspacesModel:
    """Learn a dictionary and class codes on the model's features of the training split, prune
    the codes, and measure them on the test split (the summary is the model's ``metadata``).

    Parameters
    ----------
    predictor : Predictor
        The model whose features the classifiers act on.
    dataset : Dataset
        Its training data (same classes).
    estimator : UnionOfSubspacesSVM
        Unfitted; its parameters are recorded.
    feature_space : {"auto", "inputs", "besvm"}
    sparsity : int
        Non-zeros kept per class code.
    """
    if sparsity < 1:
        raise InvalidInputError(f"sparsity must be at least 1, got {sparsity}")
    space = feature_space_for(predictor, feature_space)
    started = time.perf_counter()
    F_train = search_features(predictor, space, dataset.X_train)
    feature_seconds = time.perf_counter() - started
    started = time.perf_counter()
    estimator.fit(F_train, dataset.y_train)
    fit_seconds = time.perf_counter() - started
    classes = tuple(str(c) for c in estimator.classes_)
    codes = prune_codes(estimator.codes_, sparsity)
    F_test = search_features(predictor, space, dataset.X_test)
    unpruned = estimator.class_scores(F_test)
    pruned = estimator.class_scores(F_test, n_nonzero=sparsity)
    labels = np.asarray(classes)
    summary = {
        "n_atoms": int(codes.shape[0]),
        "n_features": int(F_train.shape[1]),
        "n_nonzero": int(sparsity),
        "mean_nonzeros": float((codes != 0).sum(axis=0).mean()),
        "estimator": {k: _plain(v) for k, v in estimator.get_params().items()},
        "training": {
            "n_train": len(dataset.y_train),
            "n_test": len(dataset.y_test),
            "dataset": dataset.source,
            "feature_seconds": feature_seconds,
            "fit_seconds": fit_seconds,
            "test_accuracy": float((labels[pruned.argmax(1)] == dataset.y_test).mean()),
            "test_accuracy_unpruned": float((labels[unpruned.argmax(1)] == dataset.y_test).mean()),
            "test_map": mean_average_precision(pruned, dataset.y_test, labels),
            "test_map_unpruned": mean_average_precision(unpruned, dataset.y_test, labels),
        },
    }
    model = UnionOfSubspacesModel(
        feature_space=space,
        dictionary=estimator.dictionary_,
        codes=codes,
        intercept=estimator.intercept_,
        classes=classes,
        metadata=summary,
    )
    return model


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
