"""A Basis Expanding SVM as a scikit-learn classifier, for notebooks and for the command line.

:class:`BasisExpandingSVC` is the one place a model is trained: ``python -m training fit`` is a
thin layer over it. It reads dense inputs (vectors, or images as arrays of shape (n, H, W) or
(n, H, W, C)) and documents (a list of texts), and :meth:`BasisExpandingSVC.save` writes the
artifact the service loads, so a model trained in a notebook is served as it is::

    from training import BasisExpandingSVC

    model = BasisExpandingSVC(basis_per_class=25).fit(X_train, y_train)
    model.score(X_test, y_test)
    model.save("models/mine")  # python -m service.api serves it

Training steps, each using at most ``n_jobs`` cores: the input kind's preparation (a transform
and the input normalisation, or a vocabulary), the basis expansion (numba drivers), then
LinearSVC's one-vs-rest problems, solved on the one feature matrix by trust-region Newton-CG in
groups of classes side by side (threads: numpy's products release the GIL), without the copy of the
matrix liblinear makes per class.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import replace
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from joblib import effective_n_jobs
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data

from service.model import Predictor, SpecError
from service.model.inputs.base import InputKind
from service.model.inputs.dense import INPUT_NORMALIZATIONS, DenseInputs, TransformedSpace
from service.model.inputs.documents import DocumentInputs
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform, default_transform, parse_transform
from service.model.inputs.words import DEFAULT_TOKEN_PATTERN, Vocabulary
from service.model.similarity import parse_specs
from service.model.threads import available_cpus, limit_threads
from training.basis import BASIS_STRATEGIES
from training.diagnostics import eigen_diagnostics
from training.expansion import BasisExpansion
from training.preprocessing import InputNormalizer
from training.solver import fit_one_vs_rest

# The value of ``similarity`` that will ask for forward selection of the measures (issue 14,
# item 1); until that lands, fit refuses it with a message rather than reading it as a measure.
AUTO_SIMILARITY = "auto"
# The estimator's parameters that a training configuration (training.fit.FitConfig, the command
# line's names) sets, and the configuration's field each one reads.
CONFIG_FIELDS = {
    "similarity": "similarities",
    "input_transform": "transform",
    "basis_per_class": "basis_per_class",
    "basis_strategy": "basis_strategy",
    "normalization": "normalization",
    "C": "C",
    "max_iter": "max_iter",
    "input_normalization": "input_normalization",
    "selection_budget_s": "selection_budget_s",
    "min_df": "min_df",
    "stop_words": "stop_words",
    "n_jobs": "n_jobs",
    "random_state": "seed",
}


def parameters_of(config, fields=None) -> dict[str, Any]:
    """The estimator's parameters that ``config`` (a FitConfig) sets, or only those read from
    ``fields``."""
    return {
        parameter: getattr(config, field)
        for parameter, field in CONFIG_FIELDS.items()
        if fields is None or field in fields
    }


class BasisExpandingSVC(ClassifierMixin, BaseEstimator):
    """Basis Expanding SVM: similarities to a class-balanced basis, then a one-vs-rest linear SVM.

    The inputs are prepared by their kind (dense: an optional transform, then centred and divided
    by the mean norm; documents: word counts over a vocabulary fitted on the training texts),
    compared with a basis of ``basis_per_class`` training items per class under one or more
    similarity measures, normalised, and classified by one LinearSVC per class.

    Parameters
    ----------
    similarity : str, default="rbf(gamma=1)"
        Similarity measure(s) sharing the basis, joined with ``+``, e.g.
        ``"rbf(gamma=0.5) + rigid(1)"`` (see ``python -m training fit --help``). A measure may
        read an input transform of its own, ``"hog(4): rbf + pixels: rbf"`` (one shared set of
        basis items, one input normalisation per transform; docs/multi-transform.md). Documents read
        ``sensing0``, ``sensing1(n=...)``, ``sensing2`` or tf-idf ``linear``/``rbf``.
        ``"auto"`` chooses by forward selection, cross-validated on the training set
        (:mod:`training.selection`): the measures, the input transform and normalisation, the
        basis size and strategy and C, whatever those parameters say; ``selection_`` records
        the path it took.
    input_transform : str or None, default=None
        Input transform applied to dense inputs first: ``none``, ``pixels`` or
        ``hog(cell_size, orientations)``; None: ``pixels`` for images, ``none`` otherwise.
    basis_per_class : int, default=25
        Basis items taken from each class (all of a smaller class).
    basis_strategy : {"index", "random", "kmedoids"}, default="index"
        How the basis items of a class are chosen.
    normalization : str, default="auto"
        Normalisation of the similarities: ``besvm``, ``none``, ``zscore``,
        ``nystroem(clip|flip|square)``, or ``auto`` (``nystroem(square)`` when every measure is
        a kernel, ``besvm`` when one is indefinite).
    C : float, default=1.0
        The SVM's regularisation constant.
    max_iter : int, default=10000
        The SVM solver's iteration limit (Newton steps per group of classes).
    input_normalization : {"global", "per-feature"}, default="global"
        Dense inputs: centred and divided by their mean norm (the paper's), or standardised
        per feature first (for features on different scales).
    selection_budget_s : float, default=40
        With ``similarity="auto"``: seconds the selection may take.
    input_shape : str or None, default=None
        How to read a flat row: ``"grid(H, W, C)"`` for images given as (n, H * W * C), or
        ``"vector(d)"``; None: from the array (2-d: vectors, 3-d or 4-d: images).
    min_df : int, default=2
        Documents: words found in fewer training texts are left out of the vocabulary.
    stop_words : {"english"} or None, default="english"
        Documents: leave out scikit-learn's English stop words, or keep every word.
    n_jobs : int or None, default=-1
        Cores training may use: the numba and BLAS threads of the expansion, and the classes'
        SVMs trained side by side. -1 (or None): every core this process may run on.
    random_state : int or None, default=0
        Seed of the ``random`` and ``kmedoids`` basis strategies.
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
        The most solver iterations any group of classes took.
    train_accuracy_ : float
        Accuracy on the training set.
    timings_ : dict of str to float
        Seconds spent expanding (``expand_seconds``), in the SVMs (``svm_seconds``) and in all
        (``train_seconds``).

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
        "selection_budget_s": [Interval(Real, 0, None, closed="neither")],
        "input_shape": [str, None],
        "min_df": [Interval(Integral, 1, None, closed="left")],
        "stop_words": [StrOptions({"english"}), None],
        "n_jobs": [Integral, None],
        "random_state": [Interval(Integral, 0, None, closed="left"), None],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        similarity="rbf(gamma=1)",
        input_transform=None,
        basis_per_class=25,
        basis_strategy="index",
        normalization="auto",
        C=1.0,
        max_iter=10_000,
        input_normalization="global",
        selection_budget_s=40.0,
        input_shape=None,
        min_df=2,
        stop_words="english",
        n_jobs=-1,
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
        self.selection_budget_s = selection_budget_s
        self.input_shape = input_shape
        self.min_df = min_df
        self.stop_words = stop_words
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    # -- fitting ---------------------------------------------------------------------------

    def fit(self, X, y):
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
            Malformed inputs or labels, a single class, or a similarity, transform or
            normalisation that cannot be parsed or does not apply to the inputs.
        """
        self._validate_params()
        if self.similarity.strip().lower() == AUTO_SIMILARITY:
            return self._fit_selected(X, y)
        inputs = _training_inputs_for(X, self)
        X, y = inputs.validate_fit(self, X, y)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"a classifier needs at least two classes in y, got 1 class: {self.classes_[0]!r}"
            )
        class_names = tuple(str(c) for c in self.classes_)
        if len(set(class_names)) != len(class_names):
            raise ValueError(
                f"labels {list(self.classes_)} are not distinct as text, which the artifact "
                "and the service use"
            )
        similarity = self._resolved_similarity()
        try:
            specs = parse_specs(similarity)
            inputs.check(specs)
        except SpecError as error:
            raise ValueError(str(error)) from None
        n_cores = _cores(self.n_jobs)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        with limit_threads(numba_threads=n_cores, blas_threads=n_cores):
            items = inputs.fit_items(X)
            expansion = BasisExpansion(
                similarities=similarity,
                n_basis_per_class=self.basis_per_class,
                basis_strategy=self.basis_strategy,
                normalization=self.normalization,
                grid_shape=inputs.grid_shape,
                spaces=inputs.spaces,
                random_state=self.random_state,
                verbose=self.verbose,
            )
            try:
                features = expansion.fit_transform(items, codes)
            except SpecError as error:
                raise ValueError(str(error)) from None
        timings["expand_seconds"] = time.perf_counter() - started

        started = time.perf_counter()
        del items
        coef, intercept, self.n_iter_, self.train_accuracy_ = fit_one_vs_rest(
            features,
            codes,
            len(self.classes_),
            C=self.C,
            max_iter=self.max_iter,
            n_jobs=n_cores,
        )
        del features
        timings["svm_seconds"] = time.perf_counter() - started
        timings["train_seconds"] = timings["expand_seconds"] + timings["svm_seconds"]
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
            metadata={
                "basis": {
                    "size": int(expansion.basis_.shape[0]),
                    "strategy": self.basis_strategy,
                    "per_class": self.basis_per_class,
                },
                "training": {
                    "n_train": len(codes),
                    "config": self._config_record(similarity),
                    "timings": timings,
                    "train_accuracy": self.train_accuracy_,
                },
            },
        )
        return self

    def _resolved_similarity(self) -> str:
        """The measures to train with (``auto`` is resolved by :meth:`_fit_selected`)."""
        return self.similarity

    def _fit_selected(self, X, y):
        """``similarity="auto"``: select a configuration on (X, y) by cross-validation, then fit
        it; the parameters stay as given, the learned state is the chosen model's."""
        from training.fit import FitConfig  # both train through this module
        from training.selection import CHOSEN_FIELDS, select_on

        inputs = _training_inputs_for(X, self)
        X_checked, y_checked = inputs.validate_fit(self, X, y)
        check_classification_targets(y_checked)
        selection = select_on(
            X_checked,
            np.asarray([str(label) for label in y_checked]),
            inputs.spec,
            budget_s=self.selection_budget_s,
            n_jobs=self.n_jobs,
            random_state=0 if self.random_state is None else self.random_state,
            progress=self.verbose,
            # What the selection does not choose is the user's, in its folds as in the model.
            base=FitConfig(max_iter=self.max_iter, min_df=self.min_df, stop_words=self.stop_words),
        )
        chosen = selection.config
        model = clone(self).set_params(**parameters_of(chosen, CHOSEN_FIELDS))
        model.fit(X, y)
        self.__dict__.update({k: v for k, v in vars(model).items() if k.endswith("_")})
        self.selection_ = selection
        training = self.predictor_.metadata["training"]
        training["selection"] = selection.record()
        self.timings_ = {**self.timings_, "selection_seconds": selection.seconds}
        training["timings"] = self.timings_
        return self

    def _config_record(self, similarity: str) -> dict[str, Any]:
        """The settings the manifest records (the command line's names, as before)."""
        return {
            "similarities": similarity,
            "transform": self.input_transform,
            "basis_per_class": self.basis_per_class,
            "basis_strategy": self.basis_strategy,
            "normalization": self.normalization,
            "C": float(self.C),
            "max_iter": self.max_iter,
            "input_normalization": self.input_normalization,
            "seed": self.random_state,
            "min_df": self.min_df,
            "stop_words": self.stop_words,
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
        return _prediction_inputs(self.input_spec_).validate_predict(self, X)

    # -- artifact --------------------------------------------------------------------------

    def save(
        self,
        path: str | os.PathLike,
        name: str | None = None,
        *,
        overwrite: bool = False,
        record: dict[str, Any] | None = None,
        diagnostics: bool = True,
    ) -> Path:
        """Write the model as an artifact directory that ``python -m service.api`` serves.

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
    return {
        name: eigen_diagnostics(gram)
        for name, gram in zip(expansion.similarity_names_, expansion.basis_gram_, strict=True)
    }


def _cores(n_jobs: int | None) -> int:
    """Threads for ``n_jobs``: -1 or None every available core, -2 all but one, and so on."""
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning: use a positive count, or -1 for all cores")
    cpus = available_cpus()
    if n_jobs is None or n_jobs < 0:
        return max(1, min(cpus, effective_n_jobs(-1 if n_jobs is None else n_jobs)))
    return int(n_jobs)


# -- input kinds while training ------------------------------------------------------------


class TrainingInputs(ABC):
    """What an estimator does with one kind of input: validate it, prepare the items the basis
    expansion reads, and build the served model's input kind
    (:mod:`service.model.input_kinds`) around the fitted basis."""

    spec: InputSpec

    @abstractmethod
    def validate_fit(self, estimator: BasisExpandingSVC, X, y) -> tuple[Any, np.ndarray]:
        """The training inputs and labels, checked."""

    @abstractmethod
    def check(self, specs) -> None:
        """Refuse measures (or a transform) that do not apply (raises SpecError)."""

    @abstractmethod
    def fit_items(self, X):
        """Learn the preparation from the training inputs and return them prepared."""

    @abstractmethod
    def model_inputs(self, expansion: BasisExpansion) -> InputKind:
        """The served model's input kind."""

    @abstractmethod
    def validate_predict(self, estimator: BasisExpandingSVC, X):
        """Inputs to predict on, as the model's input kind takes a trainer's batch."""

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return None

    @property
    def spaces(self) -> tuple[tuple[str, int, tuple[int, int, int] | None], ...] | None:
        """The transformed spaces the prepared items lay side by side (see
        :class:`BasisExpansion`'s ``spaces``); None for items of one kind with no transform."""
        return None


class DenseTraining(TrainingInputs):
    """Vectors and images: transformed, then centred (and standardised per feature, if asked)
    and scaled by the mean norm."""

    def __init__(
        self,
        spec: InputSpec | None = None,
        transform: str | None = None,
        input_normalization: str = "global",
    ):
        self.spec = spec
        self.transform_text = transform
        self.input_normalization = input_normalization

    def validate_fit(self, estimator, X, y):
        X = self._flat(estimator, X, fitting=True)
        X, y = validate_data(estimator, X, y, dtype=np.float64, order="C")
        if self.spec is None:
            self.spec = InputSpec("vector", (X.shape[1],))
        elif self.spec.n_features != X.shape[1]:
            raise ValueError(
                f"input_shape {self.spec} has {self.spec.n_features} numbers, "
                f"the inputs' rows {X.shape[1]}"
            )
        return X, y

    def _flat(self, estimator, X, fitting: bool):
        """Images (n, H, W[, C]) as flat rows, after checking their shape against the spec."""
        if not hasattr(X, "ndim") or not hasattr(X, "shape") or sp.issparse(X) or X.ndim <= 2:
            return X
        X = np.asarray(X)
        if fitting and self.spec is None:
            self.spec = InputSpec.for_array(X)
        if X.shape[1:] not in self.spec.accepted_shapes:
            raise ValueError(
                f"inputs of shape {X.shape[1:]} are not {self.spec} (shapes accepted: "
                f"{' or '.join(str(s) for s in self.spec.accepted_shapes)}, or flat rows)"
            )
        return X.reshape(len(X), -1)

    def check(self, specs) -> None:
        """Also settles the transforms: the model's (``transform``; else the default for the
        inputs if a measure reads it, else the first measure's), then each other one a measure
        names (``hog(4): rbf``), in order of the measures, once each."""
        default = default_transform(self.spec)
        if self.transform_text is not None:
            self._transform = parse_transform(self.transform_text)
        elif any(str(spec.transform_or(default)) == str(default) for spec in specs):
            self._transform = default
        else:
            # No measure reads the default transform: no space that nothing reads.
            self._transform = specs[0].transform
        transforms = {str(self._transform): self._transform}
        for spec in specs:
            if spec.transform is not None:
                transforms.setdefault(str(spec.transform), spec.transform)
        self._transforms = tuple(transforms.values())
        names = list(transforms)
        for spec in specs:
            spec.check_documents(False, f"inputs {self.spec}")
            transform = self._transforms[spec.space_index(names)]
            spec.check_grid(transform.grid_shape(self.spec), transform.n_features(self.spec))
        _refuse_repeated_measures(specs, self._transform)

    @property
    def transform(self) -> InputTransform:
        return self._transform

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return self._transform.grid_shape(self.spec)

    @property
    def spaces(self) -> tuple[tuple[str, int, tuple[int, int, int] | None], ...]:
        return tuple(
            (str(t), t.n_features(self.spec), t.grid_shape(self.spec)) for t in self._transforms
        )

    def fit_items(self, X):
        """Each transform computed once and normalised on its own (each space has its own mean
        and scale); several spaces are laid side by side in the columns."""
        self._normalizers = []
        parts = []
        for transform in self._transforms:
            transformed = transform.apply(X, self.spec)
            normalizer = InputNormalizer(scaling=self.input_normalization).fit(transformed)
            self._normalizers.append(normalizer)
            parts.append(normalizer.transform(transformed))
        return parts[0] if len(parts) == 1 else np.hstack(parts)

    def model_inputs(self, expansion):
        basis = expansion.basis_
        bases = basis.arrays if isinstance(basis, Spaces) else (basis,)
        first = self._normalizers[0]
        more = tuple(
            TransformedSpace(transform, normalizer.mean_, normalizer.scale_, space_basis)
            for transform, normalizer, space_basis in zip(
                self._transforms[1:], self._normalizers[1:], bases[1:], strict=True
            )
        )
        return DenseInputs(
            self.spec,
            mean=first.mean_,
            scale=first.scale_,
            basis=bases[0],
            transform=self._transform,
            more_spaces=more,
        )

    def validate_predict(self, estimator, X):
        X = self._flat(estimator, X, fitting=False)
        return validate_data(estimator, X, dtype=np.float64, order="C", reset=False)


class DocumentTraining(TrainingInputs):
    """Raw texts: word counts over a vocabulary fitted on the training texts."""

    spec = InputSpec("text", ())

    def __init__(
        self, min_df: int = 2, stop_words: str | None = "english", transform: str | None = None
    ):
        self.min_df = min_df
        self.stop_words = stop_words
        self.transform_text = transform

    def validate_fit(self, estimator, X, y):
        texts = _texts(X)
        y = column_or_1d(np.asarray(y), warn=True)
        if len(y) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(y)} labels")
        return texts, y

    def check(self, specs) -> None:
        if self.transform_text is not None:
            parse_transform(self.transform_text).check(self.spec)  # refused with the reason
        for spec in specs:
            spec.check_documents(True, f"inputs {self.spec}")
            if spec.transform is not None:
                spec.transform.check(self.spec)  # only none applies, refused with the reason

    def fit_items(self, X):
        self.vocabulary = fit_vocabulary(X, self.min_df, self.stop_words)
        return self.vocabulary.encode(X)

    def model_inputs(self, expansion):
        return DocumentInputs(
            InputSpec("counts", (self.vocabulary.size,)),
            basis=expansion.basis_,
            idf=expansion.idf_,
            vocabulary=self.vocabulary,
        )

    def validate_predict(self, estimator, X):
        return _texts(X)


def _refuse_repeated_measures(specs, model_transform: InputTransform) -> None:
    """Refuse one measure on one transform twice (``rbf + pixels: rbf`` on images).

    Raises
    ------
    SpecError
    """
    seen = set()
    for spec in specs:
        key = (str(spec.transform_or(model_transform)), spec.measure_name)
        if key in seen:
            terms = " + ".join(map(str, specs))
            raise SpecError(f"{spec.measure_name} on {key[0]} is given twice in {terms}")
        seen.add(key)


def _training_inputs_for(X, estimator: BasisExpandingSVC) -> TrainingInputs:
    """The input kind of a training set: documents for a sequence of texts, else dense."""
    if _is_texts(X):
        if estimator.input_shape not in (None, "text"):
            raise ValueError(f"texts have no input_shape, got {estimator.input_shape!r}")
        return DocumentTraining(estimator.min_df, estimator.stop_words, estimator.input_transform)
    spec = None
    if estimator.input_shape is not None:
        try:
            spec = InputSpec.parse(estimator.input_shape)
        except SpecError as error:
            raise ValueError(f"input_shape: {error}") from None
        if spec.is_documents:
            raise ValueError(f"input_shape {spec} is for documents: pass a list of texts")
    return DenseTraining(spec, estimator.input_transform, estimator.input_normalization)


def _prediction_inputs(spec: InputSpec) -> TrainingInputs:
    return DocumentTraining() if spec.is_documents else DenseTraining(spec)


def _is_texts(X) -> bool:
    """Whether ``X`` is a one-dimensional sequence whose first item is a string."""
    if isinstance(X, (str, bytes)) or sp.issparse(X):
        return False
    if isinstance(X, np.ndarray):
        return X.ndim == 1 and X.dtype.kind in "OU" and len(X) > 0 and isinstance(X[0], str)
    if getattr(X, "ndim", 1) != 1:  # a DataFrame
        return False
    try:
        return len(X) > 0 and isinstance(next(iter(X)), str)
    except TypeError:
        return False


def _texts(X) -> np.ndarray:
    """A batch of documents as a 1-d object array of str."""
    if not _is_texts(X):
        raise ValueError(
            f"this model reads documents: pass a sequence of texts (str), got {type(X).__name__}"
        )
    texts = np.asarray(list(X), dtype=object)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(f"document {bad} is not a string: {type(texts[bad]).__name__}")
    return texts


def fit_vocabulary(texts, min_df: int = 2, stop_words: str | None = "english") -> Vocabulary:
    """The words of the training texts that a model will count.

    Parameters
    ----------
    texts : sequence of str
    min_df : int
        Words in fewer documents than this are left out.
    stop_words : "english" or None
        Words of scikit-learn's English stop word list are left out.

    Raises
    ------
    ValueError
        No word is left.
    """
    if not isinstance(min_df, int) or min_df < 1:
        raise ValueError(f"min_df must be a positive integer, got {min_df!r}")
    vectorizer = CountVectorizer(
        lowercase=True, token_pattern=DEFAULT_TOKEN_PATTERN, stop_words=stop_words, min_df=min_df
    )
    try:
        vectorizer.fit(texts)
    except ValueError as error:
        raise ValueError(
            f"no vocabulary: no word is in at least {min_df} training texts ({error})"
        ) from None
    return Vocabulary(tuple(vectorizer.get_feature_names_out().tolist()))
