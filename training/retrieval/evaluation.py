r"""Retrieval evaluation of sparse classifiers: mAP against sparsity (US-SVM paper, section 4).

Every class's classifier ranks a catalogue; its average precision (AP) is the area under the
precision-recall curve of that ranking, and the mAP is the mean AP over the classes. Sparsity is
the average number of non-zero coefficients per class: :math:`\lVert z_k \rVert_0` over the
dictionary for the US-SVM variants, :math:`\lVert w_k \rVert_0` over the features for the
l2-SVM and l1-SVM baselines (scikit-learn's ``LinearSVC``). Each model is trained once and pruned
to every target sparsity by keeping the largest magnitudes of each class's coefficients (the
intercepts are kept), the paper's protocol.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import LinearSVC

from service.model import Predictor
from service.model.search import feature_space_for, search_features
from training.data.datasets import Dataset
from training.estimator.solver import feature_weights, training_design
from training.retrieval.dictionary import UnionOfSubspacesSVM, prune_codes

US_SVM_VARIANTS: dict[str, dict[str, Any]] = {
    "US-SVM": {"l1_ratio": 1.0, "nonnegative": False},
    "US-SVM-E": {"l1_ratio": 0.5, "nonnegative": False},
    "US-SVM-N": {"l1_ratio": 1.0, "nonnegative": True},
    "US-SVM-NE": {"l1_ratio": 0.5, "nonnegative": True},
}
"""The four variants of the paper (section 3.3) as :class:`UnionOfSubspacesSVM` parameters; the
other parameters keep the estimator's defaults."""

BASELINES = ("l2-SVM", "l1-SVM")

DEFAULT_SPARSITIES = (1, 2, 3, 5, 10, 20)


def average_precisions(scores: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """Average precision of every column's ranking, ties handled as scikit-learn does.

    A group of tied scores is one threshold: the precision-recall curve steps once over the
    group (``sklearn.metrics.average_precision_score``:
    :math:`\\sum_n (R_n - R_{n-1}) P_n` over the distinct scores, highest first).

    Parameters
    ----------
    scores : ndarray of shape (N, K)
    relevant : ndarray of shape (N, K), bool
        Whether item n is relevant to (a positive of) column k.

    Returns
    -------
    ndarray of shape (K,)
        NaN for a column without relevant items.
    """
    scores = np.asarray(scores, dtype=np.float64)
    relevant = np.asarray(relevant, dtype=bool)
    if scores.ndim != 2 or scores.shape != relevant.shape:
        raise ValueError(
            f"scores and relevant must be 2-d of the same shape, got {scores.shape} and "
            f"{relevant.shape}"
        )
    result = np.full(scores.shape[1], np.nan)
    for k in range(scores.shape[1]):
        n_relevant = int(relevant[:, k].sum())
        if n_relevant == 0:
            continue
        order = np.argsort(-scores[:, k], kind="stable")
        ranked = scores[order, k]
        hits = np.cumsum(relevant[order, k])
        # The last position of every group of equal scores: one threshold each.
        last = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])
        true_positives = hits[last]
        precision = true_positives / (last + 1.0)
        recall_steps = np.diff(true_positives, prepend=0) / n_relevant
        result[k] = float(np.sum(recall_steps * precision))
    return result


def mean_average_precision(scores: np.ndarray, y: np.ndarray, classes: np.ndarray) -> float:
    """The mean over classes of the average precision of ranking the items by each class's score.

    Equal to the mean of ``sklearn.metrics.average_precision_score(y == classes[k],
    scores[:, k])`` over the classes that have at least one item in ``y``; classes without any are
    left out of the mean (their AP is undefined).

    Parameters
    ----------
    scores : ndarray of shape (N, K)
        Column k holds every item's score for ``classes[k]``.
    y : ndarray of shape (N,)
        The items' labels.
    classes : ndarray of shape (K,)

    Returns
    -------
    float

    Raises
    ------
    ValueError
        On mismatched shapes, or when no class has an item in ``y``.
    """
    scores = np.asarray(scores)
    y, classes = np.asarray(y), np.asarray(classes)
    if y.ndim != 1 or classes.ndim != 1 or scores.shape != (len(y), len(classes)):
        raise ValueError(
            f"scores must have shape (len(y), len(classes)) = ({len(y)}, {len(classes)}), "
            f"got {scores.shape}"
        )
    ap = average_precisions(scores, y[:, None] == classes[None, :])
    if np.isnan(ap).all():
        raise ValueError("no class has an item in y: the mAP is undefined")
    return float(np.nanmean(ap))


def prune_weights(coef: np.ndarray, n_nonzero: int) -> np.ndarray:
    """Keep the ``n_nonzero`` largest magnitudes of every row (class), zero the rest.

    Parameters
    ----------
    coef : ndarray of shape (K, d)
        One weight vector a row, as ``LinearSVC.coef_``.
    n_nonzero : int

    Returns
    -------
    ndarray of shape (K, d)
    """
    return prune_codes(np.asarray(coef).T, n_nonzero).T


def _mean_nonzeros(coefficients: np.ndarray, axis: int) -> float:
    return float(np.count_nonzero(coefficients, axis=axis).mean())


def _rows_of_linear_model(method, coef, intercept, classes, F_catalogue, y_catalogue, sparsities):
    rows = []
    for sparsity in (*sparsities, None):
        weights = coef if sparsity is None else prune_weights(coef, sparsity)
        scores = F_catalogue @ weights.T + intercept
        rows.append(
            {
                "method": method,
                "sparsity": sparsity,
                "mean_nonzeros": _mean_nonzeros(weights, axis=1),
                "map": mean_average_precision(scores, y_catalogue, classes),
            }
        )
    return rows


def _rows_of_us_svm(method, model, F_catalogue, y_catalogue, sparsities):
    projected = F_catalogue @ model.dictionary_  # D^T x once for every sparsity
    rows = []
    for sparsity in (*sparsities, None):
        codes = model.codes_ if sparsity is None else prune_codes(model.codes_, sparsity)
        scores = projected @ codes + model.intercept_
        rows.append(
            {
                "method": method,
                "sparsity": sparsity,
                "mean_nonzeros": _mean_nonzeros(codes, axis=0),
                "map": mean_average_precision(scores, y_catalogue, model.classes_),
            }
        )
    return rows


def fit_baseline(method: str, F_train: np.ndarray, y_train: np.ndarray):
    """Train a baseline linear SVM: scikit-learn's ``LinearSVC`` with its defaults (``"l2-SVM"``)
    or with ``penalty="l1", dual=False`` (``"l1-SVM"``).

    Features that mostly equal their column's median (BE-SVM features of documents) are shifted
    by it and trained on as a sparse matrix, as :func:`training.estimator.solver.training_design`
    does for the BE-SVM: liblinear then runs several times faster; the shift is folded into the
    intercepts.

    Parameters
    ----------
    method : {"l2-SVM", "l1-SVM"}
    F_train : ndarray of shape (n_train, d)
    y_train : ndarray of shape (n_train,)

    Returns
    -------
    coef : ndarray of shape (K, d)
        One row per class, also for two classes.
    intercept : ndarray of shape (K,)
    classes : ndarray of shape (K,)
    """
    if method == "l2-SVM":
        svm = LinearSVC(random_state=0)
    elif method == "l1-SVM":
        svm = LinearSVC(penalty="l1", dual=False, random_state=0)
    else:
        raise ValueError(f"unknown baseline {method!r}: one of {', '.join(BASELINES)}")
    design, shift, columns = training_design(np.array(F_train, dtype=np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        svm.fit(design, y_train)
    coef = feature_weights(svm.coef_, columns, len(shift))
    intercept = svm.intercept_ - coef @ shift
    if len(svm.classes_) == 2:  # one row for two classes: positive means classes_[1]
        coef, intercept = np.vstack([-coef, coef]), np.concatenate([-intercept, intercept])
    return coef, intercept, svm.classes_


def map_against_sparsity(
    F_train: np.ndarray,
    y_train: np.ndarray,
    F_catalogue: np.ndarray,
    y_catalogue: np.ndarray,
    sparsities: Iterable[int] = DEFAULT_SPARSITIES,
    variants: Mapping[str, Mapping[str, Any]] = US_SVM_VARIANTS,
    n_atoms: int | None = None,
    random_state: int | None = 0,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """mAP of the US-SVM variants and the pruned l2-SVM and l1-SVM against sparsity.

    Each method is trained once on ``(F_train, y_train)``; its classifiers are pruned to every
    target sparsity (the largest magnitudes of each class's code or weight vector kept, the
    intercepts kept) and rank the catalogue for every class.

    Parameters
    ----------
    F_train : ndarray of shape (n_train, d)
        Training features (for example normalised inputs or BE-SVM features).
    y_train : ndarray of shape (n_train,)
    F_catalogue : ndarray of shape (N, d)
        The items searched, in the same feature space.
    y_catalogue : ndarray of shape (N,)
        Their labels: an item is relevant to the classes equal to its label.
    sparsities : iterable of int, default=(1, 2, 3, 5, 10, 20)
        Target numbers of non-zeros per class.
    variants : mapping of str to mapping, default=US_SVM_VARIANTS
        Name to :class:`UnionOfSubspacesSVM` parameters of every US-SVM variant evaluated.
    n_atoms : int, optional
        The dictionary size of every variant; None keeps the estimator's default (or the
        variant's own ``n_atoms``).
    random_state : int or None, default=0
        Passed to every :class:`UnionOfSubspacesSVM`.
    progress : bool, default=False
        Show a tqdm bar over the models trained.

    Returns
    -------
    list of dict
        One row per method and sparsity, the US-SVM variants first (in ``variants`` order), then
        ``"l2-SVM"`` and ``"l1-SVM"``: ``{"method": str, "sparsity": int or None,
        "mean_nonzeros": float, "map": float}``. ``sparsity`` None is the unpruned model;
        ``mean_nonzeros`` is the actual average number of non-zero coefficients per class after
        pruning (at most ``sparsity``: fewer when a code has fewer non-zeros).
    """
    sparsities = tuple(int(s) for s in sparsities)
    if any(s < 0 for s in sparsities):
        raise ValueError(f"sparsities must be >= 0, got {sparsities}")
    F_train = np.asarray(F_train, dtype=np.float64)
    F_catalogue = np.asarray(F_catalogue, dtype=np.float64)
    y_train, y_catalogue = np.asarray(y_train), np.asarray(y_catalogue)
    methods = [*variants, *BASELINES]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(methods), desc="mAP against sparsity", unit="model")
    rows: list[dict[str, Any]] = []
    try:
        for method in methods:
            if bar is not None:
                bar.set_postfix_str(method)
            if method in variants:
                params = dict(variants[method])
                if n_atoms is not None:
                    params["n_atoms"] = n_atoms
                params.setdefault("random_state", random_state)
                model = UnionOfSubspacesSVM(**params).fit(F_train, y_train)
                rows += _rows_of_us_svm(method, model, F_catalogue, y_catalogue, sparsities)
            else:
                coef, intercept, classes = fit_baseline(method, F_train, y_train)
                rows += _rows_of_linear_model(
                    method, coef, intercept, classes, F_catalogue, y_catalogue, sparsities
                )
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return rows


def plot_map_against_sparsity(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Draw mAP against the mean number of non-zeros per class, one line per method, as a PNG.

    Parameters
    ----------
    rows : list of dict
        As :func:`map_against_sparsity` returns them. A method's unpruned row is drawn as the
        last point of its line (at its actual mean number of non-zeros), hollow.
    path : str or Path
        The PNG file written.
    title : str
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(row["method"] for row in rows))
    figure, axes = plt.subplots(figsize=(8, 5))
    try:
        for index, method in enumerate(methods):
            own = [row for row in rows if row["method"] == method]
            pruned = sorted(
                (row for row in own if row["sparsity"] is not None),
                key=lambda row: row["mean_nonzeros"],
            )
            style = "--" if method in BASELINES else "-"
            color = f"C{index}"
            x = [max(row["mean_nonzeros"], 0.5) for row in pruned]
            (line,) = axes.plot(
                x, [100 * row["map"] for row in pruned], style, marker="o", color=color,
                label=method,
            )  # fmt: skip
            for row in own:
                if row["sparsity"] is None:
                    axes.plot(
                        [max(row["mean_nonzeros"], 0.5)], [100 * row["map"]], marker="o",
                        markerfacecolor="none", color=line.get_color(), linestyle="none",
                    )  # fmt: skip
        axes.set_xscale("log")
        axes.set_xlabel("mean non-zero coefficients per class (log scale; hollow: unpruned)")
        axes.set_ylabel("mAP (%)")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        figure.savefig(Path(path), dpi=110, bbox_inches="tight")
    finally:
        plt.close(figure)


def evaluate_search(
    predictor: Predictor,
    dataset: Dataset,
    feature_space: str = "auto",
    sparsities=DEFAULT_SPARSITIES,
    n_atoms: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """mAP against sparsity of the US-SVM variants and the pruned l2-SVM and l1-SVM, trained on
    the model's features of the training split, searching the test split as the catalogue.

    Returns
    -------
    dict
        ``rows`` (see :func:`training.retrieval.evaluation.map_against_sparsity`) and the context:
        data set, feature space, sizes, seconds.
    """
    space = feature_space_for(predictor, feature_space)
    F_train = search_features(predictor, space, dataset.X_train)
    F_catalogue = search_features(predictor, space, dataset.X_test)
    started = time.perf_counter()
    rows = map_against_sparsity(
        F_train, dataset.y_train, F_catalogue, dataset.y_test, sparsities=sparsities,
        n_atoms=n_atoms, progress=progress,
    )  # fmt: skip
    return {
        "model": predictor.name,
        "dataset": dataset.name,
        "feature_space": space,
        "n_features": int(F_train.shape[1]),
        "n_train": len(dataset.y_train),
        "n_catalogue": len(dataset.y_test),
        "n_classes": len(np.unique(dataset.y_train)),
        "n_atoms": n_atoms or UnionOfSubspacesSVM().n_atoms,
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }


def write_search_report(evaluation: dict[str, Any], out: str | Path, command: str) -> Path:
    """README.md (a table and the plot), map_sparsity.png and results.json in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = evaluation["rows"]
    title = (
        f"{evaluation['dataset']}: mAP against non-zeros per class "
        f"({evaluation['feature_space']} features)"
    )
    plot_map_against_sparsity(rows, out / "map_sparsity.png", title)
    (out / "results.json").write_text(json.dumps(evaluation, indent=2) + "\n")
    sparsities = sorted({r["sparsity"] for r in rows if r["sparsity"] is not None})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["sparsity"]): r for r in rows}
    header = "| method | " + " | ".join(f"{s} nnz" for s in sparsities) + " | unpruned |"
    lines = [header, "|---" * (len(sparsities) + 2) + "|"]
    for method in methods:
        unpruned = cell[(method, None)]
        values = [f"{100 * cell[(method, s)]['map']:.2f}" for s in sparsities]
        values.append(f"{100 * unpruned['map']:.2f} ({unpruned['mean_nonzeros']:.0f} nnz)")
        lines.append(f"| {method} | " + " | ".join(values) + " |")
    e = evaluation
    text = f"""# Search: mAP against sparsity on {e["dataset"]}

Generated by `{command}`.

Every class's classifier ranks the catalogue ({e["n_catalogue"]:,} held-out items, the test
split); AP is the area under each ranking's precision-recall curve, mAP its mean over the
{e["n_classes"]} classes. Sparsity is the number of non-zeros per class kept after training:
code entries over the {e["n_atoms"]}-atom dictionary for the US-SVM variants (a search reads
that many rows of X' = D^T X), weights over the {e["n_features"]} features ({e["feature_space"]})
for the l2-SVM and l1-SVM (scikit-learn LinearSVC) pruned the same way: the largest magnitudes
kept, intercepts kept. Trained on {e["n_train"]:,} items in {e["seconds"]:.0f} s.

mAP (%) at each number of non-zeros per class:

{chr(10).join(lines)}

![mAP against sparsity](map_sparsity.png)
"""
    path = out / "README.md"
    path.write_text(text)
    return path
