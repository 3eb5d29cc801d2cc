"""How training reads each kind of input: one small strategy per kind, chosen once per fit.

:func:`preparation_for` chooses from the training set (a sequence of texts is documents, anything
else dense); the strategy validates the set, settles the transforms by the served input kind's
rules (:mod:`service.model.inputs`), learns the preparation (dense: each transform's input
normalisation, :class:`training.estimator.preprocessing.InputNormalizer`; documents: a vocabulary,
:func:`fit_vocabulary`), and builds the model's input kind around the fitted basis.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.utils.validation import column_or_1d, validate_data

from service.model.errors import SpecError
from service.model.inputs.base import InputKind
from service.model.inputs.bof import BagOfFeatures
from service.model.inputs.dense import DenseInputs, TransformedSpace
from service.model.inputs.documents import DocumentInputs
from service.model.inputs.kinds import input_kind_for_data
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import DEFAULT_TOKEN_PATTERN, Vocabulary
from service.model.similarity import SimilaritySpec
from training.estimator.expansion import BasisExpansion
from training.estimator.preprocessing import InputNormalizer
from training.estimator.visual_words import fit_bag_of_features

# The vocabulary of a document model by default: every word (scikit-learn's TfidfVectorizer's
# default, the usual baseline's). Leaving out words of one training text and English stop words
# cost fortunes about a point at a large basis (docs/measurements/model-selection.md, "Every
# word by default").
DEFAULT_MIN_DF = 1
DEFAULT_STOP_WORDS = None
# fit's vocabulary until 30 November: the words of at least two training texts, English stop
# words left out. The text report and the text benchmarks were measured with it, and name it to
# give their figures again.
FREQUENT_WORDS = MappingProxyType({"min_df": 2, "stop_words": "english"})


class InputPreparation(ABC):
    """What an estimator does with one kind of input: validate it, prepare the items the basis
    expansion reads, and build the served model's input kind
    (:mod:`service.model.inputs`) around the fitted basis. One is chosen per fit
    (:func:`preparation_for`); the rules of which measures and transforms apply are the model
    kind's, not repeated here."""

    spec: InputSpec

    @classmethod
    @abstractmethod
    def of(cls, spec: InputSpec | None, estimator) -> InputPreparation:
        """The preparation of data of ``spec`` for ``estimator``'s parameters (None: for
        prediction inputs only)."""

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
        random_state: int | None = 0,
    ):
        self.spec = spec
        self.transform_text = transform
        self.input_normalization = input_normalization
        self.random_state = random_state

    @classmethod
    def of(cls, spec, estimator):
        if estimator is None:
            return cls(spec)
        return cls(
            spec,
            estimator.input_transform,
            estimator.input_normalization,
            estimator.random_state,
        )

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
    def spaces(self) -> tuple[tuple[str, int, tuple[int, int, int] | None, int], ...]:
        return tuple(
            (
                str(t),
                t.n_features(self.spec),
                t.grid_shape(self.spec),
                t.bof_cells() if t.reads_cells else 0,
            )
            for t in self._transforms
        )

    def fit_items(self, X):
        """Each transform computed once and normalised on its own (each space has its own mean
        and scale), or for a fitted transform (``bof``) its visual words learned
        (:func:`training.estimator.visual_words.fit_bag_of_features`); several dense spaces are laid
        side by side in the columns, spaces of bags of visual words given as
        :class:`Spaces`."""
        self._fitted = []  # per transform: its InputNormalizer, or its BagOfFeatures
        parts = []
        for transform in self._transforms:
            if transform.is_fitted:
                bag, items = fit_bag_of_features(transform, self.spec, X, self.random_state)
                self._fitted.append(bag)
                parts.append(items)
                continue
            transformed = transform.apply(X, self.spec)
            normalizer = InputNormalizer(scaling=self.input_normalization).fit(transformed)
            self._fitted.append(normalizer)
            parts.append(normalizer.transform(transformed))
        if len(parts) == 1:
            return parts[0]
        if any(t.is_fitted for t in self._transforms):
            return Spaces(tuple(parts))
        return np.hstack(parts)

    @property
    def transforms(self) -> tuple[InputTransform, ...]:
        """The transforms settled on (:meth:`settle`), one per space, the model's first."""
        return self._transforms

    def use_normalizers(self, normalizers: Sequence[InputNormalizer]) -> None:
        """Take the normalisation of each space as fitted elsewhere, instead of
        :meth:`fit_items` (a cluster's reductions over shards,
        :mod:`training.estimator.cluster_fit`).
        """
        if any(t.is_fitted for t in self._transforms):
            raise ValueError(
                "transforms fitted on the training images (bof) are learned in one process: "
                "train without a cluster"
            )
        if len(normalizers) != len(self._transforms):
            raise ValueError(f"{len(normalizers)} normalisers for {len(self._transforms)} spaces")
        self._fitted = list(normalizers)

    def prepare(self, X) -> np.ndarray:
        """Rows prepared as :meth:`fit_items` prepares the training set, with the fitted
        normalisation: what the basis expansion reads."""
        parts = [
            normalizer.transform(transform.apply(X, self.spec))
            for transform, normalizer in zip(self._transforms, self._fitted, strict=True)
        ]
        return parts[0] if len(parts) == 1 else np.hstack(parts)

    def model_inputs(self, expansion):
        basis = expansion.basis_
        bases = basis.arrays if isinstance(basis, Spaces) else (basis,)
        spaces = [
            TransformedSpace(transform, None, None, space_basis)
            if transform.is_fitted
            else TransformedSpace(transform, fitted.mean_, fitted.scale_, space_basis)
            for transform, fitted, space_basis in zip(
                self._transforms, self._fitted, bases, strict=True
            )
        ]
        own = spaces[0]
        return DenseInputs(
            self.spec,
            mean=own.mean,
            scale=own.scale,
            basis=own.basis,
            transform=self._transform,
            more_spaces=tuple(spaces[1:]),
            bags=tuple(f for f in self._fitted if isinstance(f, BagOfFeatures)),
        )

    def validate_predict(self, estimator, X):
        X = self._flat(estimator, X, fitting=False)
        return validate_data(estimator, X, dtype=np.float64, order="C", reset=False)


class DocumentPreparation(InputPreparation):
    """Raw texts: word counts over a vocabulary fitted on the training texts."""

    spec = InputSpec("text", ())

    def __init__(
        self,
        min_df: int = DEFAULT_MIN_DF,
        stop_words: str | None = DEFAULT_STOP_WORDS,
        transform: str | None = None,
    ):
        self.min_df = min_df
        self.stop_words = stop_words
        self.transform_text = transform

    @classmethod
    def of(cls, spec, estimator):
        if estimator is None:
            return cls()
        return cls(estimator.min_df, estimator.stop_words, estimator.input_transform)

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


# The preparation of each model input kind: training chooses through the model's kinds
# (service.model.inputs.kinds.input_kind_for_data), never by a test of its own.
PREPARATIONS: dict[type[InputKind], type[InputPreparation]] = {
    DenseInputs: DensePreparation,
    DocumentInputs: DocumentPreparation,
}


def data_spec(X, input_shape: str | None) -> InputSpec | None:
    """What one item of a training set is: ``text`` for a sequence of texts; else the spec
    ``input_shape`` names, or None to read it from the array (:meth:`InputPreparation.
    validate_fit` sets it).

    Raises
    ------
    ValueError
        ``input_shape`` cannot be parsed, or does not fit the kind of data.
    """
    if is_texts(X):
        if input_shape not in (None, "text"):
            raise ValueError(f"texts have no input_shape, got {input_shape!r}")
        return InputSpec("text", ())
    if input_shape is None:
        return None
    try:
        spec = InputSpec.parse(input_shape)
    except SpecError as error:
        raise ValueError(f"input_shape: {error}") from None
    if spec.is_documents:
        raise ValueError(f"input_shape {spec} is for documents: pass a list of texts")
    return spec


def preparation_for(X, estimator) -> InputPreparation:
    """The preparation of a training set, by the input kind of the model it makes."""
    spec = data_spec(X, estimator.input_shape)
    kind = DenseInputs if spec is None else input_kind_for_data(spec)
    return PREPARATIONS[kind].of(spec, estimator)


def preparation_for_spec(spec: InputSpec) -> InputPreparation:
    """The preparation that reads prediction inputs of a fitted model's ``spec``."""
    return PREPARATIONS[input_kind_for_data(spec)].of(spec, None)


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


def fit_vocabulary(
    texts, min_df: int = DEFAULT_MIN_DF, stop_words: str | None = DEFAULT_STOP_WORDS
) -> Vocabulary:
    """The words of the training texts that a model will count.

    Parameters
    ----------
    texts : sequence of str
    min_df : int, default=DEFAULT_MIN_DF
        Words in fewer documents than this are left out.
    stop_words : "english" or None, default=DEFAULT_STOP_WORDS
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
    except ValueError:
        words = "no word of two or more letters or digits"
        if stop_words is not None:
            words += f", other than {stop_words} stop words,"
        where = "the training texts" if min_df == 1 else f"at least {min_df} training texts"
        raise ValueError(f"no vocabulary: {words} is in {where}") from None
    return Vocabulary(tuple(vectorizer.get_feature_names_out().tolist()))
