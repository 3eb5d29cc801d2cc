"""Forward selection of a :class:`~training.estimator.BasisExpandingSVC`'s configuration by
cross-validation: :class:`ForwardSelectionCV`, a wrapper like scikit-learn's ``GridSearchCV``.

It clones the estimator it wraps, scores candidate settings of its parameters by stratified
k-fold cross-validation on the training set it is given (repeated with other shuffles when the
set is small), and improves one configuration step by step, the BE-SVM paper's greedy answer
(section 3.5) to "which measures, at which resolution". A kernel's width, the SVM's C and the
basis size depend on each other (a narrow rbf pays only with a larger basis and a larger C), so
they are searched together and revisited, not fixed one after the other:

1. **Inputs** (images only): the transform (pixels, or HOG cells at one or two cell sizes) under
   either input normalisation, with ``rbf(gamma=1)``; the best fixes the transform.
2. **Widths and C**: every candidate measure at each value of a coarse log grid of its scale
   (:data:`SCALES`: rbf's gamma over 2.4 decades, sensing's n over 2 decades, rigid's shift)
   times a coarse grid of C, under both input normalisations (dense inputs), as a kernel SVM's
   grid search does.
3. **Basis size** per class: a grid (10, 25, 50, ...) up to the largest class of a fold, whose
   every item is a candidate basis on small sets, and up to a prediction-work budget
   (:data:`MAX_FEATURES` rbf-equivalent basis items; a measure costing 9 times an rbf per pair
   counts 9 times).
4. **Refinement**, repeated while it moves: the width one step either way on its scale's ladder,
   C one step either way (together: 8 neighbours) and the basis one size either way.
5. **Added measures**: the measure whose ``+``-combination with those chosen helps most,
   repeatedly, up to :data:`MAX_MEASURES`; a second rbf of another width is a candidate (the
   linear SVM then learns a combination of two kernels, which one SVC cannot be).
6. **C** one step either way, then **the basis strategy** (``random``, ``kmedoids``).

Only real gains change the model: a stage's best candidate is taken when its gain over the
current configuration exceeds ``min_gain_se`` standard errors of the paired difference (each
validation item's difference in correctness, averaged over the repeats), and a candidate that is
cheaper to predict and not less accurate wins a tie. Stages of many candidates race them, the
most promising first, nine at a time: after one fold, those clearly behind the best so far
(:data:`RACE_Z` standard errors) are dropped, and at most a third go on. Everything stops when
the time budget is spent (by default it grows with the items searched, :func:`budget_for`): a
candidate whose folds are not all scored by then is not
considered, and the record says which stage was cut. The path (each step taken, its
cross-validated accuracy, gain and standard error) is kept in ``path_``, every stage in
``stages_``, as plain data for the manifest (:meth:`ForwardSelectionCV.record`).

The parameters it chooses are :data:`SEARCHED_PARAMETERS`; every other parameter of the wrapped
estimator (``max_iter``, ``min_df``, ``stop_words``, ``input_shape``, ...) is the user's, in the
folds as in the final model. Candidates and folds are scored in parallel with joblib
(``n_jobs`` processes), each process limiting its threads through
:func:`service.model.threads.limit_threads` (numba: its share of the cores; BLAS: one) so that
together they use the cores once. On a Dask cluster they are tasks on its workers instead
(joblib's Dask backend, the items searched scattered once), and sharded data is searched on a
stratified sample of its shards (:meth:`ForwardSelectionCV.fit`).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from joblib import Parallel, delayed, parallel_config
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import RepeatedStratifiedKFold, train_test_split

# scikit-learn has no public form of its parameter constraints; its own estimators declare
# theirs with these, and the pinned version is checked by the estimator checks in the tests.
from sklearn.utils._param_validation import HasMethods, Interval
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from service.model.inputs.dense import GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform
from service.model.similarity import parse_spec, split_specs
from service.model.threads import available_cpus, limit_threads
from training.cluster import client_for, enclosing_client
from training.distributed_fit import draw_sample, fit_on_cluster, in_process_client
from training.preparation import preparation_for
from training.shards import ShardedData

# The search's time budget grows with the items it cross-validates: digits (1,000 training
# images) gets 40 s, a sample of 3,000 items 120 s (docs/how-it-works/model-selection.md has the
# measurements).
BUDGET_S_PER_1000_ITEMS = 40.0
# Kept for callers that name the budget of a 1,000-item set.
DEFAULT_BUDGET_S = BUDGET_S_PER_1000_ITEMS
# The budget counts the fold fits' CPU time per core the search uses, which other processes'
# load does not change (at a load average of 20 a fold fit took 10 to 15 times its CPU time in
# wall time, and a wall-clock budget scored a tenth of the search); past this many times the
# budget in wall time the search stops all the same.
WALL_BACKSTOP = 10.0
# A step must gain more than this many standard errors of the paired difference.
DEFAULT_MIN_GAIN_SE = 1.0
# Sets smaller than this are cross-validated with several shuffles of the folds (at most
# MAX_REPEATS), so that about this many validations back every comparison.
MIN_VALIDATIONS = 1000
MAX_REPEATS = 3
# Racing, from RACE_FROM candidates, RACE_CHUNK at a time: after a first pass, a candidate this
# many standard errors behind the best so far is dropped, and at most a third of a chunk goes on
# to the other folds.
RACE_FROM = 5
RACE_CHUNK = 9
RACE_Z = 2.0
RACE_SHARE = 1 / 3
MAX_MEASURES = 3
# Basis items times the measures' work per pair, relative to an rbf's (rigid(1) counts 9, the
# SimilarityKind.cost of the measure): caps training memory and, above all, serving cost.
MAX_FEATURES = 1000
# A measure that can have fewer basis items a class than this within MAX_FEATURES is not offered.
MIN_BASIS_PER_CLASS = 5
# Documents: their measures read sparse tf-idf or word-frequency vectors, cheap per basis item,
# and accuracy keeps growing with the basis far beyond 1,000 items
# (docs/measurements/reports/fortunes: from
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
# items: 83.75% at 1,000, 83.85% at 2,000, 80.15% at 4,000; docs/how-it-works/model-selection.md).
MAX_GROWN_FEATURES = 4000
MAX_GROWN_SHARE = 0.2
# Searches of fewer numbers than this (items searched times features) run their fold fits in the
# calling process by default: starting worker processes (importing numpy, scikit-learn, numba)
# costs more than their fits save, and on 2 cores at a load average of 20 it took the whole
# 40 s budget of wine's search (one fold fit scored).
PROCESSES_FROM_NUMBERS = 100_000
# The solver's iterations in a fold fit at most (the final fit keeps the estimator's max_iter).
FOLD_MAX_ITER = 500
# Rounds of the refinement stage at most (each moves the width, C or the basis one step).
MAX_REFINEMENTS = 4
# The work of a HOG transform per input pixel, in multiply-adds: about 3 µs for an 8 x 8 digit
# on one thread, where an rbf against 250 bases of 64 numbers (16,000 multiply-adds) takes
# about 1 µs (docs/how-it-works/model-selection.md). Only compared between candidates (ties go to
# the cheaper).
HOG_WORK_PER_PIXEL = 800.0

START_MEASURE = "rbf(gamma=1)"
START_BASIS_PER_CLASS = 25
BASIS_SIZES = (10, 25, 50, 100, 200, 400, 800)
STRATEGIES = ("index", "random", "kmedoids")


@dataclass(frozen=True)
class Scale:
    """A measure's scale parameter: the values it may take (``ladder``, sorted; the refinement
    moves one step on it) and the coarse grid every search starts from."""

    kind: str
    parameter: str
    ladder: tuple[float, ...]
    coarse: tuple[float, ...]

    def measure(self, value: float) -> str:
        return f"{self.kind}({self.parameter}={value:g})"

    def neighbours(self, value: float) -> list[float]:
        """The values one step below and above ``value`` on the ladder (its nearest rung if
        it is not on it)."""
        logs = np.abs(np.log(np.asarray(self.ladder)) - math.log(value))
        at = int(np.argmin(logs))
        return [self.ladder[i] for i in (at - 1, at + 1) if 0 <= i < len(self.ladder)]

    def steps(self, value: float, n: int) -> list[float]:
        """The values ``n`` steps below and above ``value`` on the ladder."""
        logs = np.abs(np.log(np.asarray(self.ladder)) - math.log(value))
        at = int(np.argmin(logs))
        return [self.ladder[i] for i in (at - n, at + n) if 0 <= i < len(self.ladder)]


# rbf widths relative to the normalised inputs: both normalisations make the mean norm 1, so the
# mean squared distance between two items is about 2 and gamma = 1 is scikit-learn's "scale".
# The coarse grid spans 1/16 to 16 (2.4 decades, a factor of 4 apart); the ladder halves it.
RBF_SCALE = Scale(
    "rbf", "gamma", tuple(2.0**k for k in range(-6, 7)), (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
)
# sensing1's n (the words a document is scaled to): 15 to 1,500, half a decade apart.
SENSING_SCALE = Scale(
    "sensing1",
    "n",
    (5, 9, 15, 27, 50, 87, 150, 270, 500, 870, 1500, 2700, 5000),
    (15, 50, 150, 500, 1500),
)
# rigid's scale is its shift range in cells: each step multiplies its work per pair by 2.8 (1)
# to 9 (2), so the prediction-work budget decides how far it may go.
RIGID_SCALE = Scale("rigid", "h", (1, 2), (1, 2))
SCALES = {scale.kind: scale for scale in (RBF_SCALE, SENSING_SCALE, RIGID_SCALE)}
# C: the coarse grids below, then one step either way on this ladder (a factor of about 3).
C_LADDER = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
# Sharded data: the sample's C is searched again on every shard, with this many steps of the
# ladder either way (a warm-started path of the distributed fit).
SHARD_C_STEPS = 2
# Kernel measures' features are weak one by one when the kernel is narrow, and pay with a larger
# C (the tuned SVC's best C was 10 to 100 on the sets whose best width was narrow); the linear
# measure's, with a smaller one.
COARSE_C = (1.0, 10.0, 100.0)
COARSE_C_LINEAR = (0.1, 1.0, 10.0)
# Documents' SVMs are slow (fortunes: seconds a fold fit): the coarse grid keeps C = 1 there.
COARSE_C_DOCUMENTS = (1.0,)
# Images at least this many pixels a side are offered the bof transform (16 x 16 patches every 8
# pixels: a 3 x 3 grid of patches at least).
BOF_MIN_SIDE = 32

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


def budget_for(n_items: int) -> float:
    """The default time budget in seconds of a search that cross-validates ``n_items`` items:
    :data:`BUDGET_S_PER_1000_ITEMS` per 1,000, at least that much."""
    return BUDGET_S_PER_1000_ITEMS * max(1.0, n_items / 1000)


def repeats_for(n_items: int) -> int:
    """Shuffles of the folds for a set of ``n_items``: enough for about
    :data:`MIN_VALIDATIONS` validations, at most :data:`MAX_REPEATS`."""
    return int(min(MAX_REPEATS, max(1, math.ceil(MIN_VALIDATIONS / max(1, n_items)))))


# -- the candidates ------------------------------------------------------------------------


def measures(similarity: str) -> list[str]:
    """The measures of a ``+``-joined similarity, as written."""
    return [m.strip() for m in split_specs(similarity)]


def basis_weight(similarity: str) -> float:
    """Work per basis item of ``similarity``'s measures, in rbf pairs: the sum of each
    measure's :attr:`~service.model.similarity.SimilarityKind.cost` (linear, rbf and the
    document measures 1, ``rigid(1)`` 9, ``deformable(1, 1)`` 106)."""
    total = 0.0
    for text in measures(similarity):
        spec = parse_spec(text)
        total += spec.kind.cost(*[value for _, value in spec.params])
    return total


def basis_cap(similarity: str, n_classes: int, max_features: int) -> int:
    """The most basis items per class that ``similarity`` may have within ``max_features``."""
    return max(1, int(max_features // (basis_weight(similarity) * max(1, n_classes))))


def measure_candidates(input_spec: InputSpec, transform: str | None) -> list[str]:
    """The measures forward selection may use on inputs of ``input_spec`` read through
    ``transform``, each scaled one at the coarse grid of its :class:`Scale`: linear and rbf for
    vectors; those, ``rigid`` and ``deformable(1, 1)`` on image grids (pixels or HOG cells);
    ``sensing1`` and tf-idf ``linear`` for documents and for bags of visual words (``bof``)."""
    if input_spec.is_documents or _learns_from_items(transform):
        return [SENSING_SCALE.measure(n) for n in SENSING_SCALE.coarse] + ["linear"]
    candidates = ["linear"] + [RBF_SCALE.measure(gamma) for gamma in RBF_SCALE.coarse]
    if input_spec.kind == "grid" and transform is not None:
        candidates += [RIGID_SCALE.measure(h) for h in RIGID_SCALE.coarse]
        candidates += ["deformable(1, 1)"]
    return candidates


def _learns_from_items(transform: str | None) -> bool:
    """Whether ``transform`` learns from the training items (bof's visual words), in one
    process: its outputs are word counts, read by the document measures and never
    input-normalised."""
    return transform is not None and parse_transform(transform).is_fitted


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
    class_size: int, weight: float, n_classes: int, max_features: int = MAX_FEATURES
) -> list[int]:
    """Per-class basis sizes to try: :data:`BASIS_SIZES` up to the largest class (whose full
    size is a candidate too: every item a basis item) and to ``max_features`` over the
    measures' ``weight`` (:func:`basis_weight`)."""
    cap = max(1, min(class_size, int(max_features // (max(weight, 1e-9) * max(1, n_classes)))))
    sizes = [size for size in BASIS_SIZES if size < cap]
    return [*sizes, cap]


def grown_basis_per_class(
    per_class: int,
    searched_items: int,
    n_train: int,
    largest_class: int,
    weight: float,
    n_classes: int,
    max_features: int = MAX_DOCUMENT_FEATURES,
) -> int:
    """The per-class basis size for the whole training split, grown from the one chosen on a
    fold's training part (``searched_items`` items) in proportion to the items: the basis keeps
    the same share of each class. Capped by the largest class and by ``max_features`` over the
    measures' ``weight``, never below ``per_class``.

    For documents, and for dense inputs searched on a sample: there the search runs on folds
    far smaller than the split, and accuracy keeps growing with the basis, so the size the
    folds support would leave most of the split's information out.
    """
    grown = round(per_class * n_train / max(1, searched_items))
    cap = max(1, int(max_features // (max(weight, 1e-9) * max(1, n_classes))))
    return max(per_class, min(grown, largest_class, cap))


def prediction_work(params: dict[str, Any], input_spec: InputSpec, n_classes: int) -> float:
    """Multiply-adds to score one input under ``params``, roughly: the transform, each
    measure against the basis (a linear measure folds into weights on the input), the SVM.
    Only compared between candidates: a cheaper one that is as accurate wins."""
    n_basis = params["basis_per_class"] * n_classes
    if input_spec.is_documents:
        n_features, work = 1, 0.0
    else:
        transform = parse_transform(params["input_transform"])
        n_features = transform.n_features(input_spec)
        work = 0.0 if transform.is_identity else HOG_WORK_PER_PIXEL * input_spec.n_features
    for text in measures(params["similarity"]):
        spec = parse_spec(text)
        if spec.kind.linear_in_input and not input_spec.is_documents:
            work += n_features * n_classes
        else:
            work += spec.work(1, n_basis, n_features) + n_basis * n_classes
    return work


# -- cross-validation ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Fold:
    """One fold, as positions among the searched items (``train_index``, ``valid_index``) and
    their labels; ``repeat`` is the shuffle the fold belongs to. A fold carries no items: the
    searched items travel to each process (or cluster worker) once, and its tasks carry only
    these positions."""

    train_index: np.ndarray
    y_train: np.ndarray
    valid_index: np.ndarray
    y_valid: np.ndarray
    repeat: int


def _folds(X, y: np.ndarray, n_splits: int, repeats: int, random_state: int, max_items: int):
    """The training set as ``repeats`` shuffles of ``n_splits`` stratified folds, on a
    stratified sample of at most ``max_items`` items; the items searched, the folds and how
    many items they share."""
    if len(y) > max_items:
        X, _, y, _ = train_test_split(
            X, y, train_size=max_items, stratify=y, random_state=random_state
        )
    smallest = min(np.unique(y, return_counts=True)[1])
    n_splits = max(2, min(n_splits, int(smallest)))
    splitter = RepeatedStratifiedKFold(
        n_splits=n_splits, n_repeats=repeats, random_state=random_state
    )
    folds = [
        _Fold(train, y[train], valid, y[valid], i // n_splits)
        for i, (train, valid) in enumerate(splitter.split(np.zeros(len(y)), y))
    ]
    return X, folds, len(y)


def _score_fold(
    X, estimator, params: dict[str, Any], fold: _Fold, threads: int
) -> tuple[np.ndarray, float]:
    """Which validation items of a fold are predicted right, trained on the fold's rest
    (``X``: the searched items, which the fold's positions index); and the CPU seconds the fit
    and prediction took (the process's: its numba threads count)."""
    model = clone(estimator).set_params(**params, n_jobs=threads, verbose=False)
    # A candidate whose features are ill-conditioned (a wide rbf on one dominant feature) can
    # keep the solver for thousands of iterations (breast cancer, rbf(gamma=1/16), C = 10: 10,000
    # in 26 s, where others converge in 7 to 400): scored as it stands after FOLD_MAX_ITER.
    model.set_params(max_iter=min(model.max_iter, FOLD_MAX_ITER))
    # BLAS gets one thread: its work here is small (eigh of a B x B Gram matrix), and its
    # threads spin-wait, which costs far more than they save when another process holds a core
    # (a 75 x 75 eigh took 90 ms with two threads on 2 busy cores, 1 ms with one).
    started = time.process_time()
    with limit_threads(numba_threads=threads, blas_threads=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X[fold.train_index], fold.y_train)
        predicted = model.predict(X[fold.valid_index])
    return np.asarray(predicted == fold.y_valid), time.process_time() - started


def paired_gain(candidate: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """The gain in accuracy of ``candidate`` over ``reference``, validated on the same items,
    and its standard error.

    Parameters
    ----------
    candidate, reference : ndarray of shape (n_repeats, n_items), bool
        Whether each item was predicted right in each shuffle of the folds.

    Returns
    -------
    gain, standard_error : float
        The mean over the items of their difference in correctness (averaged over the
        repeats), and the standard error of that mean (items as the independent units).
    """
    differences = (candidate.astype(np.float64) - reference).mean(axis=0)
    if differences.size < 2:
        return float(differences.mean()), math.inf
    return float(differences.mean()), float(differences.std(ddof=1) / math.sqrt(differences.size))


def take(
    current: np.ndarray,
    current_work: float,
    candidates: Sequence[tuple[np.ndarray, float]],
    min_gain_se: float,
) -> tuple[int, float, float, str] | None:
    """Which candidate replaces the current configuration, if any: the most accurate of those
    whose gain exceeds ``min_gain_se`` standard errors of the paired difference; failing that,
    the most accurate of those cheaper to predict and at least as accurate; among equals the
    cheaper, then the first.

    Parameters
    ----------
    current : ndarray of shape (n_repeats, n_items), bool
        The current configuration's correctness on the validation items.
    current_work : float
        Its prediction work (:func:`prediction_work`).
    candidates : sequence of (ndarray, float)
        Each candidate's correctness on the same items and its prediction work.
    min_gain_se : float

    Returns
    -------
    (index, gain, standard_error, why) or None
        ``why`` is ``"gain"`` or ``"cheaper, as accurate"``.
    """
    better, cheaper = [], []
    for index, (correct, work) in enumerate(candidates):
        gain, error = paired_gain(correct, current)
        entry = (gain, -work, -index, error)
        if gain > 0 and gain > min_gain_se * error:
            better.append(entry)
        elif gain >= 0 and work < current_work:
            cheaper.append(entry)
    for entries, why in ((better, "gain"), (cheaper, "cheaper, as accurate")):
        if entries:
            gain, _, index, error = max(entries)
            return -index, gain, error, why
    return None


@dataclass
class _Scored:
    """What a stage's scoring gave: each candidate's correctness matrix (None if not every
    fold was scored), and how many were raced out."""

    correct: list[np.ndarray | None]
    raced_out: int


class SearchBudget:
    """A search's budget: ``seconds`` of its fold fits' CPU time per core it uses (what an idle
    machine spends in about as many seconds of wall time), so that other processes' load does
    not cut the search; and :data:`WALL_BACKSTOP` times ``seconds`` of wall time at most.

    Parameters
    ----------
    seconds : float
    cores : int
        The cores the fold fits run on at once (processes or cluster threads x each fit's
        threads).
    """

    def __init__(self, seconds: float, cores: int) -> None:
        self.seconds = float(seconds)
        self.cores = max(1, int(cores))
        self.started = time.monotonic()
        self.cpu_seconds = 0.0

    def add(self, cpu_seconds: float) -> None:
        self.cpu_seconds += cpu_seconds

    @property
    def used_s(self) -> float:
        """CPU seconds of the fits so far, per core."""
        return self.cpu_seconds / self.cores

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def spent(self) -> bool:
        return self.used_s >= self.seconds or self.wall_s >= WALL_BACKSTOP * self.seconds

    def describe(self) -> str:
        """Why the search stopped, when the budget stopped it."""
        if self.used_s >= self.seconds:
            return f"budget of {self.seconds:g} s spent"
        return (
            f"budget of {self.seconds:g} s cut by the wall clock ({self.wall_s:.0f} s, "
            f"{WALL_BACKSTOP:g} times the budget; {self.used_s:.1f} s of CPU a core)"
        )


class _FoldScorer:
    """Scores candidates on the folds, in parallel, within a budget, racing them."""

    def __init__(
        self,
        estimator,
        X,
        folds: list[_Fold],
        n_items: int,
        parallel: Parallel,
        threads: int,
        budget: SearchBudget,
        progress,
    ):
        self.estimator = estimator
        self.X = X
        self.folds = folds
        self.n_items = n_items
        self.repeats = 1 + max(fold.repeat for fold in folds)
        self.threads = threads
        self.budget = budget
        self.progress = progress
        self.fits = 0
        self.out_of_time = False
        self.parallel = parallel

    def __call__(
        self, stage: str, candidates: Sequence[Candidate], reference: np.ndarray | None
    ) -> _Scored:
        """Score every candidate on every fold, or race them when there are many, in chunks of
        :data:`RACE_CHUNK` in the order given (the most promising first, so that a stage the
        budget cuts still leaves its first chunks scored): a first pass (the first shuffle's
        folds when the folds are repeated, else the first fold), then the other folds for the
        chunk's candidates not clearly behind the best so far and ``reference`` (the current
        configuration's correctness) on that pass, at most a third of the chunk."""
        results: list[dict[int, np.ndarray]] = [{} for _ in candidates]
        folds = range(len(self.folds))
        first = [f for f in folds if self.folds[f].repeat == 0] if self.repeats > 1 else [0]
        if len(candidates) < RACE_FROM or len(first) == len(self.folds):
            tasks = [(i, f) for i in range(len(candidates)) for f in folds]
            self._run(stage, tasks, candidates, results)
            return _Scored([self._matrix(done) for done in results], 0)
        raced_out = 0
        for start in range(0, len(candidates), RACE_CHUNK):
            chunk = range(start, min(start + RACE_CHUNK, len(candidates)))
            self._run(stage, [(i, f) for i in chunk for f in first], candidates, results)
            if self.out_of_time:
                break
            alive = self._survivors(results, reference, first, chunk)
            raced_out += len(chunk) - len(alive)
            rest = [(i, f) for i in alive for f in folds if f not in first]
            self._run(stage, rest, candidates, results)
            if self.out_of_time:
                break
        return _Scored([self._matrix(done) for done in results], raced_out)

    def _matrix(self, done: dict[int, np.ndarray]) -> np.ndarray | None:
        if len(done) < len(self.folds):
            return None
        correct = np.zeros((self.repeats, self.n_items), dtype=bool)
        for f, right in done.items():
            fold = self.folds[f]
            correct[fold.repeat, fold.valid_index] = right
        return correct

    def _survivors(
        self,
        results: list[dict[int, np.ndarray]],
        reference: np.ndarray | None,
        first: list[int],
        chunk: range,
    ) -> list[int]:
        """The candidates of ``chunk`` not :data:`RACE_Z` standard errors behind the best so
        far on the ``first`` folds, the best first, at most :data:`RACE_SHARE` of the chunk."""
        index = np.concatenate([self.folds[f].valid_index for f in first])
        on_pass = {
            i: np.concatenate([done[f] for f in first])[None, :]
            for i, done in enumerate(results)
            if all(f in done for f in first)
        }
        contenders = list(on_pass.values())
        if reference is not None:
            contenders.append(reference[0, index][None, :])
        best = max(contenders, key=lambda right: right.mean())
        kept = [i for i in chunk if _not_behind(best, on_pass[i])]
        # Stable: among equals the earlier (more promising) candidate goes on.
        kept.sort(key=lambda i: -on_pass[i].mean())
        return sorted(kept[: math.ceil(RACE_SHARE * len(chunk))])

    def _run(
        self,
        stage: str,
        tasks: list[tuple[int, int]],
        candidates: Sequence[Candidate],
        results: list[dict[int, np.ndarray]],
    ) -> None:
        if not tasks:
            return
        if self.budget.spent:
            self.out_of_time = True
            return
        jobs = (
            delayed(_indexed)(
                (i, f),
                _score_fold,
                self.X,
                self.estimator,
                candidates[i].params,
                self.folds[f],
                self.threads,
            )
            for i, f in tasks
        )
        bar = _progress_bar(len(tasks), stage, self.progress)
        # Cancelling the fits left when the budget is spent is the point, not a mistake.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*tasks which were still being processed")
            outcomes = self.parallel(jobs)
            try:
                for (i, f), (right, cpu_seconds) in outcomes:
                    results[i][f] = right
                    self.fits += 1
                    self.budget.add(cpu_seconds)
                    bar.update(1)
                    if self.budget.spent:
                        self.out_of_time = True
                        break
            finally:
                # Closing the generator cancels the fits not yet started.
                outcomes.close()
                bar.close()


def _not_behind(best: np.ndarray, right: np.ndarray) -> bool:
    gain, error = paired_gain(best, right)
    return gain <= RACE_Z * error


def _indexed(index, function, *args):
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
    max_features: int  # basis items times the measures' weight, in the search
    grown_max_features: int  # the same for the final fit, when its basis grows ...
    grown_max_share: float | None  # ... and at most this share of the training items
    grow_unsampled: bool  # grow the basis even when the search saw every training item
    input_normalizations: tuple[str, ...]  # searched with the widths and C
    documents: bool

    def grows_basis(self, searched_items: int, n_train: int) -> bool:
        """Whether the chosen basis grows from the searched folds to the whole split."""
        return self.grow_unsampled or searched_items < n_train

    def grown_features(self, n_train: int) -> int:
        """The feature budget of a grown basis on ``n_train`` training items."""
        if self.grown_max_share is None:
            return self.grown_max_features
        return max(1, min(self.grown_max_features, int(self.grown_max_share * n_train)))

    def coarse_C(self, measure: str) -> tuple[float, ...]:
        """The values of C the coarse grid tries with ``measure``."""
        if self.documents:
            return COARSE_C_DOCUMENTS
        return COARSE_C_LINEAR if parse_spec(measure).kind.linear_in_input else COARSE_C


_DENSE_RULES = _KindRules(
    normalization="auto",
    max_features=MAX_FEATURES,
    grown_max_features=MAX_GROWN_FEATURES,
    grow_unsampled=False,
    grown_max_share=MAX_GROWN_SHARE,
    input_normalizations=(GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION),
    documents=False,
)
_DOCUMENT_RULES = _KindRules(
    normalization=DOCUMENT_NORMALIZATION,
    max_features=MAX_DOCUMENT_FEATURES,
    grown_max_features=MAX_DOCUMENT_FEATURES,
    grow_unsampled=True,
    grown_max_share=None,  # measured on fortunes only, where accuracy grew up to the budget
    input_normalizations=(GLOBAL_NORMALIZATION,),  # documents are not input-normalised
    documents=True,
)


def _rules_for(spec: InputSpec) -> _KindRules:
    return _DOCUMENT_RULES if spec.is_documents else _DENSE_RULES


class _Search:
    """The current setting of the searched parameters, its cross-validated correctness, the
    path so far and what each stage did."""

    def __init__(
        self,
        scorer: _FoldScorer,
        start: dict[str, Any],
        min_gain_se: float,
        started: float,
        work: Callable[[dict[str, Any]], float],
    ):
        self.scorer = scorer
        self.current = start
        self.correct: np.ndarray | None = None
        self.min_gain_se = min_gain_se
        self.started = started
        self.work = work
        self.path: list[dict[str, Any]] = []
        self.stages: list[dict[str, Any]] = []

    @property
    def accuracy(self) -> float:
        return float("nan") if self.correct is None else float(self.correct.mean())

    def vary(self, stage: str, name: str, values: Sequence[Any], describe: Callable) -> bool:
        """:meth:`step` over the current setting with parameter ``name`` set to each of
        ``values``; ``describe`` names a value in the path."""
        return self.step(
            stage, [Candidate(describe(value), {**self.current, name: value}) for value in values]
        )

    def step(self, stage: str, candidates: list[Candidate]) -> bool:
        """Score ``candidates`` (the starting configuration first, if it is not scored yet);
        take the most accurate if it gains more than ``min_gain_se`` standard errors over the
        current one, else the cheapest to predict among those as accurate as it. Whether a
        step was taken."""
        seen = [self.current]
        unique = []
        for candidate in candidates:
            if candidate.params not in seen:
                seen.append(candidate.params)
                unique.append(candidate)
        record = {"stage": stage, "candidates": len(unique), "scored": 0, "raced_out": 0}
        self.stages.append(record)
        record.update(cut=False, taken=False)
        if self.correct is None and not self._score_start(stage):
            record["cut"] = True
            return False
        if not unique:
            return False
        if self.scorer.out_of_time:
            record["cut"] = True
            return False
        scored = self.scorer(stage, unique, self.correct)
        done = [(c, m) for c, m in zip(unique, scored.correct, strict=True) if m is not None]
        record.update(
            scored=len(done),
            raced_out=scored.raced_out,
            cut=len(done) + scored.raced_out < len(unique),
        )
        choice = self._choose(done)
        if choice is None:
            return False
        candidate, correct, gain, error, why = choice
        self.current = candidate.params
        self.correct = correct
        self._log(stage, candidate, correct, gain, error, why)
        record["taken"] = True
        return True

    def _score_start(self, stage: str) -> bool:
        """Score the starting configuration, the reference of the first stage's candidates."""
        start = Candidate("start", self.current)
        if self.scorer.out_of_time:
            return False
        correct = self.scorer(stage, [start], None).correct[0]
        if correct is None:
            return False
        self.correct = correct
        self._log(stage, start, correct, 0.0, 0.0, "start")
        return True

    def _choose(self, done):
        """The candidate to take among ``done`` (candidate, correctness) pairs, or None."""
        taken = take(
            self.correct,
            self.work(self.current),
            [(correct, self.work(candidate.params)) for candidate, correct in done],
            self.min_gain_se,
        )
        if taken is None:
            return None
        index, gain, error, why = taken
        candidate, correct = done[index]
        return candidate, correct, gain, error, why

    def _log(self, stage, candidate, correct, gain, error, why) -> None:
        self.path.append(
            {
                "step": len(self.path) + 1,
                "stage": stage,
                "change": candidate.change,
                "similarity": candidate.params["similarity"],
                "cv_accuracy": float(correct.mean()),
                "gain": gain,
                "standard_error": error,
                "why": why,
                "candidates": self.stages[-1]["candidates"],
                "elapsed_s": round(time.monotonic() - self.started, 2),
            }
        )


# -- where the fold fits run ---------------------------------------------------------------


class _ThisMachine:
    """Fold fits in ``n_jobs`` joblib processes on this machine (one: in this process), each
    with its share of the cores."""

    def parallel(self, X, n_jobs: int) -> Parallel:
        return Parallel(n_jobs=n_jobs, return_as="generator_unordered")

    def threads(self, threads: int) -> int:
        return threads

    def cores(self, n_jobs: int, threads: int) -> int:
        return n_jobs * threads


class _OnCluster:
    """Fold fits as tasks on a Dask cluster's workers, through joblib's Dask backend: the
    searched items ``X`` are scattered to every worker once (each task carries a fold's
    positions and labels, which the backend swaps for the scattered copy), and each fit runs
    on one worker thread, with one numba thread (workers run a task per core)."""

    def __init__(self, client):
        self.client = client

    def parallel(self, X, n_jobs: int) -> Parallel:
        with parallel_config(backend="dask", client=self.client, scatter=[X]):
            return Parallel(n_jobs=-1, return_as="generator_unordered")

    def threads(self, threads: int) -> int:
        return 1

    def cores(self, n_jobs: int, threads: int) -> int:
        return sum(self.client.nthreads().values())


# -- the wrapper ---------------------------------------------------------------------------


class ForwardSelectionCV(MetaEstimatorMixin, ClassifierMixin, BaseEstimator):
    """Choose the configuration of a BE-SVM by forward selection, cross-validated on the
    training set (see the module docstring), then fit it on the whole set.

    Parameters
    ----------
    estimator : BasisExpandingSVC
        The estimator whose :data:`SEARCHED_PARAMETERS` are chosen; its other parameters are
        kept. Cloned, never fitted itself.
    budget : float or None, default=None
        Seconds the search may take, counted as its fold fits' CPU time per core it uses (on
        an idle machine about as many seconds of wall time; on a loaded one the same search,
        in more wall time: :class:`SearchBudget`), and at most :data:`WALL_BACKSTOP` times as
        many seconds of wall time. It stops, keeping the best configuration found, when they
        are spent (the fits running then are finished or cancelled, so it may overrun by about
        one fold fit). None: it grows with the data, 40 s per 1,000 items cross-validated
        (:func:`budget_for`: 40 s up to 1,000 items, 120 s for a sample of 3,000).
    cv : int, default=3
        Stratified folds (fewer if the smallest class has fewer items; at least 2).
    repeats : int or None, default=None
        Shuffles of the folds; None: enough for about 1,000 validations, at most 3
        (:func:`repeats_for`: 3 below 334 items, 1 from 1,000).
    n_jobs : int or None, default=None
        Fold fits run side by side (joblib processes); None or negative: one per available
        core, except for searches of fewer than 100,000 numbers (items searched times
        features: wine, breast cancer, digits), which run in the calling process on one
        thread, where starting workers costs more than it saves. Each process gets
        ``cores // n_jobs`` numba threads and one BLAS thread.
    min_gain_se : float, default=1.0
        A step is taken when its gain in cross-validated accuracy exceeds this many standard
        errors of the paired difference (:func:`paired_gain`); a candidate cheaper to predict
        and at least as accurate wins without it.
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
        ran out before the start was scored).
    best_estimator_ : BasisExpandingSVC
        The chosen configuration fitted on the whole training set (with ``refit``).
    path_ : list of dict
        The start, then the steps taken, in order: ``step``, ``stage``, ``change`` (the
        candidate, in words), ``similarity``, ``cv_accuracy`` (a fraction), ``gain`` over the
        step before and its ``standard_error``, ``why`` (``start``, ``gain``, or ``cheaper,
        as accurate``), ``candidates`` (how many its stage offered), ``elapsed_s``. Plain
        JSON, for the manifest. ``cv_accuracy`` never decreases along it.
    stages_ : list of dict
        Every stage run, in order: ``stage``, ``candidates``, ``scored`` (on every fold),
        ``raced_out``, ``cut`` (the budget ended it before its candidates were scored) and
        ``taken``.
    budget_s_ : float
        The budget the search ran under.
    stopped_ : str
        Why the search ended.
    seconds_ : float
        The search's wall time (the refit not counted).
    cpu_seconds_ : float
        Its fold fits' CPU time, all cores together (what the budget counts, per core).
    n_fits_ : int
        Fold fits run.
    n_splits_ : int
    n_repeats_ : int
    n_items_ : int
        Training items the search cross-validated on (a sample when the set is larger than
        ``max_items``).
    C_path_ : list of dict
        Sharded data only: the distributed fits along the path of C on every shard, in
        increasing C: ``C``, ``held_out_accuracy`` (on a tenth of every shard's items, held
        out), ``newton_steps``; ``best_params_["C"]`` is the best of them.
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
        "budget": [Interval(Real, 0, None, closed="neither"), None],
        "cv": [Interval(Integral, 2, None, closed="left")],
        "repeats": [Interval(Integral, 1, None, closed="left"), None],
        "n_jobs": [Integral, None],
        "min_gain_se": [Interval(Real, 0, None, closed="left")],
        "max_items": [Interval(Integral, 2, None, closed="left")],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "refit": ["boolean"],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        estimator,
        *,
        budget=None,
        cv=3,
        repeats=None,
        n_jobs=None,
        min_gain_se=DEFAULT_MIN_GAIN_SE,
        max_items=MAX_SEARCH_ITEMS,
        random_state=0,
        refit=True,
        verbose=False,
    ):
        self.estimator = estimator
        self.budget = budget
        self.cv = cv
        self.repeats = repeats
        self.n_jobs = n_jobs
        self.min_gain_se = min_gain_se
        self.max_items = max_items
        self.random_state = random_state
        self.refit = refit
        self.verbose = verbose

    def fit(self, X, y=None):
        """Select a configuration on (X, y) and, with ``refit``, fit it on all of (X, y).

        On a Dask cluster (the wrapped estimator's ``cluster``, or an enclosing ``with
        distributed.Client(...)``) the fold fits are tasks on its workers, through joblib's
        Dask backend: the searched items are scattered to every worker once, each task carries
        a fold's positions. The refit is then the distributed fit
        (:mod:`training.distributed_fit`). Sharded data, which no process loads whole, is
        searched on a stratified sample of ``max_items`` items drawn from its shards
        (:func:`training.distributed_fit.draw_sample`), and the configuration chosen is fitted
        on every shard. Without a cluster nothing imports Dask.

        Parameters
        ----------
        X : array-like, sequence of str, or ShardedData
            Training inputs, as the wrapped estimator's ``fit`` takes them.
        y : array-like of shape (n_samples,), or None with ShardedData

        Returns
        -------
        self : ForwardSelectionCV

        Raises
        ------
        ValueError
            Fewer than two classes, inputs the estimator refuses, or labels given with
            sharded data.
        """
        self._validate_params()
        cluster = self.estimator.get_params().get("cluster")
        sharded = isinstance(X, ShardedData)
        if sharded and y is not None:
            raise ValueError("sharded data holds its labels: pass no y")
        if cluster is None and enclosing_client() is None and not sharded:
            self._search(_ThisMachine(), X, y)
            if self.refit:
                self._refit(X, y)
            return self
        with client_for(cluster) as client:
            if client is None:  # sharded data and no cluster: read here, fit the folds here
                with in_process_client() as reader:
                    return self._fit_shards(_ThisMachine(), reader, X)
            site = _OnCluster(client)
            if sharded:
                return self._fit_shards(site, client, X)
            self._search(site, X, y)
            if self.refit:
                self._refit(X, y, client)
        return self

    def _fit_shards(self, site, client, data: ShardedData):
        """Search a stratified sample of the shards, then fit the choice on every shard."""
        X, y, class_counts = draw_sample(client, data, self.max_items, self.random_state)
        # The bof transform learns its visual words from every item in one process: a choice
        # the fit on the shards could not make.
        self._search(site, X, y, class_counts, one_process_transforms=False)
        if self.refit:
            self._refit(data, None, client, C_grid=_C_path(self.best_params_["C"]))
        return self

    def _refit(self, X, y, client=None, C_grid: Sequence[float] | None = None) -> None:
        """``best_estimator_``: the chosen configuration fitted on all of (X, y), on
        ``client``'s cluster where one is given (the distributed fit; one process for what
        only one process can learn, such as documents' vocabulary).

        With ``C_grid`` (sharded data), C is chosen again on every shard first: the distributed
        fit along that warm-started path, each C scored on items held out of every shard
        (``C_path_``); the model is fitted at the best, which ``best_params_`` then names."""
        model = clone(self.estimator).set_params(**self.best_params_)
        if client is None:
            model.fit(X, y)
        else:
            # The fit finds the cluster as the enclosing client instead of connecting again.
            cluster = model.get_params()["cluster"]
            with client.as_current():
                model.set_params(cluster=None)
                if C_grid is None:
                    model.fit(X, y)
                else:
                    fit_on_cluster(model, X, y, C_grid=C_grid)
            model.set_params(cluster=cluster)
        if C_grid is not None:
            self.C_path_ = model.C_path_
            self.best_params_ = {**self.best_params_, "C": model.C}
        self.best_estimator_ = model
        self.classes_ = model.classes_

    def _search(
        self, site, X, y, class_counts=None, *, one_process_transforms: bool = True
    ) -> None:
        """The forward selection on (X, y), its fold fits where ``site`` runs them; the basis
        grows for a set of ``class_counts`` items per class (default: y's own, X being the
        whole set; else X is a sample of it)."""
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
        if class_counts is None:
            class_counts = np.unique(labels, return_counts=True)[1]
        searched = min(len(labels), self.max_items)
        jobs, threads = _jobs(
            self.n_jobs, searched * (1 if spec.is_documents else spec.n_features), spec
        )
        repeats = repeats_for(searched) if self.repeats is None else self.repeats
        X_searched, folds, n_items = _folds(
            X_checked, labels, self.cv, repeats, self.random_state, self.max_items
        )
        self.budget_s_ = budget_for(n_items) if self.budget is None else float(self.budget)
        rules = _rules_for(spec)
        n_classes = len(np.unique(labels))
        # Every fold's training part holds about as many items of each class as the first's.
        fold_largest = int(np.unique(folds[0].y_train, return_counts=True)[1].max())
        transforms = [
            t
            for t in transform_candidates(spec)
            if one_process_transforms or not _learns_from_items(t)
        ]
        start = {
            "similarity": START_MEASURE if not spec.is_documents else "linear",
            "input_transform": transforms[0],
            "input_normalization": GLOBAL_NORMALIZATION,
            "basis_per_class": START_BASIS_PER_CLASS,
            "basis_strategy": "index",
            "normalization": rules.normalization,
            "C": 1.0,
        }
        # The folds read flat rows: the wrapped estimator must read them as the whole set's.
        # Their bases are drawn with the selection's seed where the estimator has none, so that
        # a seed gives one path. Each fold fit runs in one process (on a cluster, one worker's).
        base = clone(self.estimator).set_params(
            input_shape=None if spec.is_documents else str(spec),
            random_state=(
                self.random_state
                if self.estimator.get_params()["random_state"] is None
                else self.estimator.get_params()["random_state"]
            ),
        )
        if "cluster" in base.get_params():
            base.set_params(cluster=None)
        budget = SearchBudget(self.budget_s_, site.cores(jobs, threads))
        scorer = _FoldScorer(
            base,
            X_searched,
            folds,
            n_items,
            site.parallel(X_searched, jobs),
            site.threads(threads),
            budget,
            self.verbose,
        )
        search = _Search(
            scorer,
            start,
            self.min_gain_se,
            started,
            lambda params: prediction_work(params, spec, n_classes),
        )
        _run_stages(search, spec, n_classes, fold_largest, rules, transforms)
        self.best_params_ = self._final_params(
            search.current, fold_largest, len(folds[0].y_train), class_counts, n_items, rules
        )
        self.best_score_ = search.accuracy
        self.path_ = search.path
        self.stages_ = search.stages
        self.stopped_ = budget.describe() if scorer.out_of_time else "every stage done"
        self.seconds_ = time.monotonic() - started
        self.cpu_seconds_ = budget.cpu_seconds
        self.n_fits_ = scorer.fits
        self.n_splits_ = len(folds) // repeats
        self.n_repeats_ = repeats
        self.n_items_ = n_items
        self.searched_basis_per_class_ = search.current["basis_per_class"]
        self.documents_ = spec.is_documents
        self.classes_ = np.unique(labels)

    @staticmethod
    def _final_params(
        chosen, fold_largest: int, fold_items: int, class_counts, n_items: int, rules
    ) -> dict[str, Any]:
        """The chosen parameters with the basis for the whole split (``class_counts`` items
        of each class): grown in proportion where the rules say so (documents, a sampled
        search), every item of each class when the folds chose every item of theirs, else as
        the folds chose it."""
        chosen = dict(chosen)
        counts = np.asarray(class_counts)
        n_train = int(counts.sum())
        weight = basis_weight(chosen["similarity"])
        if rules.grows_basis(n_items, n_train):
            chosen["basis_per_class"] = grown_basis_per_class(
                chosen["basis_per_class"],
                fold_items,
                n_train,
                int(counts.max()),
                weight,
                len(counts),
                rules.grown_features(n_train),
            )
        elif chosen["basis_per_class"] >= fold_largest:
            cap = basis_cap(chosen["similarity"], len(counts), rules.max_features)
            chosen["basis_per_class"] = max(chosen["basis_per_class"], min(int(counts.max()), cap))
        return chosen

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
            "method": "forward selection, stratified k-fold cross-validation on the training "
            "split, steps taken on a gain above min_gain_se standard errors of the paired "
            "difference",
            "folds": self.n_splits_,
            "repeats": self.n_repeats_,
            "n_items": self.n_items_,
            "budget_s": self.budget_s_,
            "budget_rule": (
                f"{BUDGET_S_PER_1000_ITEMS:g} s per 1,000 items searched"
                if self.budget is None
                else "given"
            ),
            "budget_clock": "the fold fits' CPU seconds per core used; at most "
            f"{WALL_BACKSTOP:g} times the budget in wall time",
            "min_gain_se": float(self.min_gain_se),
            "seconds": round(self.seconds_, 2),
            "cpu_seconds": round(self.cpu_seconds_, 2),
            "fits": self.n_fits_,
            "stopped": self.stopped_,
            # NaN is no JSON: the budget ran out before the start was scored.
            "cv_accuracy": None if np.isnan(self.best_score_) else self.best_score_,
            "chosen": dict(self.best_params_),
            "searched_basis_per_class": self.searched_basis_per_class_,
            "path": self.path_,
            "stages": self.stages_,
            **({"C_path_on_shards": self.C_path_} if hasattr(self, "C_path_") else {}),
        }

    def describe(self) -> str:
        """The path as lines of text, one per step, then the choice and the stages cut."""
        check_is_fitted(self, "best_params_")
        lines = [
            f"  {entry['step']}. {entry['stage']:<14} {entry['change']:<52} "
            f"CV {100 * entry['cv_accuracy']:.2f}%"
            + (
                ""
                if entry["why"] == "start"
                else f" ({100 * entry['gain']:+.2f} ± {100 * entry['standard_error']:.2f}"
                + (", cheaper)" if entry["why"] != "gain" else ")")
            )
            for entry in self.path_
        ]
        chosen = self.best_params_
        searched = self.searched_basis_per_class_
        grown = (
            f", grown from {searched} on the folds" if searched != chosen["basis_per_class"] else ""
        )
        lines.append(
            f"  chosen: {chosen['similarity']} on {chosen['input_transform'] or 'the inputs'}"
            + ("" if self.documents_ else f", {chosen['input_normalization']} input normalisation")
            + f", {chosen['basis_per_class']} bases per class ({chosen['basis_strategy']}{grown}),"
            f" C = {chosen['C']:g}; {self.stopped_}; {self.n_fits_} fold fits"
            f" ({self.n_splits_} folds x {self.n_repeats_}) in {self.seconds_:.1f} s"
        )
        cut = [s for s in self.stages_ if s["cut"]]
        if cut:
            lines.append(
                "  cut by the budget: "
                + ", ".join(
                    f"{s['stage']} ({s['scored']} of {s['candidates']} scored)" for s in cut
                )
            )
        if hasattr(self, "C_path_"):
            lines.append(
                "  C on every shard (held-out accuracy): "
                + ", ".join(f"{e['C']:g} {100 * e['held_out_accuracy']:.2f}%" for e in self.C_path_)
            )
        return "\n".join(lines)


# -- the stages ----------------------------------------------------------------------------


def _jobs(n_jobs: int | None, numbers: int, spec: InputSpec) -> tuple[int, int]:
    """Processes for the fold fits and numba threads for each: ``n_jobs`` as given sharing
    the cores, or by default one process per core, except for searches of fewer than
    :data:`PROCESSES_FROM_NUMBERS` numbers (documents never count as few), which run in the
    calling process on one thread (their fits are too small for a parallel region to pay: on 2
    loaded cores a wine fit took 0.47 s with two threads, 0.31 s with one)."""
    cpus = available_cpus()
    if n_jobs is not None and n_jobs > 0:
        return int(n_jobs), max(1, cpus // int(n_jobs))
    if not spec.is_documents and numbers < PROCESSES_FROM_NUMBERS:
        return 1, 1
    return cpus, 1


def _with_measure(params: dict[str, Any], similarity: str, n_classes: int, max_features: int):
    """``params`` with ``similarity``, the basis shrunk to fit the feature budget; None if the
    measures could not have :data:`MIN_BASIS_PER_CLASS` items a class."""
    cap = basis_cap(similarity, n_classes, max_features)
    if cap < MIN_BASIS_PER_CLASS:
        return None
    return {
        **params,
        "similarity": similarity,
        "basis_per_class": min(params["basis_per_class"], cap),
    }


def _scaled(measure: str) -> tuple[Scale, float] | None:
    """The measure's :class:`Scale` and its value, if it has one."""
    spec = parse_spec(measure)
    scale = SCALES.get(spec.name)
    if scale is None:
        return None
    return scale, dict(spec.params)[scale.parameter]


def _coarse_candidates(search: _Search, spec: InputSpec, rules: _KindRules, n_classes: int):
    """Every measure at the coarse grid of its scale, times the coarse grid of C, under each
    input normalisation; the most promising first (the middle of each grid, the current
    normalisation), so that a stage the budget cuts has scored those."""
    current = search.current
    ranked = []
    normalizations = rules.input_normalizations
    if _learns_from_items(current["input_transform"]):
        normalizations = (GLOBAL_NORMALIZATION,)  # word counts are not normalised
    for n, normalization in enumerate(normalizations):
        if normalization == current["input_normalization"]:
            n = -1
        for measure in measure_candidates(spec, current["input_transform"]):
            params = _with_measure(current, measure, n_classes, rules.max_features)
            if params is None:
                continue
            Cs = rules.coarse_C(measure)
            for c, C in enumerate(Cs):
                where = "" if rules.documents else f", {normalization}"
                priority = _rung(measure) + abs(c - len(Cs) // 2) + 0.5 * (n >= 0)
                candidate = Candidate(
                    f"{measure}, C = {C:g}{where}",
                    {**params, "C": C, "input_normalization": normalization},
                )
                ranked.append((priority, len(ranked), candidate))
    return [candidate for *_, candidate in sorted(ranked, key=lambda r: r[:2])]


def _rung(measure: str) -> float:
    """How far a measure is from the middle of the coarse grids: 0 for the middle width, one
    more a step away; linear 0.5, measures without a scale 2."""
    scaled = _scaled(measure)
    if scaled is None:
        return 0.5 if parse_spec(measure).kind.linear_in_input else 2.0
    scale, value = scaled
    coarse = list(scale.coarse)
    middle = coarse[len(coarse) // 2]
    return abs(coarse.index(value) - coarse.index(middle)) if value in coarse else 2.0


def _refinements(search: _Search, sizes: list[int]) -> list[Candidate]:
    """The current width and C one step either way, together, and the basis one size either
    way on ``sizes``."""
    current = search.current
    chosen = measures(current["similarity"])
    scaled = next(((i, s) for i, m in enumerate(chosen) if (s := _scaled(m))), None)
    widths: list[tuple[str, str]] = [("", current["similarity"])]
    if scaled is not None:
        i, (scale, value) = scaled
        for other in scale.neighbours(value):
            changed = [*chosen[:i], scale.measure(other), *chosen[i + 1 :]]
            widths.append((f"{scale.parameter} {other:g}", " + ".join(changed)))
    Cs = [("", current["C"])] + [(f"C = {C:g}", C) for C in _ladder_neighbours(current["C"])]
    candidates = [
        Candidate(", ".join(x for x in (width, c) if x), {**current, "similarity": s, "C": C})
        for width, s in widths
        for c, C in Cs
        if width or c
    ]
    size = current["basis_per_class"]
    below = [s for s in sizes if s < size]
    above = [s for s in sizes if s > size]
    for other in below[-1:] + above[:1]:
        candidates.append(
            Candidate(f"{other} bases per class", {**current, "basis_per_class": other})
        )
    return candidates


def _C_path(C: float) -> list[float]:
    """``C`` and :data:`SHARD_C_STEPS` values of :data:`C_LADDER` either way of it."""
    return sorted({float(C), *_ladder_around(C, SHARD_C_STEPS)})


def _ladder_neighbours(C: float) -> list[float]:
    return _ladder_around(C, 1)


def _ladder_around(C: float, steps: int) -> list[float]:
    """The values of :data:`C_LADDER` up to ``steps`` rungs either way of the one nearest
    ``C`` (on a log scale), in increasing order."""
    at = int(np.argmin(np.abs(np.log(C_LADDER) - math.log(C))))
    low, high = max(0, at - steps), min(len(C_LADDER), at + steps + 1)
    return [*C_LADDER[low:at], *C_LADDER[at + 1 : high]]


def _added_measures(current: str, spec: InputSpec, transform: str | None) -> list[str]:
    """Measures to join the chosen ones: every candidate measure at its coarse scale, and the
    chosen scaled measures two steps either way (a second rbf of another width)."""
    chosen = measures(current)
    offered = list(measure_candidates(spec, transform))
    for measure in chosen:
        scaled = _scaled(measure)
        if scaled is not None:
            scale, value = scaled
            offered += [scale.measure(other) for other in scale.steps(value, 2)]
    names = {parse_spec(m).measure_name for m in chosen}
    unique = []
    for measure in offered:
        name = parse_spec(measure).measure_name
        if name not in names:
            names.add(name)
            unique.append(measure)
    return unique


def _add_measures(search: _Search, spec: InputSpec, n_classes: int, rules: _KindRules) -> None:
    """Add the measure that helps most, while one helps; the basis shrinks if the measures
    would otherwise exceed the feature budget."""
    while len(measures(search.current["similarity"])) < MAX_MEASURES:
        current = search.current
        candidates = []
        for measure in _added_measures(current["similarity"], spec, current["input_transform"]):
            params = _with_measure(
                current, f"{current['similarity']} + {measure}", n_classes, rules.max_features
            )
            if params is None:
                continue
            shrunk = params["basis_per_class"] < current["basis_per_class"]
            candidates.append(
                Candidate(
                    f"+ {measure}"
                    + (f" ({params['basis_per_class']} bases per class)" if shrunk else ""),
                    params,
                )
            )
        if not search.step("add measure", candidates):
            return


def _run_stages(
    search: _Search,
    spec: InputSpec,
    n_classes: int,
    largest: int,
    rules: _KindRules,
    transforms: list[str | None],
) -> None:
    """The stages of the module docstring, in order, on ``search``; ``largest`` is the
    largest class of a fold's training part, ``transforms`` the input transforms to try."""
    if len(transforms) > 1:
        search.step(
            "inputs",
            [
                Candidate(
                    f"{normalization} normalisation, {transform}",
                    {
                        **search.current,
                        "input_normalization": normalization,
                        "input_transform": transform,
                    },
                )
                for transform in transforms
                for normalization in rules.input_normalizations
                # word counts are not normalised: one candidate for bof
                if not _learns_from_items(transform) or normalization == GLOBAL_NORMALIZATION
            ],
        )
    search.step("widths and C", _coarse_candidates(search, spec, rules, n_classes))

    def sizes() -> list[int]:
        weight = basis_weight(search.current["similarity"])
        return basis_size_candidates(largest, weight, n_classes, rules.max_features)

    search.vary("basis size", "basis_per_class", sizes(), lambda size: f"{size} bases per class")
    for _ in range(MAX_REFINEMENTS):
        if not search.step("refine", _refinements(search, sizes())):
            break
    _add_measures(search, spec, n_classes, rules)
    search.vary("C", "C", _ladder_neighbours(search.current["C"]), lambda C: f"C = {C:g}")
    search.vary(
        "basis strategy", "basis_strategy", STRATEGIES, lambda strategy: f"{strategy} basis"
    )


__all__ = [
    "BUDGET_S_PER_1000_ITEMS",
    "DEFAULT_BUDGET_S",
    "SCALES",
    "SEARCHED_PARAMETERS",
    "Candidate",
    "ForwardSelectionCV",
    "Scale",
    "SearchBudget",
    "basis_size_candidates",
    "basis_weight",
    "budget_for",
    "grown_basis_per_class",
    "measure_candidates",
    "paired_gain",
    "prediction_work",
    "repeats_for",
    "take",
    "transform_candidates",
]
