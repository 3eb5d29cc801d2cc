"""Forward selection of a :class:`~training.estimator.estimator.BasisExpandingSVC`'s
configuration by cross-validation: :class:`ForwardSelectionCV`, a wrapper like scikit-learn's
``GridSearchCV``.

It clones the estimator it wraps, scores candidate settings of its parameters by stratified
k-fold cross-validation on the training set it is given (:mod:`training.selection.folds`), and
improves one configuration step by step through the stages of :mod:`training.selection.stages`,
taking a step only on a real gain (:mod:`training.selection.state`). Everything stops when the
time budget is spent (:mod:`training.selection.budget`; by default it grows with the items
cross-validated): the record says which stage was cut. The path (each step taken, its
cross-validated accuracy, gain and standard error) is kept in ``path_``, every stage in
``stages_``, as plain data for the manifest (:meth:`ForwardSelectionCV.record`).

The parameters it chooses are :data:`~training.selection.space.SELECTED_PARAMETERS`; every other
parameter of the wrapped estimator (``max_iter``, ``min_df``, ``stop_words``, ``input_shape``,
...) is the user's, in the folds as in the final model. Candidates and folds are scored in
parallel (:mod:`training.selection.sites`): ``n_jobs`` joblib processes, or tasks on a Dask
cluster, and sharded data is selected on a stratified sample of its shards
(:meth:`ForwardSelectionCV.fit`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone

# scikit-learn has no public form of its parameter constraints; its own estimators declare
# theirs with these, and the pinned version is checked by the estimator checks in the tests.
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from service.model import Predictor
from service.model.inputs.dense import GLOBAL_NORMALIZATION
from training.cluster.connection import client_for, enclosing_client, in_process_client
from training.cluster.rows import draw_sample
from training.cluster.shards import ShardedData
from training.estimator.cluster_fit import fit_on_cluster
from training.estimator.estimator import ArtifactMixin, BasisExpandingSVC, threads_for_n_jobs
from training.estimator.preparation import preparation_for
from training.selection.basis_ladder import climb_basis_ladder, describe_large_basis
from training.selection.budget import (
    BUDGET_S_PER_1000_ITEMS,
    WALL_BACKSTOP,
    SelectionBudget,
    budget_for,
)
from training.selection.folds import FoldScorer, make_folds, repeats_for
from training.selection.grown_basis import GROWN_WITHIN_MEMORY, split_basis
from training.selection.kernel_grid import describe_kernel_grid, search_kernel_grid
from training.selection.memory import (
    DEFAULT_BUDGET_RULE,
    default_memory_budget,
    describe_bytes,
)
from training.selection.sites import OnCluster, ThisMachine, fold_jobs
from training.selection.space import (
    START_BASIS_PER_CLASS,
    START_MEASURE,
    basis_weight,
    held_square_matrices,
    ladder_around,
    large_basis_candidates,
    learns_from_items,
    prediction_work,
    rules_for,
    transform_candidates,
)
from training.selection.stages import run_stages
from training.selection.state import (
    DEFAULT_MIN_GAIN_SE,
    DEFAULT_PREFERENCE,
    PREFERENCES,
    SelectionState,
)

# The selection cross-validates on at most this many training items (a stratified sample).
MAX_SELECTION_ITEMS = 3000

# Sharded data: the sample's C is chosen again on every shard, with this many steps of the
# ladder either way (a warm-started path of the distributed fit).
SHARD_C_STEPS = 2


class ForwardSelectionCV(ArtifactMixin, MetaEstimatorMixin, ClassifierMixin, BaseEstimator):
    """Choose the configuration of a BE-SVM by forward selection, cross-validated on the
    training set (see the module docstring), then fit it on the whole set.

    Parameters
    ----------
    estimator : BasisExpandingSVC or None, default=None
        The estimator whose selected parameters
        (:data:`~training.selection.space.SELECTED_PARAMETERS`) are chosen; its other
        parameters are kept. Cloned, never fitted itself. None: ``BasisExpandingSVC()``.
    budget : float or None, default=None
        Seconds the selection may take before it keeps the best configuration found, counted
        as its fold fits' CPU time per core (so that other processes' load does not cut it; at
        most 10 times as much wall time; it may overrun by about one fold fit); None: it grows
        with the data, 40 s per 1,000 training items cross-validated (40 s up to 1,000 items,
        120 s from 3,000, the most it samples). A selection on a sample then grows its basis
        along the ladder on the whole split, under a budget of its own (by default 3 s per
        1,000 items of the split for dense inputs, 40 s for documents, at least the
        selection's: ``ladder_budget_s_``; ``budget`` when given), and searches the large
        basis there under a budget of its own (``large_basis_budget_s_``: the selection's; on
        dense splits over 5,000 items, where it offers the kernel's own map first, the
        ladder's; ``budget`` when given); on splits of at most 5,000 dense items it then
        cross-validates the kernel SVM's grid on the whole split under another
        (``kernel_grid_``).
    cv : int, default=3
        Stratified folds (fewer if the smallest class has fewer items; at least 2).
    repeats : int or None, default=None
        Shuffles of the folds; None: enough for about 1,000 validations, at most 3
        (:func:`repeats_for`: 3 below 334 items, 1 from 1,000).
    n_jobs : int or None, default=None
        Fold fits run side by side (joblib processes); None or negative: one per available
        core, small selections too (the budget counts CPU seconds per core the fits use).
        Each process gets ``cores // n_jobs`` numba threads and one BLAS thread.
    min_gain_se : float, default=1.0
        A gain in cross-validated accuracy beyond this many standard errors of the paired
        difference (:func:`paired_gain`) is always taken; within it, ``prefer`` decides.
    prefer : {"cost", "accuracy"}, default="cost"
        What wins within the noise: ``cost`` keeps the current configuration unless a
        candidate is cheaper to predict and at least as accurate (smaller, faster models);
        ``accuracy`` takes the candidate with the better held-out score across the repeats (the
        cheaper to predict among equals), as a grid search does. Neither won on the held-back
        sets measured (docs/measurements/model-selection.md).
    max_items : int, default=MAX_SELECTION_ITEMS
        Larger training sets are cross-validated on a stratified sample of this many items.
    memory_budget : int or None, default=None
        Bytes the final fit's training features may take (:mod:`training.selection.memory`:
        n x F float64 numbers, the basis Gram matrix, and under nystroem its eigenvectors and
        projection): it bounds the
        basis grown for the whole split and the basis ladder's top rung. None: a quarter of the
        memory available when the selection starts (Linux's MemAvailable).
    random_state : int, default=0
        Seed of the folds and the sample.
    refit : bool, default=True
        Fit the chosen configuration on the whole training set (``best_estimator_``).
    verbose : bool, default=False
        A progress bar per stage on a terminal (never when stderr is not a tty).

    Attributes
    ----------
    best_params_ : dict
        The chosen :data:`SELECTED_PARAMETERS`, the basis grown to the whole set where the
        rules say so (along the validated ladder, ``ladder_``, where it runs; the kernel
        grid's choice, ``kernel_grid_``, may replace it).
    best_score_ : float
        Cross-validated accuracy of the configuration the folds chose (NaN if the budget ran
        out before the start was scored); where the steps on the whole split changed it, their
        accuracies are in ``ladder_`` and ``kernel_grid_["path"]``.
    best_estimator_ : BasisExpandingSVC
        The chosen configuration fitted on the whole training set (with ``refit``).
    path_ : list of dict
        The start, then the steps taken, in order: ``step``, ``stage``, ``change`` (the
        candidate, in words), ``similarity``, ``cv_accuracy`` (a fraction), ``gain`` over the
        step before and its ``standard_error``, ``why`` (``start``, ``gain``, ``cheaper, as
        accurate`` or ``more accurate, within the noise``), ``candidates`` (how many its stage
        offered), ``elapsed_s``. Plain JSON, for the manifest. ``cv_accuracy`` never decreases
        along it.
    stages_ : list of dict
        Every stage run, in order: ``stage``, ``candidates``, ``scored`` (on every fold),
        ``raced_out``, ``cut`` (the budget ended it before its candidates were scored) and
        ``taken``.
    budget_s_ : float
        The budget the selection ran under.
    ladder_budget_s_ : float or None
        The basis ladder's budget (:meth:`~training.selection.space.KindRules.ladder_budget`,
        or ``budget`` when given); None where no ladder ran.
    large_basis_budget_s_ : float or None
        The budget of the large-basis search at the ladder's top
        (:meth:`~training.selection.space.KindRules.large_basis_budget`, or ``budget`` when
        given); None where no ladder ran.
    stopped_ : str
        Why the selection ended.
    seconds_ : float
        The selection's wall time with the ladder's and the kernel grid's (not the refit).
    cpu_seconds_ : float
        Its fold fits' CPU time, all cores together.
    budget_used_s_ : float
        What the budget counted: ``cpu_seconds_`` per core of the fold fits (``budget_s_``'s unit).
    n_fits_ : int
        Fold fits run.
    n_splits_ : int
    n_repeats_ : int
    n_items_ : int
        Training items the selection cross-validated on (a sample when the set is larger than
        ``max_items``).
    C_path_ : list of dict
        Sharded data only: the distributed fits along the path of C on every shard, in
        increasing C: ``C``, ``held_out_accuracy`` (on a tenth of every shard's items, held
        out), ``newton_steps``; ``best_params_["C"]`` is the best of them.
    searched_basis_per_class_ : int
        The basis size per class chosen on the folds, before it grew.
    memory_budget_ : int
        The memory budget the basis was sized within, in bytes.
    grown_bound_ : str or None
        What bounded the basis grown for the whole split (the ladder's first rung): ``in
        proportion to the items``, ``every item of the largest class``, ``the memory budget``,
        ``the share of the items`` or ``the size the folds chose``; None when it did not grow
        in proportion (the folds' size, or every item of each class within the kind's feature
        cap; ``the memory budget`` where that bounded a basis that did not grow).
    ladder_ : dict or None
        Inputs selected on a sample of a split held in this process: the basis ladder on
        the whole split (:mod:`training.selection.basis_ladder`), its ``path`` of rungs
        (``basis_per_class``, ``n_basis``, ``held_out_accuracy``, ``gain``,
        ``standard_error``, ``taken``, ``seconds``, ``cost_s``), why it ``stopped``, its
        hold-out and memory bound, its ``budget_s`` and ``budget_used_s`` (the rungs' CPU
        seconds per core), and its ``large_basis`` search with a budget of its own; the record's
        ``basis_ladder``. None elsewhere.
    kernel_grid_ : dict or None
        Where the ladder ran on at most 5,000 dense items: the kernel SVM's grid against its
        choice (:mod:`training.selection.kernel_grid`): ``path``, ``stages``, ``chosen``
        (None: kept), why it ``stopped``, its ``budget_s`` and ``budget_used_s``; the record's
        ``kernel_grid``. None elsewhere.
    documents_ : bool
        Whether the inputs are documents (no input normalisation to choose).
    classes_ : ndarray of shape (n_classes,)
    n_features_in_ : int
        Numbers in one flattened dense input (not set for documents).
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "estimator": [HasMethods(["fit", "predict", "set_params"]), None],
        "budget": [Interval(Real, 0, None, closed="neither"), None],
        "cv": [Interval(Integral, 2, None, closed="left")],
        "repeats": [Interval(Integral, 1, None, closed="left"), None],
        "n_jobs": [Integral, None],
        "min_gain_se": [Interval(Real, 0, None, closed="left")],
        "prefer": [StrOptions(set(PREFERENCES))],
        "max_items": [Interval(Integral, 2, None, closed="left")],
        "memory_budget": [Interval(Integral, 1, None, closed="left"), None],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "refit": ["boolean"],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        estimator=None,
        *,
        budget=None,
        cv=3,
        repeats=None,
        n_jobs=None,
        min_gain_se=DEFAULT_MIN_GAIN_SE,
        prefer=DEFAULT_PREFERENCE,
        max_items=MAX_SELECTION_ITEMS,
        memory_budget=None,
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
        self.prefer = prefer
        self.max_items = max_items
        self.memory_budget = memory_budget
        self.random_state = random_state
        self.refit = refit
        self.verbose = verbose

    def _estimator(self):
        return BasisExpandingSVC() if self.estimator is None else self.estimator

    def fit(self, X, y=None):
        """Select a configuration on (X, y) and, with ``refit``, fit it on all of (X, y).

        On a Dask cluster (the wrapped estimator's ``cluster``, or an enclosing ``with
        distributed.Client(...)``) the fold fits are tasks on its workers, through joblib's
        Dask backend: the items cross-validated are scattered to every worker once, each task
        carries a fold's positions. The refit is then the distributed fit
        (:mod:`training.estimator.cluster_fit`). Sharded data, which no process loads whole, is
        selected on a stratified sample of ``max_items`` items drawn from its shards
        (:func:`training.cluster.rows.draw_sample`), and the configuration chosen is fitted on
        every shard. Without a cluster nothing imports Dask.

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
        cluster = self._estimator().get_params().get("cluster")
        sharded = isinstance(X, ShardedData)
        if sharded and y is not None:
            raise ValueError("sharded data holds its labels: pass no y")
        if cluster is None and enclosing_client() is None and not sharded:
            self._select(ThisMachine(), X, y)
            if self.refit:
                self._refit(X, y)
            return self
        with client_for(cluster) as client:
            if client is None:  # sharded data and no cluster: read here, fit the folds here
                with in_process_client() as reader:
                    return self._fit_shards(ThisMachine(), reader, X)
            site = OnCluster(client)
            if sharded:
                return self._fit_shards(site, client, X)
            self._select(site, X, y)
            if self.refit:
                self._refit(X, y, client)
        return self

    def _fit_shards(self, site, client, data: ShardedData):
        """Select on a stratified sample of the shards, then fit the choice on every shard."""
        X, y, class_counts = draw_sample(client, data, self.max_items, self.random_state)
        # The bof transform learns its visual words from every item in one process: a choice
        # the fit on the shards could not make.
        self._select(site, X, y, class_counts, one_process_transforms=False)
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
        model = clone(self._estimator()).set_params(**self.best_params_)
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

    def _select(
        self, site, X, y, class_counts=None, *, one_process_transforms: bool = True
    ) -> None:
        """The forward selection on (X, y), its fold fits where ``site`` runs them; the basis
        grows for a set of ``class_counts`` items per class (default: y's own, X being the
        whole set; else X is a sample of it)."""
        started = time.monotonic()
        self.memory_budget_ = (
            default_memory_budget() if self.memory_budget is None else int(self.memory_budget)
        )
        preparation = preparation_for(X, self._estimator())
        probe = clone(self._estimator())
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
        whole_split = class_counts is None
        if whole_split:
            class_counts = np.unique(labels, return_counts=True)[1]
        n_validated = min(len(labels), self.max_items)
        jobs, threads = fold_jobs(self.n_jobs)
        repeats = repeats_for(n_validated) if self.repeats is None else self.repeats
        X_folds, folds, n_items = make_folds(
            X_checked, labels, self.cv, repeats, self.random_state, self.max_items
        )
        self.budget_s_ = budget_for(n_items) if self.budget is None else float(self.budget)
        rules = rules_for(spec)
        n_classes = len(np.unique(labels))
        # Every fold's training part holds about as many items of each class as the first's.
        fold_counts = np.unique(folds[0].y_train, return_counts=True)[1]
        fold_largest = int(fold_counts.max())
        transforms = [
            t
            for t in transform_candidates(spec)
            if one_process_transforms or not learns_from_items(t)
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
        base = clone(self._estimator()).set_params(
            input_shape=None if spec.is_documents else str(spec),
            random_state=(
                self.random_state
                if self._estimator().get_params()["random_state"] is None
                else self._estimator().get_params()["random_state"]
            ),
        )
        if "cluster" in base.get_params():
            base.set_params(cluster=None)
        scorer = FoldScorer.at(
            site,
            base,
            X_folds,
            folds,
            n_items,
            jobs=jobs,
            threads=threads,
            budget_s=self.budget_s_,
            progress=self.verbose,
        )
        budget = scorer.budget
        state = SelectionState(
            scorer,
            start,
            self.min_gain_se,
            started,
            lambda params: prediction_work(params, spec, n_classes),
            self.prefer,
        )
        every_item = whole_split and n_items >= len(labels)  # the folds hold the whole split
        run_stages(state, spec, fold_counts, rules, transforms, every_item)
        self.searched_basis_per_class_ = state.current["basis_per_class"]
        self.best_params_, self.grown_bound_ = split_basis(
            state.current,
            fold_largest=fold_largest,
            fold_items=len(folds[0].y_train),
            class_counts=class_counts,
            n_items=n_items,
            rules=rules,
            memory_budget=self.memory_budget_,
            weight=basis_weight(state.current["similarity"]),
            squares=held_square_matrices(state.current),
        )
        self.ladder_ = self.kernel_grid_ = None
        self.ladder_budget_s_ = self.large_basis_budget_s_ = None
        if rules.climbs_ladder(n_items, len(labels), whole_split, isinstance(site, ThisMachine)):
            # From the grown size, the basis doubles while the hold-out of the whole split says
            # it pays, under a budget of its own that grows with the split, counted as the
            # selection's; then the large basis is searched at its top, under one as large as the
            # selection's, or the ladder's where it offers the kernel's map.
            cores = threads_for_n_jobs(base.get_params()["n_jobs"])  # the fits' cores
            self.ladder_budget_s_ = self._split_budget(rules.ladder_budget, len(labels))
            self.large_basis_budget_s_ = self._split_budget(rules.large_basis_budget, len(labels))
            ladder = climb_basis_ladder(
                base,
                self.best_params_,
                X_checked,
                labels,
                start=rules.first_rung(
                    self.best_params_["basis_per_class"], state.current["similarity"], class_counts
                ),
                weight=basis_weight(state.current["similarity"]),
                min_gain_se=self.min_gain_se,
                budget=SelectionBudget(self.ladder_budget_s_, cores),
                random_state=self.random_state,
                memory_budget=self.memory_budget_,
                large_basis=lambda per_class: large_basis_candidates(
                    self.best_params_,
                    rules,
                    per_class,
                    rules.large_basis_normalizations(len(labels)),
                    alone=True,
                ),
                large_basis_budget=SelectionBudget(self.large_basis_budget_s_, cores),
                work=lambda params: prediction_work(params, spec, n_classes),
                prefer=self.prefer,
                search_at_the_rung=rules.search_at_the_rung,
            )
            self.ladder_ = ladder.record()
            self.best_params_ = {
                **(ladder.params or self.best_params_),
                "basis_per_class": ladder.basis_per_class,
            }
            # Then the kernel SVM's grid against that choice on the whole split.
            if len(labels) <= rules.kernel_grid_max_items:
                grid = search_kernel_grid(
                    base,
                    self.best_params_,
                    X_checked,
                    labels,
                    rules=rules,
                    site=site,
                    jobs=jobs,
                    threads=threads,
                    budget_s=self.budget_s_,
                    memory_budget=self.memory_budget_,
                    min_gain_se=self.min_gain_se,
                    prefer=self.prefer,
                    work=lambda params: prediction_work(params, spec, n_classes),
                    random_state=self.random_state,
                    verbose=self.verbose,
                )
                self.kernel_grid_ = grid.record()
                self.best_params_ = grid.params or self.best_params_
        self.best_score_ = state.accuracy
        self.path_ = state.path
        self.stages_ = state.stages
        self.stopped_ = budget.describe() if scorer.out_of_time else "every stage done"
        self.seconds_ = time.monotonic() - started
        self.cpu_seconds_ = budget.cpu_seconds
        self.budget_used_s_ = budget.used_s
        self.n_fits_ = scorer.fits
        self.n_splits_ = len(folds) // repeats
        self.n_repeats_ = repeats
        self.n_items_ = n_items
        self.documents_ = spec.is_documents
        self.classes_ = np.unique(labels)

    def _split_budget(self, rule: Callable[[int, float], float], n_split_items: int) -> float:
        """A stage's budget on the whole split, in seconds: ``rule``'s default for the split's
        size when no ``budget`` was given, else the selection's (``budget`` bounds each)."""
        return rule(n_split_items, self.budget_s_) if self.budget is None else self.budget_s_

    def predict(self, X):
        """Labels predicted by ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)

    def decision_function(self, X):
        """Scores of ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def to_predictor(
        self,
        name: str = "model",
        record: dict[str, Any] | None = None,
        diagnostics: bool = True,
    ) -> Predictor:
        """``best_estimator_`` as the service holds it
        (:meth:`~training.estimator.estimator.BasisExpandingSVC.to_predictor`), its training
        record holding the selection's (:meth:`record`, and ``selection_seconds`` among the
        timings): what :meth:`save` writes.

        Parameters are as :meth:`save` takes them.

        Returns
        -------
        Predictor
        """
        check_is_fitted(self, "best_estimator_")
        timings = {**self.best_estimator_.timings_, "selection_seconds": self.seconds_}
        selection = {"selection": self.record(), "timings": timings}
        return self.best_estimator_.to_predictor(name, {**selection, **(record or {})}, diagnostics)

    def record(self) -> dict[str, Any]:
        """The selection as plain JSON data, for the manifest's ``training`` entry."""
        check_is_fitted(self, "best_params_")
        return {
            "method": "forward selection, stratified k-fold cross-validation on the training "
            "split, steps taken on a gain above min_gain_se standard errors of the paired "
            "difference, and within them as prefer says",
            "folds": self.n_splits_,
            "repeats": self.n_repeats_,
            "n_items": self.n_items_,
            "budget_s": self.budget_s_,
            "budget_rule": (
                f"{BUDGET_S_PER_1000_ITEMS:g} s per 1,000 items cross-validated"
                if self.budget is None
                else "given"
            ),
            "budget_clock": "the fold fits' CPU seconds per core used; at most "
            f"{WALL_BACKSTOP:g} times the budget in wall time",
            "min_gain_se": float(self.min_gain_se),
            "prefer": self.prefer,
            "seconds": round(self.seconds_, 2),
            "cpu_seconds": round(self.cpu_seconds_, 2),
            "budget_used_s": round(self.budget_used_s_, 2),
            "fits": self.n_fits_,
            "stopped": self.stopped_,
            # NaN is no JSON: the budget ran out before the start was scored.
            "cv_accuracy": None if np.isnan(self.best_score_) else self.best_score_,
            "chosen": dict(self.best_params_),
            "searched_basis_per_class": self.searched_basis_per_class_,
            "memory_budget": {
                "bytes": self.memory_budget_,
                "rule": (DEFAULT_BUDGET_RULE if self.memory_budget is None else "given"),
                "grown_basis_bound": self.grown_bound_,
            },
            "path": self.path_,
            "stages": self.stages_,
            **({"basis_ladder": self.ladder_} if getattr(self, "ladder_", None) else {}),
            **({"kernel_grid": self.kernel_grid_} if getattr(self, "kernel_grid_", None) else {}),
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
        if self.grown_bound_ == GROWN_WITHIN_MEMORY:
            grown += f", bounded by the memory budget of {describe_bytes(self.memory_budget_)}"
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
        if getattr(self, "ladder_", None):
            lines.append(
                "  basis ladder on the split (per class, held-out accuracy): "
                + ", ".join(
                    f"{e['basis_per_class']} {100 * e['held_out_accuracy']:.2f}%"
                    + ("" if e["taken"] else " (not taken)")
                    for e in self.ladder_["path"]
                )
                + f"; {self.ladder_['stopped']}"
            )
            large = self.ladder_.get("large_basis")
            if large:
                lines.append(f"  large basis on the split: {describe_large_basis(large)}")
        if getattr(self, "kernel_grid_", None):
            lines.append(f"  kernel grid on the split: {describe_kernel_grid(self.kernel_grid_)}")
        if hasattr(self, "C_path_"):
            lines.append(
                "  C on every shard (held-out accuracy): "
                + ", ".join(f"{e['C']:g} {100 * e['held_out_accuracy']:.2f}%" for e in self.C_path_)
            )
        return "\n".join(lines)


def _C_path(C: float) -> list[float]:
    """``C`` and :data:`SHARD_C_STEPS` values of :data:`C_LADDER` either way of it."""
    return sorted({float(C), *ladder_around(C, SHARD_C_STEPS)})
