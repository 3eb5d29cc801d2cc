"""Forward selection of a :class:`~training.estimator.BasisExpandingSVC`'s configuration by
cross-validation: :class:`ForwardSelectionCV`, a wrapper like scikit-learn's ``GridSearchCV``.

It clones the estimator it wraps, scores candidate settings of its parameters by stratified
k-fold cross-validation on the training set it is given, and improves one configuration step by
step, the BE-SVM paper's greedy answer (section 3.5) to "which measures, at which resolution":

1. **Input preparation.** Dense inputs: the input normalisation (``global``, the paper's: centre
   and divide by the mean norm; or ``per-feature``: z-scores first, see
   :mod:`service.model.inputs.dense`) and, for images, the transform (pixels, or HOG cells at
   one or two cell sizes), each tried with the default measure ``rbf(gamma=1)``. The best one
   fixes the transform for every later step. Documents: nothing to choose here.
2. **The first measure**: every candidate measure of the input kind in place of ``rbf(gamma=1)``.
3. **Basis size per class**: a grid (10, 25, 50, 100, 200, ...) capped by the largest class of a
   fold and by a feature budget (:data:`MAX_FEATURES` basis items times measures), so that it
   grows with the training set. Documents have a larger budget (:data:`MAX_DOCUMENT_FEATURES`)
   and the ``besvm`` normalisation. The chosen basis grows from the folds to the whole set
   (:func:`grown_basis_per_class`): always for documents, and for dense inputs when the search
   ran on a sample of a larger set (up to :data:`MAX_GROWN_FEATURES`).
4. **Added measures**: the candidate whose ``+``-combination with the measures chosen so far
   improves the cross-validated accuracy most, repeatedly, up to :data:`MAX_MEASURES`.
5. **The SVM's C**: 0.1 and 10 against 1.
6. **The basis strategy**: ``random`` and ``kmedoids`` against ``index``.

A step is taken only when its best candidate beats the current configuration by at least
``margin`` (0.25 points by default), or, for C and the basis strategy, which cost nothing when
serving, by any gain; the similarity normalisation follows the ``auto`` rule
(:func:`service.model.features.resolve_normalization`). Everything stops when the time budget is
spent: a candidate whose folds are not all scored by then is not considered. The path (each step
taken, its candidate and cross-validated accuracy) is kept in ``path_``, as plain data for the
manifest (:meth:`ForwardSelectionCV.record`).

The parameters it chooses are :data:`SEARCHED_PARAMETERS`; every other parameter of the wrapped
estimator (``max_iter``, ``min_df``, ``stop_words``, ``input_shape``, ...) is the user's, in the
folds as in the final model. Candidates and folds are scored in parallel with joblib
(``n_jobs`` processes), each process limiting its threads through
:func:`service.model.threads.limit_threads` (numba: its share of the cores; BLAS: one) so that
together they use the cores once.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone
from sklearn.model_selection import StratifiedKFold, train_test_split

# scikit-learn has no public form of its parameter constraints; its own estimators declare
# theirs with these, and the pinned version is checked by the estimator checks in the tests.
from sklearn.utils._param_validation import HasMethods, Interval
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from service.model.inputs.dense import GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION
from service.model.inputs.spec import InputSpec
from service.model.threads import available_cpus, limit_threads
from training.preparation import preparation_for

# Seconds the whole search may take by default: digits (1,000 training images) selects and fits
# in under a minute on 2 busy cores (docs/model-selection.md has the measurements).
DEFAULT_BUDGET_S = 40.0
# Accuracy (a fraction) a step must gain over the current configuration to be taken.
DEFAULT_MARGIN = 0.0025
MAX_MEASURES = 3
# Basis items times measures: caps the feature count, hence training memory and serving cost.
MAX_FEATURES = 1000
# Documents: their measures read sparse tf-idf or word-frequency vectors, cheap per basis item,
# and accuracy keeps growing with the basis far beyond 1,000 items (docs/reports/fortunes: from
# 25 to 250 quotes per class, +6 to +8 points for every measure but sensing0).
MAX_DOCUMENT_FEATURES = 6400
# The similarity normalisation for documents. The ``auto`` rule's nystroem(square) for tf-idf
# linear made the SVM 5x slower on fortunes (50 quotes per class: 85 s against 16 s) for no
# accuracy (40.1% against 40.3%); the report's fortunes results are all ``besvm``.
DOCUMENT_NORMALIZATION = "besvm"
# The search cross-validates on at most this many training items (a stratified sample).
MAX_SEARCH_ITEMS = 3000
# Dense inputs searched on a sample: the basis the folds chose grows with the split (as for
# documents) up to this many basis items times measures, and to at most MAX_GROWN_SHARE of the
# training items. The search's own cap (MAX_FEATURES) bounds what its folds cost; the final fit
# affords more, and accuracy keeps growing with the basis on large splits (synthetic, 100,000
# items: 90.55% at B = 1,000, 93.15% at 4,000), but not past a share of the items (10,000
# items: 83.75% at 1,000, 83.85% at 2,000, 80.15% at 4,000; docs/model-selection.md).
MAX_GROWN_FEATURES = 4000
MAX_GROWN_SHARE = 0.2

START_MEASURE = "rbf(gamma=1)"
START_BASIS_PER_CLASS = 25
# rbf widths relative to the normalised inputs: both normalisations make the mean norm 1, so the
# mean squared distance between two items is about 2 and gamma = 1 is scikit-learn's "scale".
RBF_GAMMAS = (0.25, 1.0, 4.0)
BASIS_SIZES = (10, 25, 50, 100, 200, 400, 800)
C_GRID = (0.1, 1.0, 10.0)
STRATEGIES = ("index", "random", "kmedoids")
# Images at least this many pixels a side are offered the bof transform (16 x 16 patches every 8
# pixels: a 3 x 3 grid of patches at least).
BOF_MIN_SIDE = 32
SENSING_WORDS = (50, 150, 500)

# The estimator's parameters the selection chooses: with ``similarity="auto"`` the command line
# refuses options that would set them, since the search would override them.
SEARCHED_PARAMETERS = (
    "similarity",
    "input_transform",
    "input_normalization",
    "basis_per_class",
    "basis_strategy",
    "normalization",
    "C",
)


@dataclass(frozen=True)
class Candidate:
    """One setting to cross-validate: the searched parameters, with what it changes, in words."""

    change: str
    params: dict[str, Any]


# -- the candidates ------------------------------------------------------------------------


def measure_candidates(input_spec: InputSpec, transform: str | None) -> list[str]:
    """The measures forward selection may use on inputs of ``input_spec`` read through
    ``transform``: linear and rbf over :data:`RBF_GAMMAS` for vectors; those, ``rigid(1)`` and
    ``deformable(1, 1)`` on image grids (pixels or HOG cells); ``sensing1`` over
    :data:`SENSING_WORDS` and tf-idf ``linear`` for documents."""
    if input_spec.is_documents or (transform is not None and transform.startswith("bof")):
        return [f"sensing1(n={n})" for n in SENSING_WORDS] + ["linear"]
    measures = ["linear"] + [f"rbf(gamma={gamma:g})" for gamma in RBF_GAMMAS]
    if input_spec.kind == "grid" and transform is not None:
        measures += ["rigid(1)", "deformable(1, 1)"]
    return measures


def transform_candidates(input_spec: InputSpec) -> list[str | None]:
    """Input transforms to try: pixels and HOG cells at one or two cell sizes (about 4 x 4 and
    7 x 7 cells) for images; and bags of visual words on a pyramid (``bof``, its defaults) for
    images of at least :data:`BOF_MIN_SIDE` pixels a side; none otherwise."""
    if input_spec.kind != "grid" or input_spec.shape[2] not in (1, 3):
        return [None]
    side = min(input_spec.shape[:2])
    cells = sorted({c for c in (side // 4, side // 7) if c >= 2}, reverse=True)
    bof = ["bof"] if side >= BOF_MIN_SIDE else []
    return ["pixels"] + [f"hog({c})" for c in cells] + bof


def basis_size_candidates(
    class_size: int, n_measures: int, n_classes: int, max_features: int = MAX_FEATURES
) -> list[int]:
    """Per-class basis sizes to try: :data:`BASIS_SIZES` up to the largest class (whose full
    size is a candidate too) and to ``max_features`` features."""
    cap = max(1, min(class_size, max_features // max(1, n_measures * n_classes)))
    sizes = [size for size in BASIS_SIZES if size < cap]
    return [*sizes, cap]


def grown_basis_per_class(
    per_class: int,
    searched_items: int,
    n_train: int,
    largest_class: int,
    n_measures: int,
    n_classes: int,
    max_features: int = MAX_DOCUMENT_FEATURES,
) -> int:
    """The per-class basis size for the whole training split, grown from the one chosen on a
    fold's training part (``searched_items`` items) in proportion to the items: the basis keeps
    the same share of each class. Capped by the largest class and by ``max_features``
    features, never below ``per_class``.

    For documents, and for dense inputs searched on a sample: there the search runs on folds
    far smaller than the split, and accuracy keeps growing with the basis, so the size the
    folds support would leave most of the split's information out.
    """
    grown = round(per_class * n_train / max(1, searched_items))
    cap = max(1, max_features // max(1, n_measures * n_classes))
    return max(per_class, min(grown, largest_class, cap))


# -- cross-validation ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Fold:
    """One fold's training part and validation part."""

    X_train: Any
    y_train: np.ndarray
    X_valid: Any
    y_valid: np.ndarray


def _folds(X, y: np.ndarray, n_splits: int, random_state: int, max_items: int):
    """The training set as ``n_splits`` stratified folds, on a stratified sample of at most
    ``max_items`` items; the folds and the number of items they share."""
    if len(y) > max_items:
        X, _, y, _ = train_test_split(
            X, y, train_size=max_items, stratify=y, random_state=random_state
        )
    smallest = min(np.unique(y, return_counts=True)[1])
    n_splits = max(2, min(n_splits, int(smallest)))
    splitter = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=random_state)
    return [
        _Fold(X[train], y[train], X[valid], y[valid])
        for train, valid in splitter.split(np.zeros(len(y)), y)
    ], len(y)


def _score_fold(estimator, params: dict[str, Any], fold: _Fold, threads: int) -> tuple[int, int]:
    """Correct predictions and items of one validation fold, trained on the fold's rest."""
    # BLAS gets one thread: its work here is small (eigh of a B x B Gram matrix), and its
    # threads spin-wait, which costs far more than they save when another process holds a core
    # (a 75 x 75 eigh took 90 ms with two threads on 2 busy cores, 1 ms with one).
    model = clone(estimator).set_params(**params, n_jobs=threads, verbose=False)
    with limit_threads(numba_threads=threads, blas_threads=1):
        predicted = model.fit(fold.X_train, fold.y_train).predict(fold.X_valid)
    return int(np.count_nonzero(predicted == fold.y_valid)), len(fold.y_valid)


class _FoldScorer:
    """Scores candidates on the folds, in parallel, within a deadline."""

    def __init__(self, estimator, folds: list[_Fold], n_jobs: int, deadline: float, progress):
        self.estimator = estimator
        self.folds = folds
        self.threads = max(1, available_cpus() // n_jobs)
        self.deadline = deadline
        self.progress = progress
        self.fits = 0
        self.out_of_time = False
        self.parallel = Parallel(n_jobs=n_jobs, return_as="generator_unordered")

    def __call__(self, stage: str, candidates: Sequence[Candidate]) -> list[float | None]:
        """Cross-validated accuracy of each candidate; None for one not fully scored in time."""
        correct = np.zeros(len(candidates), dtype=np.int64)
        total = np.zeros(len(candidates), dtype=np.int64)
        done = np.zeros(len(candidates), dtype=np.int64)
        if time.monotonic() >= self.deadline:
            self.out_of_time = True
            return [None] * len(candidates)
        tasks = (
            delayed(_indexed)(i, _score_fold, self.estimator, candidate.params, fold, self.threads)
            for i, candidate in enumerate(candidates)
            for fold in self.folds
        )
        bar = _progress_bar(len(candidates) * len(self.folds), stage, self.progress)
        # Cancelling the fits left at the deadline is the point, not a mistake to warn about.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*tasks which were still being processed")
            results = self.parallel(tasks)
            try:
                for i, (right, n) in results:
                    correct[i] += right
                    total[i] += n
                    done[i] += 1
                    self.fits += 1
                    bar.update(1)
                    if time.monotonic() >= self.deadline:
                        self.out_of_time = True
                        break
            finally:
                # Closing the generator cancels the fits not yet started.
                results.close()
                bar.close()
        return [
            float(correct[i] / total[i]) if done[i] == len(self.folds) else None
            for i in range(len(candidates))
        ]


def _indexed(index: int, function, *args):
    return index, function(*args)


def _progress_bar(total: int, stage: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=f"selection: {stage}",
        unit="fit",
        leave=False,
        disable=not enabled or not sys.stderr.isatty(),
    )


# -- forward selection ---------------------------------------------------------------------


@dataclass(frozen=True)
class _KindRules:
    """What the search does differently for a kind of input."""

    normalization: str  # the similarity normalisation every candidate uses
    max_features: int  # basis items times measures, in the search
    grown_max_features: int  # the same for the final fit, when its basis grows ...
    grown_max_share: float | None  # ... and at most this share of the training items
    grow_unsampled: bool  # grow the basis even when the search saw every training item

    def grows_basis(self, searched_items: int, n_train: int) -> bool:
        """Whether the chosen basis grows from the searched folds to the whole split."""
        return self.grow_unsampled or searched_items < n_train

    def grown_features(self, n_train: int) -> int:
        """The feature budget of a grown basis on ``n_train`` training items."""
        if self.grown_max_share is None:
            return self.grown_max_features
        return max(1, min(self.grown_max_features, int(self.grown_max_share * n_train)))


_DENSE_RULES = _KindRules(
    normalization="auto",
    max_features=MAX_FEATURES,
    grown_max_features=MAX_GROWN_FEATURES,
    grow_unsampled=False,
    grown_max_share=MAX_GROWN_SHARE,
)
_DOCUMENT_RULES = _KindRules(
    normalization=DOCUMENT_NORMALIZATION,
    max_features=MAX_DOCUMENT_FEATURES,
    grown_max_features=MAX_DOCUMENT_FEATURES,
    grow_unsampled=True,
    grown_max_share=None,  # measured on fortunes only, where accuracy grew up to the budget
)


def _rules_for(spec: InputSpec) -> _KindRules:
    return _DOCUMENT_RULES if spec.is_documents else _DENSE_RULES


class _Search:
    """The current setting of the searched parameters, its accuracy and the path so far."""

    def __init__(self, scorer: _FoldScorer, start: dict[str, Any], margin: float, started: float):
        self.scorer = scorer
        self.current = start
        self.accuracy = float("nan")
        self.margin = margin
        self.started = started
        self.path: list[dict[str, Any]] = []

    def vary(
        self,
        stage: str,
        name: str,
        values: Sequence[Any],
        describe: Callable[[Any], str],
        free: bool = False,
    ) -> bool:
        """:meth:`step` over the current setting with parameter ``name`` set to each of
        ``values`` but its current one; ``describe`` names a value in the path."""
        candidates = [
            Candidate(describe(value), {**self.current, name: value})
            for value in values
            if value != self.current[name]
        ]
        return self.step(stage, candidates, free=free)

    def step(
        self,
        stage: str,
        candidates: list[Candidate],
        replace_current: bool = False,
        free: bool = False,
    ) -> bool:
        """Score ``candidates``; take the best if it beats the current setting by the margin
        (or, with ``replace_current``, in any case: the starting step; with ``free``, for
        changes that cost nothing when serving, by any gain). Whether a step was taken."""
        if not candidates or self.scorer.out_of_time:
            return False
        scores = self.scorer(stage, candidates)
        scored = [(s, i) for i, s in enumerate(scores) if s is not None]
        if not scored:
            return False
        # The best score; among equals the first candidate (the cheaper, by construction).
        best_score, best = max(scored, key=lambda pair: (pair[0], -pair[1]))
        gained = best_score > self.accuracy if free else best_score >= self.accuracy + self.margin
        if not replace_current and not gained:
            return False
        self.current = candidates[best].params
        self.accuracy = best_score
        self.path.append(
            {
                "step": len(self.path) + 1,
                "stage": stage,
                "change": candidates[best].change,
                "similarity": self.current["similarity"],
                "cv_accuracy": best_score,
                "candidates": len(scored),
                "elapsed_s": round(time.monotonic() - self.started, 2),
            }
        )
        return True


def _add_measures(
    search: _Search, spec: InputSpec, n_classes: int, max_features: int = MAX_FEATURES
) -> None:
    """Add the measure that helps most, while one helps by the margin; the basis shrinks if the
    measures would otherwise exceed ``max_features`` features."""
    while len(search.current["similarity"].split("+")) < MAX_MEASURES:
        chosen = {m.strip() for m in search.current["similarity"].split("+")}
        fitting = max(1, max_features // ((len(chosen) + 1) * n_classes))
        per_class = min(search.current["basis_per_class"], fitting)
        shrunk = (
            f" ({per_class} bases per class)"
            if per_class < search.current["basis_per_class"]
            else ""
        )
        candidates = [
            Candidate(
                f"+ {m}{shrunk}",
                {
                    **search.current,
                    "similarity": f"{search.current['similarity']} + {m}",
                    "basis_per_class": per_class,
                },
            )
            for m in measure_candidates(spec, search.current["input_transform"])
            if m not in chosen
        ]
        if not candidates or not search.step("add measure", candidates):
            return


# -- the wrapper ---------------------------------------------------------------------------


class ForwardSelectionCV(MetaEstimatorMixin, ClassifierMixin, BaseEstimator):
    """Choose the configuration of a BE-SVM by forward selection, cross-validated on the
    training set (see the module docstring), then fit it on the whole set.

    Parameters
    ----------
    estimator : BasisExpandingSVC
        The estimator whose :data:`SEARCHED_PARAMETERS` are chosen; its other parameters are
        kept. Cloned, never fitted itself.
    budget : float, default=DEFAULT_BUDGET_S
        Seconds the search may take; it stops, keeping the best configuration found, when they
        are spent (the fits running then are finished or cancelled, so it may overrun by about
        one fold fit).
    cv : int, default=3
        Stratified folds (fewer if the smallest class has fewer items; at least 2).
    n_jobs : int or None, default=None
        Fold fits run side by side (joblib processes); None or -1: one per available core.
        Each gets ``cores // n_jobs`` numba threads and one BLAS thread.
    margin : float, default=DEFAULT_MARGIN
        Accuracy a step must gain to be taken (0.0025: a quarter of a point); C and the basis
        strategy are taken on any gain.
    max_items : int, default=MAX_SEARCH_ITEMS
        Larger training sets are cross-validated on a stratified sample of this many items.
    random_state : int, default=0
        Seed of the folds and the sample.
    refit : bool, default=True
        Fit the chosen configuration on the whole training set (``best_estimator_``).
    verbose : bool, default=False
        A progress bar per stage on a terminal (never when stderr is not a tty).

    Attributes
    ----------
    best_params_ : dict
        The chosen :data:`SEARCHED_PARAMETERS`, the basis grown to the whole set where the
        rules say so.
    best_score_ : float
        Cross-validated accuracy of the chosen configuration on the folds (NaN if the budget
        ran out before any candidate was scored).
    best_estimator_ : BasisExpandingSVC
        The chosen configuration fitted on the whole training set (with ``refit``).
    path_ : list of dict
        The steps taken, in order: ``step``, ``stage``, ``change`` (the candidate, in words),
        ``similarity``, ``cv_accuracy`` (a fraction), ``candidates`` (how many were scored),
        ``elapsed_s``. Plain JSON, for the manifest. ``cv_accuracy`` increases along it.
    stopped_ : str
        Why the search ended.
    seconds_ : float
        The search's time (the refit not counted).
    n_fits_ : int
        Fold fits run (candidates times folds).
    n_splits_ : int
    n_items_ : int
        Training items the search cross-validated on (a sample when the set is larger than
        ``max_items``).
    searched_basis_per_class_ : int
        The basis size per class chosen on the folds, before it grew.
    documents_ : bool
        Whether the inputs are documents (no input normalisation to choose).
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
        Numbers in one flattened dense input (not set for documents).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "estimator": [HasMethods(["fit", "predict", "set_params"])],
        "budget": [Interval(Real, 0, None, closed="neither")],
        "cv": [Interval(Integral, 2, None, closed="left")],
        "n_jobs": [Integral, None],
        "margin": [Interval(Real, 0, None, closed="left")],
        "max_items": [Interval(Integral, 2, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "refit": ["boolean"],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        estimator,
        *,
        budget=DEFAULT_BUDGET_S,
        cv=3,
        n_jobs=None,
        margin=DEFAULT_MARGIN,
        max_items=MAX_SEARCH_ITEMS,
        random_state=0,
        refit=True,
        verbose=False,
    ):
        self.estimator = estimator
        self.budget = budget
        self.cv = cv
        self.n_jobs = n_jobs
        self.margin = margin
        self.max_items = max_items
        self.random_state = random_state
        self.refit = refit
        self.verbose = verbose

    def fit(self, X, y):
        """Select a configuration on (X, y) and, with ``refit``, fit it on all of (X, y).

        Parameters
        ----------
        X : array-like or sequence of str
            Training inputs, as the wrapped estimator's ``fit`` takes them.
        y : array-like of shape (n_samples,)

        Returns
        -------
        self : ForwardSelectionCV

        Raises
        ------
        ValueError
            Fewer than two classes, or inputs the estimator refuses.
        """
        self._validate_params()
        started = time.monotonic()
        preparation = preparation_for(X, self.estimator)
        probe = clone(self.estimator)
        X_checked, y_checked = preparation.validate_fit(probe, X, y)
        check_classification_targets(y_checked)
        if hasattr(probe, "n_features_in_"):  # dense inputs
            self.n_features_in_ = probe.n_features_in_
        spec = preparation.spec
        # The folds see the labels as the artifact names them: the classes' order, hence the
        # items a random or k-medoids basis draws per class, is that of the text.
        labels = np.asarray([str(label) for label in y_checked])
        if len(np.unique(labels)) < 2:
            raise ValueError(
                f"a classifier needs at least two classes in y, got 1 class: {labels[0]!r}"
            )
        jobs = available_cpus() if self.n_jobs is None or self.n_jobs < 0 else max(1, self.n_jobs)
        folds, n_items = _folds(X_checked, labels, self.cv, self.random_state, self.max_items)
        rules = _rules_for(spec)
        start = {
            "similarity": START_MEASURE if not spec.is_documents else "linear",
            "input_transform": None,
            "input_normalization": GLOBAL_NORMALIZATION,
            "basis_per_class": START_BASIS_PER_CLASS,
            "basis_strategy": "index",
            "normalization": rules.normalization,
            "C": 1.0,
        }
        # The folds read flat rows: the wrapped estimator must read them as the whole set's.
        # Their bases are drawn with the selection's seed where the estimator has none, so that
        # a seed gives one path.
        base = clone(self.estimator).set_params(
            input_shape=None if spec.is_documents else str(spec),
            random_state=(
                self.random_state
                if self.estimator.get_params()["random_state"] is None
                else self.estimator.get_params()["random_state"]
            ),
        )
        scorer = _FoldScorer(base, folds, jobs, started + self.budget, self.verbose)
        search = _Search(scorer, start, self.margin, started)
        _run_stages(search, spec, folds, rules)
        chosen = dict(search.current)
        if rules.grows_basis(n_items, len(labels)):
            classes, counts = np.unique(labels, return_counts=True)
            chosen["basis_per_class"] = grown_basis_per_class(
                chosen["basis_per_class"],
                len(folds[0].y_train),
                len(labels),
                int(counts.max()),
                len(chosen["similarity"].split("+")),
                len(classes),
                rules.grown_features(len(labels)),
            )
        self.best_params_ = chosen
        self.best_score_ = search.accuracy
        self.path_ = search.path
        self.stopped_ = (
            f"budget of {self.budget:g} s spent" if scorer.out_of_time else "every stage done"
        )
        self.seconds_ = time.monotonic() - started
        self.n_fits_ = scorer.fits
        self.n_splits_ = len(folds)
        self.n_items_ = n_items
        self.searched_basis_per_class_ = search.current["basis_per_class"]
        self.documents_ = spec.is_documents
        self.classes_ = np.unique(labels)
        if self.refit:
            self.best_estimator_ = clone(self.estimator).set_params(**chosen).fit(X, y)
            self.classes_ = self.best_estimator_.classes_
        return self

    def predict(self, X):
        """Labels predicted by ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)

    def decision_function(self, X):
        """Scores of ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def record(self) -> dict[str, Any]:
        """The selection as plain JSON data, for the manifest's ``training`` entry."""
        check_is_fitted(self, "best_params_")
        return {
            "method": "forward selection, stratified k-fold cross-validation on the training split",
            "folds": self.n_splits_,
            "n_items": self.n_items_,
            "budget_s": float(self.budget),
            "seconds": round(self.seconds_, 2),
            "fits": self.n_fits_,
            "stopped": self.stopped_,
            # NaN is no JSON: the budget ran out before any candidate was scored.
            "cv_accuracy": None if np.isnan(self.best_score_) else self.best_score_,
            "chosen": dict(self.best_params_),
            "searched_basis_per_class": self.searched_basis_per_class_,
            "path": self.path_,
        }

    def describe(self) -> str:
        """The path as lines of text, one per step, then the choice."""
        check_is_fitted(self, "best_params_")
        lines = [
            f"  {entry['step']}. {entry['stage']:<14} {entry['change']:<44} "
            f"CV {100 * entry['cv_accuracy']:.2f}%"
            for entry in self.path_
        ]
        chosen = self.best_params_
        grown = (
            f", grown from {self.searched_basis_per_class_} on the folds"
            if self.searched_basis_per_class_ != chosen["basis_per_class"]
            else ""
        )
        lines.append(
            f"  chosen: {chosen['similarity']} on {chosen['input_transform'] or 'the inputs'}"
            + ("" if self.documents_ else f", {chosen['input_normalization']} input normalisation")
            + f", {chosen['basis_per_class']} bases per class ({chosen['basis_strategy']}{grown}),"
            f" C = {chosen['C']:g}; {self.stopped_}; {self.n_fits_} fold fits in"
            f" {self.seconds_:.1f} s"
        )
        return "\n".join(lines)


def _run_stages(search: _Search, spec: InputSpec, folds: list[_Fold], rules: _KindRules) -> None:
    """The stages of the module docstring, in order, on ``search``."""
    current = search.current
    if spec.is_documents:
        search.step(
            "first measure",
            [Candidate(m, {**current, "similarity": m}) for m in measure_candidates(spec, None)],
            replace_current=True,
        )
    else:
        search.step(
            "inputs",
            [
                Candidate(
                    f"{normalization} normalisation, {transform or 'no transform'}",
                    {**current, "input_normalization": normalization, "input_transform": transform},
                )
                for transform in transform_candidates(spec)
                for normalization in (GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION)
                # word counts are not normalised: one candidate for bof
                if transform != "bof" or normalization == GLOBAL_NORMALIZATION
            ],
            replace_current=True,
        )
        search.vary(
            "first measure",
            "similarity",
            measure_candidates(spec, search.current["input_transform"]),
            lambda measure: measure,
        )
    # The basis size before more measures: on large training sets it matters most, and an
    # added measure must then fit in the feature budget with the basis chosen.
    n_classes = len(np.unique(folds[0].y_train))
    largest = int(max(np.unique(folds[0].y_train, return_counts=True)[1]))
    search.vary(
        "basis size",
        "basis_per_class",
        basis_size_candidates(largest, 1, n_classes, rules.max_features),
        lambda size: f"{size} bases per class",
    )
    _add_measures(search, spec, n_classes, rules.max_features)
    # C and the basis strategy cost nothing when serving: any gain takes them.
    search.vary("C", "C", C_GRID, lambda C: f"C = {C:g}", free=True)
    search.vary(
        "basis strategy",
        "basis_strategy",
        STRATEGIES,
        lambda strategy: f"{strategy} basis",
        free=True,
    )


__all__ = [
    "DEFAULT_BUDGET_S",
    "SEARCHED_PARAMETERS",
    "Candidate",
    "ForwardSelectionCV",
    "basis_size_candidates",
    "grown_basis_per_class",
    "measure_candidates",
    "transform_candidates",
]
