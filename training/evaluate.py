"""Held-out evaluation of a trained model beside the baselines the paper compares against.

Baselines see the same normalised inputs as the model: LinearSVC (C = 1) and a kernel SVM with
the RBF kernel (scikit-learn's SVC, one-vs-one, gamma = 1 and C = 1 on normalised inputs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from sklearn.metrics import classification_report
from sklearn.svm import SVC, LinearSVC

from service.model import InputNormalizer, Predictor
from training.datasets import Dataset


@dataclass
class MethodResult:
    """One row of the comparison."""

    method: str
    accuracy: float
    train_seconds: float
    predict_us_per_sample: float
    n_parameters: int
    per_class_recall: dict[str, float]


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


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``run()`` over ``repeats`` calls, after one untimed warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def evaluate(predictor: Predictor, dataset: Dataset, repeats: int = 5) -> Evaluation:
    """Accuracy, training and prediction cost of ``predictor`` and the baselines.

    Parameters
    ----------
    predictor : Predictor
    dataset : Dataset
        Its test split is the held-out set; baselines train on its training split.
    repeats : int
        Prediction timings are the median of this many runs over the whole test set.

    Returns
    -------
    Evaluation
    """
    X_test, y_test = dataset.X_test, dataset.y_test
    n_test = len(y_test)
    predictor.warm_up()
    predicted = predictor.predict(X_test)
    train_seconds = predictor.metadata.get("training", {}).get("timings", {}).get("train_seconds")
    results = [
        MethodResult(
            method=f"BE-SVM {' + '.join(predictor.similarity_names)}, B={predictor.n_basis}",
            accuracy=float((predicted == y_test).mean()),
            train_seconds=float("nan") if train_seconds is None else float(train_seconds),
            predict_us_per_sample=1e6
            * median_seconds(lambda: predictor.decision_function(X_test), repeats)
            / n_test,
            n_parameters=int(predictor.coef.size + predictor.basis.size),
            per_class_recall=_per_class_recall(y_test, predicted),
        )
    ]
    normalizer = InputNormalizer().fit(dataset.X_train)
    X_train_hat = normalizer.transform(dataset.X_train)
    baselines = {
        "LinearSVC on inputs": LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0),
        "SVC(RBF, gamma=1) on inputs": SVC(kernel="rbf", gamma=1.0, C=1.0),
    }
    for method, estimator in baselines.items():
        started = time.perf_counter()
        estimator.fit(X_train_hat, dataset.y_train)
        fit_seconds = time.perf_counter() - started
        predict = lambda est=estimator: est.predict(normalizer.transform(X_test))  # noqa: E731
        baseline_predicted = predict()
        if isinstance(estimator, SVC):
            n_parameters = int(estimator.support_vectors_.size + estimator.dual_coef_.size)
        else:
            n_parameters = int(estimator.coef_.size + estimator.intercept_.size)
        results.append(
            MethodResult(
                method=method,
                accuracy=float((baseline_predicted == y_test).mean()),
                train_seconds=fit_seconds,
                predict_us_per_sample=1e6 * median_seconds(predict, repeats) / n_test,
                n_parameters=n_parameters,
                per_class_recall=_per_class_recall(y_test, baseline_predicted),
            )
        )
    report = classification_report(y_test, predicted, digits=3, zero_division=0)
    return Evaluation(
        model=predictor.name,
        dataset=dataset.name,
        n_train=len(dataset.y_train),
        n_test=n_test,
        results=results,
        per_class_report=report,
    )
