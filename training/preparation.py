"""How training reads each kind of input: one small strategy per kind, chosen once per fit.

:func:`preparation_for` chooses from the training set (a sequence of texts is documents, anything
else dense); the strategy validates the set, settles the transforms by the served input kind's
rules (:mod:`service.model.inputs`), learns the preparation (dense: each transform's input
normalisation, :class:`training.preprocessing.InputNormalizer`; documents: a vocabulary,
:func:`fit_vocabulary`), and builds the model's input kind around the fitted basis.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.utils.validation import column_or_1d, validate_data

from service.model.errors import SpecError
from service.model.inputs.base import InputKind
from service.model.inputs.dense import DenseInputs, TransformedSpace
from service.model.inputs.documents import DocumentInputs
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import DEFAULT_TOKEN_PATTERN, Vocabulary
from service.model.similarity import SimilaritySpec
from training.expansion import BasisExpansion
from training.preprocessing import InputNormalizer


class InputPreparation(ABC):
    """What an estimator does with one kind of input: validate it, prepare the items the basis
    expansion reads, and build the served model's input kind
    (:mod:`service.model.inputs`) around the fitted basis. One is chosen per fit
    (:func:`preparation_for`); the rules of which measures and transforms apply are the model
    kind's, not repeated here."""

    spec: InputSpec

    @abstractmethod
    def validate_fit(self, estimator, X, y) -> tuple[Any, np.ndarray]:
        """The training inputs and labels, checked."""

    @abstractmethod
    def settle(self, measures: Sequence[SimilaritySpec]) -> None:
        """Settle the transforms by the model kind's rules
        (:meth:`~service.model.inputs.base.InputKind.settle_transforms`).

        Raises
        ------
        SpecError
            A measure or the transform does not apply to these inputs.
        """

    @abstractmethod
    def fit_items(self, X):
        """Learn the preparation from the training inputs and return them prepared."""

    @abstractmethod
    def model_inputs(self, expansion: BasisExpansion) -> InputKind:
        """The served model's input kind."""

    @abstractmethod
    def validate_predict(self, estimator, X):
        """Inputs to predict on, as the model's input kind takes a trainer's batch."""

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return None

    @property
    def spaces(self) -> tuple[tuple[str, int, tuple[int, int, int] | None], ...] | None:
        """The transformed spaces the prepared items lay side by side (see
        :class:`BasisExpansion`'s ``spaces``); None for items of one kind with no transform."""
        return None


class DensePreparation(InputPreparation):
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

    def settle(self, measures: Sequence[SimilaritySpec]) -> None:
        self._transforms = DenseInputs.settle_transforms(self.spec, measures, self.transform_text)
        self._transform = self._transforms[0]

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


class DocumentPreparation(InputPreparation):
    """Raw texts: word counts over a vocabulary fitted on the training texts."""

    spec = InputSpec("text", ())

    def __init__(
        self, min_df: int = 2, stop_words: str | None = "english", transform: str | None = None
    ):
        self.min_df = min_df
        self.stop_words = stop_words
        self.transform_text = transform

    def validate_fit(self, estimator, X, y):
        texts = as_texts(X)
        y = column_or_1d(np.asarray(y), warn=True)
        if len(y) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(y)} labels")
        return texts, y

    def settle(self, measures: Sequence[SimilaritySpec]) -> None:
        DocumentInputs.settle_transforms(self.spec, measures, self.transform_text)

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
        return as_texts(X)


def preparation_for(X, estimator) -> InputPreparation:
    """The input kind of a training set: documents for a sequence of texts, else dense."""
    if is_texts(X):
        if estimator.input_shape not in (None, "text"):
            raise ValueError(f"texts have no input_shape, got {estimator.input_shape!r}")
        return DocumentPreparation(
            estimator.min_df, estimator.stop_words, estimator.input_transform
        )
    spec = None
    if estimator.input_shape is not None:
        try:
            spec = InputSpec.parse(estimator.input_shape)
        except SpecError as error:
            raise ValueError(f"input_shape: {error}") from None
        if spec.is_documents:
            raise ValueError(f"input_shape {spec} is for documents: pass a list of texts")
    return DensePreparation(spec, estimator.input_transform, estimator.input_normalization)


def preparation_for_spec(spec: InputSpec) -> InputPreparation:
    return DocumentPreparation() if spec.is_documents else DensePreparation(spec)


def is_texts(X) -> bool:
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


def as_texts(X) -> np.ndarray:
    """A batch of documents as a 1-d object array of str."""
    if not is_texts(X):
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
