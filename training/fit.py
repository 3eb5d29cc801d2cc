"""Fitting a Basis Expanding SVM on a data set's training split: the command line's and the
report's way in to :class:`training.estimator.BasisExpandingSVC`, which does the training.

Text data sets first get a vocabulary fitted on the training texts (scikit-learn's
CountVectorizer: lower-casing, its token pattern, English stop words left out, a minimum
document frequency); the model then reads word counts over it, and keeps the vocabulary so that
the service can read raw text.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from sklearn.exceptions import ConvergenceWarning

from service.model import Predictor, SimilaritySpec
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform, default_transform, parse_transform
from training.datasets import Dataset
from training.estimator import BasisExpandingSVC, fit_vocabulary, parameters_of
from training.solver import SPARSE_TRAINING_DENSITY, training_design

__all__ = [
    "SPARSE_TRAINING_DENSITY",
    "FitConfig",
    "FitResult",
    "estimator_for",
    "fit_besvm",
    "fit_vocabulary",
    "resolve_transform",
    "training_design",
]


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
    n_jobs: int | None = -1  # cores training uses; -1: all
    # dense: "global" (centre, divide by the mean norm) or "per-feature" (z-scores first); see
    # service.model.preprocessing. Chosen by training.selection for similarity "auto".
    input_normalization: str = "global"
    selection_budget_s: float = 40.0  # similarity "auto": seconds the selection may take


@dataclass
class FitResult:
    """A fitted model with what happened while fitting it."""

    predictor: Predictor
    timings: dict[str, float] = field(default_factory=dict)
    train_accuracy: float = float("nan")
    warnings: list[str] = field(default_factory=list)
    estimator: BasisExpandingSVC | None = None


def resolve_transform(
    text: str | None, input_spec: InputSpec, specs: tuple[SimilaritySpec, ...]
) -> InputTransform:
    """The input transform named by ``text`` (None: the default for the inputs), checked against
    the inputs and the measures that will read its output (a measure ``transform: measure`` is
    checked against its own transform).

    Raises
    ------
    SpecError
        The transform does not apply to the inputs, or a grid measure gets no grid.
    """
    transform = default_transform(input_spec) if text is None else parse_transform(text)
    for spec in specs:
        spec.check_documents(input_spec.is_documents, f"inputs {input_spec}")
        read = spec.transform_or(transform)  # a measure may read a transform of its own
        spec.check_grid(read.grid_shape(input_spec), read.n_features(input_spec))
    return transform


def estimator_for(config: FitConfig, input_spec: InputSpec, verbose: bool = False):
    """The estimator that trains ``config`` on inputs of ``input_spec`` (flat rows)."""
    return BasisExpandingSVC(
        **parameters_of(config),
        input_shape=None if input_spec.is_documents else str(input_spec),
        verbose=verbose,
    )


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
    if len(set(dataset.y_train.tolist())) < 2:
        raise ValueError("the training split needs at least two classes")
    estimator = estimator_for(config, dataset.input_spec, verbose)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        estimator.fit(dataset.X_train, dataset.y_train)
    notes = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    predictor = estimator.to_predictor(
        name, record={"dataset": dataset.source}, diagnostics=diagnostics
    )
    if not diagnostics:
        predictor.metadata["diagnostics"] = {}
    return FitResult(predictor, estimator.timings_, estimator.train_accuracy_, notes, estimator)
