"""Held-out evaluation of a trained model beside the baselines the paper compares against.

Baselines see the same inputs as the model (after its transform, normalised the same way):
LinearSVC (C = 1), a kernel SVM with the RBF kernel (scikit-learn's SVC, one-vs-one, gamma = 1
and C = 1), and, for the report, Nystroem + LinearSVC with the same RBF kernel.

On text the baselines read the model's vocabulary: tf-idf + LinearSVC, multinomial naive Bayes on
the counts and SVC(RBF) on tf-idf; and tf-idf + LinearSVC with scikit-learn's default vocabulary
(every word, stop words included), the usual reference figure.

On request (``evaluate --tuned-svc``), the baseline a user would tune: :func:`tuned_svc`, a
``Pipeline`` of an optional ``StandardScaler`` and ``SVC(RBF)`` on the raw training split, the
scaling, C and gamma chosen by 5-fold ``GridSearchCV`` (:data:`SVC_GRID`, or
:data:`SMALL_SVC_GRID` for large sets); on text, scikit-learn's default ``TfidfVectorizer`` and
the same grid without the scaling. Its training time is the whole grid search.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.feature_extraction.text import TfidfTransformer, TfidfVectorizer
from sklearn.kernel_approximation import Nystroem
from sklearn.metrics import classification_report
from sklearn.model_selection import GridSearchCV
from sklearn.naive_bayes import MultinomialNB
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC, LinearSVC

from service.model import Predictor
from service.model.inputs.words import Vocabulary
from service.model.threads import limit_threads
from training.data.datasets import Dataset
from training.estimator.preprocessing import InputNormalizer

# The tuned SVC's grid (`evaluate --tuned-svc`, benchmarks/bench_defaults.py): the scaling, C and
# gamma a user would search, 48 settings.
SVC_GRID = {
    "scale": ["passthrough", StandardScaler()],
    "svc__C": [0.1, 1.0, 10.0, 100.0],
    "svc__gamma": ["scale", 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
}
# For large sets on a small machine (`--tuned-svc small`): 12 settings.
SMALL_SVC_GRID = {
    "scale": ["passthrough", StandardScaler()],
    "svc__C": [1.0, 10.0],
    "svc__gamma": ["scale", 1e-2, 1e-1],
}
SVC_GRIDS = {"full": SVC_GRID, "small": SMALL_SVC_GRID}


@dataclass
class MethodResult:
    """One row of the comparison; ``note`` says what a tuned method chose."""

    method: str
    accuracy: float
    train_seconds: float
    predict_us_per_sample: float
    n_parameters: int
    per_class_recall: dict[str, float]
    note: str = ""


@dataclass
class Evaluation:
    """A model's held-out numbers beside the baselines'."""

    model: str
    dataset: str
    n_train: int
    n_test: int
    results: list[MethodResult]
    per_class_report: str

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """The comparison as an aligned text table."""
        header = (
            f"{'method':<34} {'accuracy':>9} {'train s':>9} {'predict µs/sample':>18} {'params':>9}"
        )
        lines = [header, "-" * len(header)]
        for r in self.results:
            lines.append(
                f"{r.method:<34} {r.accuracy:>8.2%} {r.train_seconds:>9.2f} "
                f"{r.predict_us_per_sample:>18.1f} {r.n_parameters:>9,}"
                + (f"  {r.note}" if r.note else "")
            )
        return "\n".join(lines)

    def per_class_table(self) -> str:
        """Recall (accuracy within the class) of every method, class by class."""
        width = max(12, *(len(r.method) for r in self.results))
        names = [r.method for r in self.results]
        lines = ["class".ljust(10) + "".join(f" {n:>{width}}" for n in names)]
        for label in self.results[0].per_class_recall:
            cells = "".join(f" {r.per_class_recall[label]:>{width}.1%}" for r in self.results)
            lines.append(f"{label:<10}{cells}")
        return "\n".join(lines)


def _per_class_recall(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {
        str(label): float((y_pred[y_true == label] == label).mean()) for label in np.unique(y_true)
    }


def median_seconds(run: Callable[[], object], repeats: int, warm_up: bool = True) -> float:
    """Median wall time of ``run()`` over ``repeats`` calls, after one untimed warm-up call
    unless the caller has run it already (``warm_up=False``)."""
    if warm_up:
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def prediction_batch(X, size: int) -> np.ndarray:
    """``size`` items of ``X`` repeated in turn (dense rows, or a 1-d array of documents): the
    batch prediction timings use."""
    if np.ndim(X) == 1:
        return np.resize(X, size)
    return np.resize(X, (size, *np.shape(X)[1:]))


def seconds_per_item(predict: Callable[[], object], batch_size: int, repeats: int) -> float:
    """Median seconds an item of ``predict()`` on a batch of ``batch_size``, on one thread (numba
    and BLAS): libsvm predicts on one, and on a shared machine a parallel region waits for its
    slowest thread, which makes the numbers noise."""
    with limit_threads(numba_threads=1, blas_threads=1):
        return median_seconds(predict, repeats) / batch_size


def baseline_estimators(nystroem_components: tuple[int, ...] = ()) -> dict[str, BaseEstimator]:
    """The reference methods, by display name.

    Parameters
    ----------
    nystroem_components : tuple of int
        Also Nystroem (RBF, gamma = 1) + LinearSVC with this many components, one method each.
    """
    methods: dict[str, BaseEstimator] = {
        "LinearSVC": LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0),
        "SVC(RBF, gamma=1)": SVC(kernel="rbf", gamma=1.0, C=1.0),
    }
    for n in nystroem_components:
        methods[f"Nystroem(RBF, {n}) + LinearSVC"] = make_pipeline(
            Nystroem(kernel="rbf", gamma=1.0, n_components=n, random_state=0),
            LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0),
        )
    return methods


def n_parameters(estimator: BaseEstimator | str) -> int:
    """Numbers a fitted baseline keeps to predict (support vectors and their coefficients, or
    landmarks and weights; a pipeline's steps added up, a scaler's means and scales)."""
    if isinstance(estimator, str):  # a pipeline's "passthrough"
        return 0
    if isinstance(estimator, SVC):
        return int(estimator.support_vectors_.size + estimator.dual_coef_.size)
    if isinstance(estimator, LinearSVC):
        return int(estimator.coef_.size + estimator.intercept_.size)
    if isinstance(estimator, MultinomialNB):
        return int(estimator.feature_log_prob_.size + estimator.class_log_prior_.size)
    if isinstance(estimator, StandardScaler):
        return int(estimator.mean_.size + estimator.scale_.size)
    if isinstance(estimator, TfidfTransformer):
        return int(estimator.idf_.size)
    if isinstance(estimator, TfidfVectorizer):  # its words and their idf
        return 2 * len(estimator.vocabulary_)
    if isinstance(estimator, Nystroem):
        return int(estimator.components_.size)
    return sum(n_parameters(step) for _, step in estimator.steps)


def evaluate_baselines(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    y_test: np.ndarray,
    repeats: int = 5,
    nystroem_components: tuple[int, ...] = (),
    suffix: str = "",
) -> list[MethodResult]:
    """Train and time every baseline on normalised copies of the given inputs.

    Parameters
    ----------
    X_train, X_test : ndarray of shape (n, d)
        Inputs as the model sees them before its own normalisation (i.e. transformed).
    y_train, y_test : ndarray of shape (n,)
    repeats : int
    nystroem_components : tuple of int
    suffix : str
        Appended to every method's name, e.g. " on pixels".

    Returns
    -------
    list of MethodResult
    """
    normalizer = InputNormalizer().fit(X_train)
    X_train_hat = normalizer.transform(X_train)
    results = []
    for method, estimator in baseline_estimators(nystroem_components).items():
        started = time.perf_counter()
        estimator.fit(X_train_hat, y_train)
        fit_seconds = time.perf_counter() - started
        predict = lambda est=estimator: est.predict(normalizer.transform(X_test))  # noqa: E731
        predicted = predict()
        results.append(
            MethodResult(
                method=method + suffix,
                accuracy=float((predicted == y_test).mean()),
                train_seconds=fit_seconds,
                predict_us_per_sample=1e6 * median_seconds(predict, repeats) / len(y_test),
                n_parameters=n_parameters(estimator),
                per_class_recall=_per_class_recall(y_test, predicted),
            )
        )
    return results


def evaluate_text_baselines(
    texts_train: np.ndarray,
    y_train: np.ndarray,
    texts_test: np.ndarray,
    y_test: np.ndarray,
    vocabulary: Vocabulary,
    repeats: int = 5,
) -> list[MethodResult]:
    """Train and time the text baselines; prediction times include reading the texts.

    Parameters
    ----------
    texts_train, texts_test : ndarray of str
    y_train, y_test : ndarray of shape (n,)
    vocabulary : Vocabulary
        The model's: the baselines count the same words.
    repeats : int

    Returns
    -------
    list of MethodResult
    """
    tfidf_svm = make_pipeline(
        TfidfTransformer(), LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0)
    )
    on_counts: dict[str, BaseEstimator] = {
        "tf-idf + LinearSVC": tfidf_svm,
        "multinomial naive Bayes": MultinomialNB(),
        "SVC(RBF, gamma=1) on tf-idf": make_pipeline(
            TfidfTransformer(), SVC(kernel="rbf", gamma=1.0, C=1.0)
        ),
    }
    counts_train = vocabulary.encode(texts_train)
    results = []
    for method, estimator in on_counts.items():
        started = time.perf_counter()
        estimator.fit(counts_train, y_train)
        results.append(
            _timed_result(
                method,
                estimator,
                time.perf_counter() - started,
                lambda est=estimator: est.predict(vocabulary.encode(texts_test)),
                y_test,
                repeats,
            )
        )
    everything = make_pipeline(
        TfidfVectorizer(), LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0)
    )
    started = time.perf_counter()
    everything.fit(texts_train, y_train)
    results.append(
        _timed_result(
            "tf-idf + LinearSVC, every word",
            everything,
            time.perf_counter() - started,
            lambda: everything.predict(texts_test),
            y_test,
            repeats,
        )
    )
    return results


def _timed_result(
    method, estimator, fit_seconds, predict, y_test, repeats, note: str = ""
) -> MethodResult:
    predicted = predict()
    return MethodResult(
        method=method,
        accuracy=float((predicted == y_test).mean()),
        train_seconds=fit_seconds,
        predict_us_per_sample=1e6 * median_seconds(predict, repeats) / len(y_test),
        n_parameters=n_parameters(estimator),
        per_class_recall=_per_class_recall(y_test, predicted),
        note=note,
    )


def tuned_svc(documents: bool, grid: str = "full", n_jobs: int | None = None) -> GridSearchCV:
    """SVC(RBF) as a user would tune it: 5-fold ``GridSearchCV`` over the scaling (none or
    ``StandardScaler``), C and gamma of :data:`SVC_GRIDS` [``grid``]; documents read through
    scikit-learn's default ``TfidfVectorizer`` and are not scaled.

    Parameters
    ----------
    documents : bool
        The inputs are raw texts.
    grid : {"full", "small"}
    n_jobs : int or None
        GridSearchCV's processes.

    Returns
    -------
    GridSearchCV
        Unfitted; ``fit`` takes the raw training split.
    """
    settings = dict(SVC_GRIDS[grid])
    if documents:
        del settings["scale"]
        steps = [("tfidf", TfidfVectorizer()), ("scale", "passthrough"), ("svc", SVC())]
    else:
        steps = [("scale", "passthrough"), ("svc", SVC(kernel="rbf"))]
    return GridSearchCV(Pipeline(steps), settings, cv=5, n_jobs=n_jobs)


def describe_tuned_svc(search: GridSearchCV) -> str:
    """What the grid search chose, e.g. ``scaled, C 10, gamma scale, 412 SVs``."""
    best = search.best_params_
    scaled = best.get("scale", "passthrough") != "passthrough"
    svc = search.best_estimator_[-1]
    return (
        f"{'scaled' if scaled else 'raw'}, C {best['svc__C']:g}, gamma {best['svc__gamma']}, "
        f"{svc.support_vectors_.shape[0]} SVs"
    )


def evaluate_tuned_svc(
    dataset: Dataset, grid: str = "full", n_jobs: int | None = None, repeats: int = 5
) -> MethodResult:
    """Train :func:`tuned_svc` on the raw training split of ``dataset`` and score it on the
    test split; its training time is the whole grid search, its prediction time includes the
    scaling (or the tf-idf of the texts).

    Returns
    -------
    MethodResult
        ``note`` names the chosen scaling, C, gamma and the support vectors.
    """
    search = tuned_svc(dataset.input_spec.is_documents, grid, n_jobs)
    started = time.perf_counter()
    search.fit(dataset.X_train, dataset.y_train)
    seconds = time.perf_counter() - started
    model = search.best_estimator_
    return _timed_result(
        f"SVC(RBF) tuned ({grid} grid)",
        model,
        seconds,
        lambda: model.predict(dataset.X_test),
        dataset.y_test,
        repeats,
        note=describe_tuned_svc(search),
    )


def evaluate(
    predictor: Predictor,
    dataset: Dataset,
    repeats: int = 5,
    tuned_svc_grid: str | None = None,
    n_jobs: int | None = None,
) -> Evaluation:
    """Accuracy, training and prediction cost of ``predictor`` and the baselines.

    Parameters
    ----------
    predictor : Predictor
    dataset : Dataset
        Its test split is the held-out set; baselines train on its training split, transformed
        by the model's input transform (none without a training split).
    repeats : int
        Prediction timings are the median of this many runs over the whole test set.
    tuned_svc_grid : {"full", "small"} or None
        Also :func:`evaluate_tuned_svc` on the raw training split, with this grid.
    n_jobs : int or None
        The tuned SVC's grid-search processes.

    Returns
    -------
    Evaluation
    """
    X_test, y_test = dataset.X_test, dataset.y_test
    n_test = len(y_test)
    predictor.warm_up()
    predicted = predictor.predict(X_test)
    timings = predictor.metadata.get("training", {}).get("timings", {})
    train_seconds = timings.get("train_seconds")
    if train_seconds is not None:  # the selection is part of training
        train_seconds += timings.get("selection_seconds", 0.0)
    results = [
        MethodResult(
            method=f"BE-SVM {' + '.join(predictor.similarity_names)}, B={predictor.n_basis}",
            accuracy=float((predicted == y_test).mean()),
            train_seconds=float("nan") if train_seconds is None else float(train_seconds),
            predict_us_per_sample=1e6
            * median_seconds(lambda: predictor.decision_function(X_test), repeats)
            / n_test,
            n_parameters=predictor_parameters(predictor),
            per_class_recall=_per_class_recall(y_test, predicted),
        )
    ]
    if not len(dataset.y_train):
        pass  # a whole data set scored: nothing to train baselines on
    elif predictor.vocabulary is not None:
        results += evaluate_text_baselines(
            dataset.X_train, dataset.y_train, X_test, y_test, predictor.vocabulary, repeats
        )
    else:
        transform, spec = predictor.transform, dataset.input_spec
        results += evaluate_baselines(
            transform.apply(dataset.X_train, spec),
            dataset.y_train,
            transform.apply(X_test, spec),
            y_test,
            repeats=repeats,
            suffix=" on inputs" if transform.is_identity else f" on {transform}",
        )
    if tuned_svc_grid is not None and len(dataset.y_train):
        results.append(evaluate_tuned_svc(dataset, tuned_svc_grid, n_jobs, repeats))
    report = classification_report(y_test, predicted, digits=3, zero_division=0)
    return Evaluation(
        model=predictor.name,
        dataset=dataset.name,
        n_train=len(dataset.y_train),
        n_test=n_test,
        results=results,
        per_class_report=report,
    )


def predictor_parameters(predictor: Predictor) -> int:
    """Numbers a BE-SVM keeps to predict: its basis (non-zeros for documents), weights and
    normalisation."""
    arrays = [predictor.coef, predictor.intercept]
    if predictor.feature_projection is not None:
        arrays.append(predictor.feature_projection)
    return predictor.inputs.n_basis_values + int(sum(a.size for a in arrays))
