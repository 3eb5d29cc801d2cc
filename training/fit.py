"""Fitting a Basis Expanding SVM: transform and normalise inputs, expand on a basis, then a
one-vs-rest LinearSVC.

Text data sets first get a vocabulary fitted on the training texts (scikit-learn's
CountVectorizer: lower-casing, its token pattern, English stop words left out, a minimum
document frequency); the model then reads word counts over it, and keeps the vocabulary so that
the service can read raw text.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.svm import LinearSVC

from service.model import (
    BasisExpansion,
    InputNormalizer,
    InputSpec,
    Predictor,
    SimilaritySpec,
    parse_specs,
)
from service.model.documents import DEFAULT_TOKEN_PATTERN, Vocabulary
from service.model.input_kinds import DenseInputs, DocumentInputs, InputKind
from service.model.transforms import InputTransform, default_transform, parse_transform
from training.datasets import Dataset
from training.diagnostics import eigen_diagnostics


@dataclass(frozen=True)
class FitConfig:
    """Hyper-parameters of a Basis Expanding SVM.

    The defaults are the configuration that cross-validated best in the digits report
    (docs/reports/digits): rbf(gamma=1) on 25 bases per class chosen by index, with the
    Nystroem normalisation of the squared spectrum. ``auto`` keeps that normalisation for
    kernels and switches to the paper's ``besvm`` when a measure is indefinite, where Nystroem
    loses accuracy (see :func:`service.model.expansion.resolve_normalization`).
    """

    similarities: str = "rbf(gamma=1)"
    transform: str | None = None  # None: pixels for images, none otherwise
    basis_per_class: int = 25
    basis_strategy: str = "index"
    normalization: str = "auto"
    C: float = 1.0
    max_iter: int = 10_000
    seed: int = 0
    min_df: int = 2  # text: words in fewer training documents are left out of the vocabulary
    stop_words: str | None = "english"  # text: scikit-learn's English list; None keeps all
    # dense: "global" (centre, divide by the mean norm) or "per-feature" (z-scores first); see
    # service.model.preprocessing. Chosen by training.selection for similarity "auto".
    input_normalization: str = "global"


# The LinearSVC trains on sparse features when at most this fraction of them differ from their
# column's median (document measures: most pairs share no word): liblinear then runs several
# times faster, on the same problem up to how its intercept is regularised.
SPARSE_TRAINING_DENSITY = 0.25


@dataclass
class FitResult:
    """A fitted model with what happened while fitting it."""

    predictor: Predictor
    timings: dict[str, float] = field(default_factory=dict)
    train_accuracy: float = float("nan")
    warnings: list[str] = field(default_factory=list)


def resolve_transform(
    text: str | None, input_spec: InputSpec, specs: tuple[SimilaritySpec, ...]
) -> InputTransform:
    """The input transform named by ``text`` (None: the default for the inputs), checked against
    the inputs and the measures that will read its output.

    Raises
    ------
    SpecError
        The transform does not apply to the inputs, or a grid measure gets no grid.
    """
    transform = default_transform(input_spec) if text is None else parse_transform(text)
    grid_shape = transform.grid_shape(input_spec)
    for spec in specs:
        spec.check_documents(input_spec.is_documents, f"inputs {input_spec}")
        spec.check_grid(grid_shape, transform.n_features(input_spec))
    return transform


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


def training_design(features: np.ndarray) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray]:
    """The matrix the SVM trains on, and the shift that makes it from ``features``.

    When at most :data:`SPARSE_TRAINING_DENSITY` of the entries differ from their column's
    median, the features minus those medians, as a sparse matrix (``features`` is shifted in
    place); otherwise the features themselves and a zero shift. A linear model on shifted
    features is the same model with another intercept: the caller folds ``shift`` back in
    (``b - w . shift``).

    Returns
    -------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    shift : ndarray of shape (n_features,)
    """
    median = np.median(features, axis=0)
    if np.count_nonzero(features != median) > SPARSE_TRAINING_DENSITY * features.size:
        return features, np.zeros(features.shape[1])
    features -= median
    return sp.csr_matrix(features), median


def fit_besvm(
    dataset: Dataset,
    config: FitConfig,
    name: str,
    verbose: bool = False,
    diagnostics: bool = True,
) -> FitResult:
    """Train a Basis Expanding SVM on the training split of ``dataset``.

    Parameters
    ----------
    dataset : Dataset
    config : FitConfig
    name : str
        Model name recorded in the artifact.
    verbose : bool
        Progress bars on long steps.
    diagnostics : bool
        Compute NgRat/NgEng of every measure (an eigen-decomposition of each B x B basis Gram
        matrix: minutes for thousands of bases); off for throw-away fits such as CV folds.

    Returns
    -------
    FitResult
    """
    specs = parse_specs(config.similarities)
    transform = resolve_transform(config.transform, dataset.input_spec, specs)
    if config.C <= 0:
        raise ValueError(f"C must be positive, got {config.C}")
    if len(set(dataset.y_train.tolist())) < 2:
        raise ValueError("the training split needs at least two classes")
    timings = {}
    started = time.perf_counter()
    # Fitting differs by input kind (a vocabulary, or the input normalisation); the model then
    # holds the kind's strategy (service.model.input_kinds), built around the fitted basis.
    if dataset.input_spec.kind == "text":
        vocabulary = fit_vocabulary(dataset.X_train, config.min_df, config.stop_words)
        X_hat = vocabulary.encode(dataset.X_train)

        def model_inputs(expansion: BasisExpansion) -> InputKind:
            return DocumentInputs(
                InputSpec("counts", (vocabulary.size,)),
                basis=expansion.basis_,
                idf=expansion.idf_,
                vocabulary=vocabulary,
            )

    else:
        X_train = transform.apply(dataset.X_train, dataset.input_spec)
        normalizer = InputNormalizer(scaling=config.input_normalization).fit(X_train)
        X_hat = normalizer.transform(X_train)

        def model_inputs(expansion: BasisExpansion) -> InputKind:
            return DenseInputs(
                dataset.input_spec,
                mean=normalizer.mean_,
                scale=normalizer.scale_,
                basis=expansion.basis_,
                transform=transform,
            )

    expansion = BasisExpansion(
        similarities=[str(s) for s in specs],
        n_basis_per_class=config.basis_per_class,
        basis_strategy=config.basis_strategy,
        normalization=config.normalization,
        grid_shape=transform.grid_shape(dataset.input_spec),
        random_state=config.seed,
        verbose=verbose,
    )
    features = expansion.fit_transform(X_hat, dataset.y_train)
    timings["expand_seconds"] = time.perf_counter() - started

    started = time.perf_counter()
    svm = LinearSVC(
        C=config.C,
        loss="squared_hinge",
        penalty="l2",
        dual="auto",
        max_iter=config.max_iter,
        random_state=config.seed,
    )
    design, shift = training_design(features)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        svm.fit(design, dataset.y_train)
    timings["svm_seconds"] = time.perf_counter() - started
    timings["train_seconds"] = timings["expand_seconds"] + timings["svm_seconds"]
    notes = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]

    coef, intercept = svm.coef_, svm.intercept_ - svm.coef_ @ shift
    if len(svm.classes_) == 2:
        # LinearSVC keeps one row for two classes (positive means classes_[1]); store one row
        # per class so that every model scores and ranks its classes the same way.
        coef, intercept = np.vstack([-coef, coef]), np.concatenate([-intercept, intercept])
    classes = [str(c) for c in svm.classes_]
    class_index = {c: i for i, c in enumerate(classes)}
    predictor = Predictor(
        name=name,
        inputs=model_inputs(expansion),
        classes=tuple(classes),
        specs=expansion.specs_,
        normalization=expansion.normalization_,
        basis_labels=np.array([class_index[str(c)] for c in expansion.basis_labels_]),
        feature_offset=expansion.offset_,
        feature_scale=expansion.scale_,
        coef=coef,
        intercept=intercept,
        feature_projection=expansion.projection_,
        metadata={
            "basis": {
                "size": int(expansion.basis_.shape[0]),
                "strategy": config.basis_strategy,
                "per_class": config.basis_per_class,
            },
            "diagnostics": {
                name: eigen_diagnostics(gram)
                for name, gram in zip(
                    expansion.similarity_names_, expansion.basis_gram_, strict=True
                )
            }
            if diagnostics
            else {},
            "training": {
                "dataset": dataset.source,
                "n_train": len(dataset.y_train),
                "config": asdict(config),
                "timings": timings,
            },
        },
    )
    train_accuracy = float((svm.predict(design) == dataset.y_train).mean())
    predictor.metadata["training"]["train_accuracy"] = train_accuracy
    return FitResult(predictor, timings, train_accuracy, notes)
