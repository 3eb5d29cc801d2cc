"""A Basis Expanding SVM as a scikit-learn classifier, for notebooks and for the command line.

:class:`BasisExpandingSVC` is the one place a model is trained, and its parameters are the one
configuration: ``python -m training fit`` derives its model options from them and the artifact
records them (``training.config``). It reads dense inputs (vectors, or images as arrays of shape
(n, H, W) or (n, H, W, C)) and documents (a list of texts), and :meth:`BasisExpandingSVC.save`
writes the artifact the service loads, so a model trained in a notebook is served as it is::

    from training import BasisExpandingSVC

    model = BasisExpandingSVC(basis_per_class=25).fit(X_train, y_train)
    model.score(X_test, y_test)
    model.save("models/mine")  # python -m service.api serves it

Choosing the configuration by cross-validation (``--similarity auto`` on the command line) is
model selection, a wrapper around this estimator as ``GridSearchCV`` is around scikit-learn's:
:class:`training.selection.forward_selection.ForwardSelectionCV`, built where it is asked for
(:mod:`training.fitting`). The estimator never imports it, and ``fit`` refuses ``similarity=
"auto"`` with a message that names it.

Training steps, each using at most ``n_jobs`` cores: the input kind's preparation
(:mod:`training.estimator.preparation`: a transform and the input normalisation, or a vocabulary),
the basis expansion (:mod:`training.estimator.expansion`, numba drivers), then LinearSVC's
one-vs-rest problems (:mod:`training.estimator.solver`).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from joblib import effective_n_jobs
from sklearn.base import BaseEstimator, ClassifierMixin, clone

# scikit-learn has no public form of its parameter constraints; its own estimators declare
# theirs with these, and the pinned version is checked by the estimator checks in the tests.
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from service.model import Predictor, SpecError
from service.model.inputs.dense import INPUT_NORMALIZATIONS
from service.model.similarity import parse_specs
from service.model.threads import available_cpus, limit_threads
from training.cluster.connection import enclosing_client
from training.cluster.shards import ShardedData
from training.estimator.basis import BASIS_STRATEGIES
from training.estimator.cluster_fit import OneProcessOnly, fit_on_cluster
from training.estimator.diagnostics import eigen_diagnostics
from training.estimator.expansion import BasisExpansion
from training.estimator.preparation import (
    DEFAULT_MIN_DF,
    DEFAULT_STOP_WORDS,
    preparation_for,
    preparation_for_spec,
)
from training.estimator.solver import solve_one_vs_rest, training_design

# The value of ``similarity`` that asks for model selection: no measure, but the wrapper around
# the estimator that chooses them (training.selection.forward_selection.ForwardSelectionCV).
AUTO_SIMILARITY = "auto"
# Parameters that say how a fit runs, not what model it makes: the artifact's training record
# leaves them out.
RUN_PARAMETERS = ("n_jobs", "cluster", "verbose")
# Parameters of the SVM's solve alone: fits that differ only in them share their features
# (BasisExpandingSVC.expand, fit_expanded).
SOLVER_PARAMETERS = ("C", "max_iter")
# What validating the training inputs sets on the estimator (scikit-learn's validate_data).
_VALIDATED_ATTRIBUTES = ("n_features_in_", "feature_names_in_")


@dataclass(frozen=True, eq=False)
class ExpandedTrainingSet:
    """A training set expanded once, as the SVM's solver reads it: what
    :meth:`BasisExpandingSVC.expand` makes and :meth:`BasisExpandingSVC.fit_expanded` fits, as
    often as asked, at any of :data:`SOLVER_PARAMETERS` (the selection scores the C of one
    configuration on one expansion). Its arrays are read-only (fitted models share its parts).

    Attributes
    ----------
    parameters : dict
        The estimator's parameters that made it: every one but :data:`RUN_PARAMETERS` and
        :data:`SOLVER_PARAMETERS` (:meth:`BasisExpandingSVC.feature_parameters`).
    inputs : InputPreparation
        The input kind's preparation, fitted on the training inputs.
    expansion : BasisExpansion
        The fitted basis expansion.
    design, shift, columns
        The features as the solver trains on them, what it took from them and which columns
        it holds (:func:`~training.estimator.solver.training_design`).
    codes : ndarray of shape (n_samples,)
        Class index of each training item in ``classes``.
    classes : ndarray of shape (n_classes,)
    validated : dict
        What validating the inputs set on the estimator (``n_features_in_``).
    expand_seconds : float
    """

    parameters: dict[str, Any]
    inputs: Any
    expansion: BasisExpansion
    design: Any
    shift: np.ndarray
    columns: np.ndarray | None
    codes: np.ndarray
    classes: np.ndarray
    validated: dict[str, Any]
    expand_seconds: float


class ArtifactMixin:
    """What a fitted model gives the service: its :meth:`to_predictor`, written as an artifact
    by :meth:`save` (the estimator's own, or a selection's best with the selection's record)."""

    def save(
        self,
        path: str | os.PathLike,
        name: str | None = None,
        *,
        overwrite: bool = False,
        record: dict[str, Any] | None = None,
        diagnostics: bool = True,
    ) -> Path:
        """Write the model (:meth:`to_predictor`'s) as an artifact directory that ``python -m
        service.api`` serves.

        The directory is written beside its final place and renamed into it, as the command
        line does; the service answers with labels as text (``str`` of each of ``classes_``).

        Parameters
        ----------
        path : str or path-like
            The artifact directory.
        name : str, optional
            Model name the service routes by; default: the directory's name.
        overwrite : bool, default=False
            Replace an existing artifact.
        record : dict, optional
            More facts for the manifest's ``training`` entry (the data set, a test accuracy).
        diagnostics : bool, default=True
            Record NgRat and NgEng of every measure (an eigen-decomposition of each basis Gram
            matrix: slow for thousands of bases).

        Returns
        -------
        Path
            The artifact directory.

        Raises
        ------
        ArtifactError
            The directory exists and ``overwrite`` is False, or it cannot be written.
        """
        predictor = self.to_predictor(name or Path(path).name, record, diagnostics)
        return predictor.save(path, overwrite=overwrite)

    def to_predictor(self, name: str, record: dict[str, Any] | None, diagnostics: bool):
        raise NotImplementedError


class BasisExpandingSVC(ArtifactMixin, ClassifierMixin, BaseEstimator):
    """Basis Expanding SVM: similarities to a class-balanced basis, then a one-vs-rest linear SVM.

    The inputs are prepared by their kind (dense: an optional transform, then centred and divided
    by the mean norm; documents: word counts over a vocabulary fitted on the training texts),
    compared with a basis of ``basis_per_class`` training items per class under one or more
    similarity measures, normalised, and classified by one LinearSVC per class.

    Parameters
    ----------
    similarity : str, default="rbf(gamma=1)"
        Similarity measure(s) sharing the basis, joined with '+', e.g. 'rbf(gamma=0.5) +
        rigid(1)'. A measure may read an input transform of its own, 'hog(4): rbf + pixels:
        rbf' (each transform computed once, one basis). Documents read sensing0,
        sensing1(n=...), sensing2 or tf-idf linear and rbf. 'auto' (the command line's
        default) chooses the measures, the transform, the input normalisation, the basis size
        and strategy and C by cross-validation on the training set: forward selection,
        training.ForwardSelectionCV, which wraps this estimator (its fit refuses 'auto').
    input_transform : str or None, default=None
        Input transform the service applies to raw instances first: none, pixels,
        'hog(cell_size, orientations)' (images as a grid of HOG cells, e.g. 'hog(2, 9)'), or
        'bof(patch, step, words, levels, single)' (images as bags of visual words on a spatial
        pyramid, its words learned on the training images, e.g. 'bof(levels=2)': the sensing
        measures and tf-idf linear and rbf read it cell by cell); unset: pixels for images,
        none otherwise.
    basis_per_class : int, default=25
        Basis items taken from each class (all of a smaller class).
    basis_strategy : {"index", "random", "kmedoids"}, default="index"
        How the basis items of a class are chosen.
    normalization : str, default="auto"
        Normalisation of the similarities: besvm, none, zscore, nystroem(clip|flip|square), or
        auto (nystroem(square) when every measure is a kernel, besvm when one is indefinite).
    C : float, default=1.0
        The SVM's regularisation constant.
    max_iter : int, default=10000
        The SVM solver's iteration limit (Newton steps per class).
    input_normalization : {"global", "per-feature"}, default="global"
        Dense inputs: centred and divided by their mean norm (the paper's), or standardised per
        feature first (for features on different scales).
    input_shape : str or None, default=None
        How to read a flat row: 'grid(H, W, C)' for images given as (n, H * W * C), or
        'vector(d)'; unset: from the array (2-d: vectors, 3-d or 4-d: images).
    min_df : int, default=1
        Documents: words found in fewer training texts are left out of the vocabulary (1: every
        word, as scikit-learn's ``TfidfVectorizer``).
    stop_words : {"english"} or None, default=None
        Documents: leave out scikit-learn's English stop words, or keep them (none).
    n_jobs : int or None, default=-1
        Cores training may use: the numba, BLAS and OpenMP threads of the expansion, and the
        classes' SVMs trained side by side; -1: every core this process may run on.
    cluster : str or None, default=None
        Train on a Dask cluster (docs/using/cluster.md): ``"local:N"`` (N worker processes started
        for the fit) or a scheduler's address (``"tcp://host:8786"``); None: in this process,
        unless ``fit`` runs inside ``with distributed.Client(...)``, whose cluster it uses.
        On a cluster, each worker expands its own rows and the SVM's products are sums over
        them; the model is the one-process fit's (the basis drawn per class from the first
        items, as ``index`` does). ``fit`` also takes a :class:`training.cluster.shards.ShardedData`
        (``X``, without ``y``) there, which no process loads whole. Wrapped in a selection,
        its fold fits are tasks on the same cluster and the chosen configuration gets the
        distributed fit (sharded data: selected on a stratified sample of its shards).
        Documents and the ``bof`` transform learn from every item in one process: in memory,
        they train here with a warning; sharded, they are refused.
    random_state : int or None, default=0
        Seed of the random and kmedoids basis strategies.
    verbose : bool, default=False
        Progress bars while expanding the training set.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels, sorted, of the type given to ``fit``.
    n_features_in_ : int
        Numbers in one flattened dense input (not set for documents).
    input_spec_ : InputSpec
        What one input is: ``vector(d)``, ``grid(H, W, C)`` or ``text``.
    expansion_ : BasisExpansion
        The fitted basis expansion (its ``transform`` gives the features of prepared inputs).
    predictor_ : Predictor
        The model as the service holds it (classes as text): what :meth:`save` writes.
    n_iter_ : int
        The most Newton steps any class's problem took.
    train_accuracy_ : float
        Accuracy on the training set.
    timings_ : dict of str to float
        Seconds spent expanding (``expand_seconds``, with the solver's design; fitted with
        :meth:`fit_expanded`, those of the expansion it was given), in the SVMs
        (``svm_seconds``) and in all (``train_seconds``).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> X, y = load_digits(return_X_y=True)
    >>> model = BasisExpandingSVC(basis_per_class=10).fit(X[:1000], y[:1000])
    >>> model.predict(X[1000:1003]).shape
    (3,)
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "similarity": [str],
        "input_transform": [str, None],
        "basis_per_class": [Interval(Integral, 1, None, closed="left")],
        "basis_strategy": [StrOptions(set(BASIS_STRATEGIES))],
        "normalization": [str],
        "C": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "input_normalization": [StrOptions(set(INPUT_NORMALIZATIONS))],
        "input_shape": [str, None],
        "min_df": [Interval(Integral, 1, None, closed="left")],
        "stop_words": [StrOptions({"english"}), None],
        "n_jobs": [Integral, None],
        "cluster": [str, None],
        "random_state": [Interval(Integral, 0, None, closed="left"), None],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        *,
        similarity="rbf(gamma=1)",
        input_transform=None,
        basis_per_class=25,
        basis_strategy="index",
        normalization="auto",
        C=1.0,
        max_iter=10_000,
        input_normalization="global",
        input_shape=None,
        min_df=DEFAULT_MIN_DF,
        stop_words=DEFAULT_STOP_WORDS,
        n_jobs=-1,
        cluster=None,
        random_state=0,
        verbose=False,
    ):
        self.similarity = similarity
        self.input_transform = input_transform
        self.basis_per_class = basis_per_class
        self.basis_strategy = basis_strategy
        self.normalization = normalization
        self.C = C
        self.max_iter = max_iter
        self.input_normalization = input_normalization
        self.input_shape = input_shape
        self.min_df = min_df
        self.stop_words = stop_words
        self.n_jobs = n_jobs
        self.cluster = cluster
        self.random_state = random_state
        self.verbose = verbose

    # -- fitting ---------------------------------------------------------------------------

    def basis_expansion(self, preparation, verbose: bool = False) -> BasisExpansion:
        """The unfitted basis expansion of this estimator's parameters, over the inputs as
        ``preparation`` (settled on the measures) prepares them: one process's fit and the
        cluster's (:mod:`training.estimator.cluster_fit`) build it here."""
        return BasisExpansion(
            similarities=self.similarity,
            n_basis_per_class=self.basis_per_class,
            basis_strategy=self.basis_strategy,
            normalization=self.normalization,
            grid_shape=preparation.grid_shape,
            spaces=preparation.spaces,
            random_state=self.random_state,
            verbose=verbose,
        )

    def fit(self, X, y=None):
        """Choose the basis, expand the training set on it and train the SVMs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, H, W) or \
(n_samples, H, W, C), or sequence of str of length n_samples
            Dense inputs (vectors, or images), or documents as raw texts.
        y : array-like of shape (n_samples,)
            Class labels, at least two distinct ones, of any type that sorts.

        Returns
        -------
        self : BasisExpandingSVC

        Raises
        ------
        ValueError
            Malformed inputs or labels, a single class, a similarity, transform or
            normalisation that cannot be parsed or does not apply to the inputs, or similarity
            'auto' (a selection wraps the estimator instead).
        """
        self._validate_params()
        self._refuse_auto()
        sharded = isinstance(X, ShardedData)
        if sharded or self.cluster is not None or enclosing_client() is not None:
            try:
                return fit_on_cluster(self, X, y)
            except OneProcessOnly as reason:
                if sharded:
                    raise OneProcessOnly(
                        f"{reason}: sharded data cannot train with it (choose another "
                        "input_transform, or fit arrays that fit in memory)"
                    ) from None
                # The data is here, and only one process can learn from all of it.
                warnings.warn(
                    f"{reason}: trained in this process, not on the cluster",
                    UserWarning,
                    stacklevel=2,
                )
        return self.fit_expanded(self.expand(X, y))

    def _refuse_auto(self) -> None:
        if self.similarity.strip().lower() == AUTO_SIMILARITY:
            raise ValueError(
                "similarity='auto' is model selection, a wrapper around this estimator: "
                "ForwardSelectionCV(BasisExpandingSVC(...)).fit(X, y) chooses the measures, "
                "the transform, the normalisations, the basis and C by cross-validation, and "
                "its best_estimator_ is the BasisExpandingSVC fitted with them (from training "
                "import ForwardSelectionCV)"
            )

    def feature_parameters(self) -> dict[str, Any]:
        """The parameters that make the features: estimators that agree on them share an
        :class:`ExpandedTrainingSet`.

        Returns
        -------
        dict of str to object
            Every parameter but :data:`RUN_PARAMETERS` and :data:`SOLVER_PARAMETERS`.
        """
        return {
            name: value
            for name, value in self.get_params(deep=False).items()
            if name not in RUN_PARAMETERS + SOLVER_PARAMETERS
        }

    def expand(self, X, y) -> ExpandedTrainingSet:
        """The training set prepared and expanded on its basis, in this process, ready for
        :meth:`fit_expanded`: ``fit``'s first part, for fits that differ only in C.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, H, W) or \
(n_samples, H, W, C), or sequence of str of length n_samples
            As :meth:`fit` takes them in memory (not :class:`ShardedData`).
        y : array-like of shape (n_samples,)

        Returns
        -------
        ExpandedTrainingSet

        Raises
        ------
        ValueError
            As :meth:`fit` raises it.
        """
        self._validate_params()
        self._refuse_auto()
        if isinstance(X, ShardedData):
            raise ValueError("sharded data is expanded on its cluster: fit it there")
        if y is None:
            raise ValueError(
                "this estimator requires y to be passed, but the target y is None (only sharded "
                "data holds its labels)"
            )
        inputs = preparation_for(X, self)
        # validated on a copy: an estimator that only expanded is not fitted
        checked = clone(self)
        X, y = inputs.validate_fit(checked, X, y)
        validated = {
            name: getattr(checked, name) for name in _VALIDATED_ATTRIBUTES if hasattr(checked, name)
        }
        check_classification_targets(y)
        classes, codes = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                f"a classifier needs at least two classes in y, got 1 class: {classes[0]!r}"
            )
        class_names = tuple(str(c) for c in classes)
        if len(set(class_names)) != len(class_names):
            raise ValueError(
                f"labels {list(classes)} are not distinct as text, which the artifact "
                "and the service use"
            )
        try:
            specs = parse_specs(self.similarity)
            inputs.settle(specs)
        except SpecError as error:
            raise ValueError(str(error)) from None
        n_cores = threads_for_n_jobs(self.n_jobs)
        started = time.perf_counter()
        # OpenMP too: a bag of visual words' k-means (scikit-learn's) runs its threads
        with limit_threads(numba_threads=n_cores, blas_threads=n_cores, openmp_threads=n_cores):
            items = inputs.fit_items(X)
            expansion = self.basis_expansion(inputs, verbose=self.verbose)
            try:
                features = expansion.fit_transform(items, codes)
            except SpecError as error:
                raise ValueError(str(error)) from None
        del items
        design, shift, columns = training_design(features)
        for array in (design, shift, columns, codes, classes):
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
        return ExpandedTrainingSet(
            parameters=self.feature_parameters(),
            inputs=inputs,
            expansion=expansion,
            design=design,
            shift=shift,
            columns=columns,
            codes=codes,
            classes=classes,
            validated=validated,
            expand_seconds=time.perf_counter() - started,
        )

    def fit_expanded(self, expanded: ExpandedTrainingSet, *, start=None):
        """Train the SVMs on a training set :meth:`expand` made: ``fit``'s second part.

        Parameters
        ----------
        expanded : ExpandedTrainingSet
            Made by an estimator of the same :meth:`feature_parameters` (it may differ in C
            and max_iter); it is only read.
        start : BasisExpandingSVC, optional
            A model fitted on ``expanded`` (at another C) whose weights start the solver: a
            warm start, the same optimum within the solver's tolerance.

        Returns
        -------
        self : BasisExpandingSVC

        Raises
        ------
        ValueError
            ``expanded`` was made with other feature parameters.
        """
        self._validate_params()
        mine, theirs = self.feature_parameters(), expanded.parameters
        if theirs != mine:
            differing = sorted(
                name for name in mine.keys() | theirs.keys() if theirs.get(name) != mine.get(name)
            )
            raise ValueError(
                "the training set was expanded with other parameters than this estimator's: "
                + ", ".join(
                    f"{name}={theirs.get(name)!r} (here {mine.get(name)!r})" for name in differing
                )
            )
        if start is not None:
            check_is_fitted(start)
            if start.expansion_ is not expanded.expansion:
                raise ValueError("a warm start needs a model fitted on the same expansion")
        started = time.perf_counter()
        coef, intercept, self.n_iter_, self.train_accuracy_ = solve_one_vs_rest(
            expanded.design,
            expanded.shift,
            expanded.codes,
            len(expanded.classes),
            C=self.C,
            max_iter=self.max_iter,
            n_jobs=threads_for_n_jobs(self.n_jobs),
            start=None if start is None else (start.predictor_.coef, start.predictor_.intercept),
            columns=expanded.columns,
        )
        timings = {
            "expand_seconds": expanded.expand_seconds,
            "svm_seconds": time.perf_counter() - started,
        }
        timings["train_seconds"] = timings["expand_seconds"] + timings["svm_seconds"]
        for name in _VALIDATED_ATTRIBUTES:  # as validating these inputs would leave them
            if name in expanded.validated:
                setattr(self, name, expanded.validated[name])
            elif hasattr(self, name):
                delattr(self, name)
        self.classes_ = expanded.classes.copy()
        self.set_fitted(
            expanded.inputs,
            expanded.expansion,
            tuple(str(c) for c in expanded.classes),
            coef,
            intercept,
            len(expanded.codes),
            timings,
            basis_ids=expanded.expansion.basis_indices_,
        )
        return self

    def set_fitted(
        self, inputs, expansion, class_names, coef, intercept, n_train, timings, basis_ids=None
    ):
        """Set the learned state from the fitted parts: what every way of fitting ends with
        (in this process, or on a cluster: :mod:`training.estimator.cluster_fit`)."""
        self.timings_ = timings
        self.expansion_ = expansion
        self.input_spec_ = inputs.spec
        self.predictor_ = Predictor(
            name="model",
            inputs=inputs.model_inputs(expansion),
            classes=class_names,
            specs=expansion.specs_,
            normalization=expansion.normalization_,
            basis_labels=np.asarray(expansion.basis_labels_, dtype=np.int64),
            feature_offset=expansion.offset_,
            feature_scale=expansion.scale_,
            coef=coef,
            intercept=intercept,
            feature_projection=expansion.projection_,
            basis_ids=basis_ids,
            metadata={
                "basis": {
                    "size": int(expansion.basis_.shape[0]),
                    "strategy": self.basis_strategy,
                    "per_class": self.basis_per_class,
                },
                "training": {
                    "n_train": n_train,
                    "config": self.training_config(),
                    "timings": timings,
                    "train_accuracy": self.train_accuracy_,
                },
            },
        )

    def training_config(self) -> dict[str, Any]:
        """The parameters that make the model, as the artifact records them
        (``training.config``): every parameter but :data:`RUN_PARAMETERS`."""
        return {
            name: float(value) if name == "C" else value
            for name, value in self.get_params(deep=False).items()
            if name not in RUN_PARAMETERS
        }

    # -- prediction ------------------------------------------------------------------------

    def decision_function(self, X):
        """One-vs-rest scores ``w_k . phi(x) + b_k``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, H, W) or \
(n_samples, H, W, C), or sequence of str
            Inputs of the kind the model was fitted on.

        Returns
        -------
        scores : ndarray of shape (n_samples, n_classes), or (n_samples,) for two classes
            For two classes, positive scores mean ``classes_[1]`` (scikit-learn's convention).
        """
        check_is_fitted(self)
        scores = self.predictor_.decision_function(self._batch(X))
        return scores[:, 1] if len(self.classes_) == 2 else scores

    def predict(self, X):
        """Predicted labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, H, W) or \
(n_samples, H, W, C), or sequence of str

        Returns
        -------
        y : ndarray of shape (n_samples,)
            Elements of ``classes_``.
        """
        check_is_fitted(self)
        scores = self.predictor_.decision_function(self._batch(X))
        return self.classes_[scores.argmax(axis=1)]

    def _batch(self, X):
        return preparation_for_spec(self.input_spec_).validate_predict(self, X)

    # -- artifact --------------------------------------------------------------------------

    def to_predictor(
        self,
        name: str = "model",
        record: dict[str, Any] | None = None,
        diagnostics: bool = True,
    ) -> Predictor:
        """The fitted model as the service holds it, named, with the artifact's metadata.

        Parameters are as :meth:`save` takes them.

        Returns
        -------
        Predictor
        """
        check_is_fitted(self)
        metadata = {**self.predictor_.metadata}
        metadata["training"] = {**metadata["training"], **(record or {})}
        if diagnostics:
            metadata["diagnostics"] = basis_diagnostics(self.expansion_)
        return replace(self.predictor_, name=name, metadata=metadata)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True  # images as (n, H, W)
        return tags


def basis_diagnostics(expansion: BasisExpansion) -> dict[str, dict[str, float]]:
    """NgRat and NgEng of every measure on the basis, by the measure's name."""
    spectra = getattr(expansion, "basis_eigenvalues_", None)
    if spectra is None:
        spectra = [None] * len(expansion.basis_gram_)
    return {
        name: eigen_diagnostics(gram, eigenvalues)
        for name, gram, eigenvalues in zip(
            expansion.similarity_names_, expansion.basis_gram_, spectra, strict=True
        )
    }


def threads_for_n_jobs(n_jobs: int | None) -> int:
    """Threads for ``n_jobs``: -1 or None every available core, -2 all but one, and so on.

    Parameters
    ----------
    n_jobs : int or None
        Not 0.

    Returns
    -------
    int
        At least 1.
    """
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning: use a positive count, or -1 for all cores")
    cpus = available_cpus()
    if n_jobs is None or n_jobs < 0:
        return max(1, min(cpus, effective_n_jobs(-1 if n_jobs is None else n_jobs)))
    return int(n_jobs)
