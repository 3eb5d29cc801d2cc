"""A trained Basis Expanding SVM: prediction on plain arrays, and its artifact form.

The hot path is plain numpy and numba on the stored arrays: transform the raw input (e.g. HOG),
normalise it, compute the similarities to the basis, normalise them, then one matrix product
with the one-vs-rest weights. Bag-of-words models (``counts(W)`` inputs) skip the transform and
the input normalisation: raw text goes through the stored vocabulary to sparse counts, which the
document measures read (see :mod:`service.model.documents`).
scikit-learn is not involved at serving time (its per-call overhead dominates at batch size 1).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from service.model.artifact import read_artifact, write_artifact
from service.model.documents import Documents, Vocabulary, canonical_counts, counts_from_pairs
from service.model.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    BatchTooLargeError,
    InvalidInputError,
    ModelError,
)
from service.model.expansion import NORMALIZATIONS, expand
from service.model.inputs import InputSpec
from service.model.preprocessing import normalize_inputs
from service.model.similarity import (
    DOCUMENT_PAIR_WORK,
    PARALLEL_MIN_WORK,
    SimilaritySpec,
    format_spec,
    parse_specs,
)
from service.model.transforms import InputTransform, parse_transform

MODEL_TYPE = "besvm"
_NO_TRANSFORM = InputTransform("none")


@dataclass(frozen=True)
class Answer:
    """The answer for one instance: the label, the best classes with scores, and for documents
    how many of its words the vocabulary knows (0: the model answered an empty document)."""

    label: str
    ranked: list[tuple[str, float]]
    known_words: int | None = None


@dataclass(frozen=True, eq=False)
class Predictor:
    """A Basis Expanding SVM ready to predict.

    Parameters
    ----------
    name : str
    input_spec : InputSpec
        What clients send.
    classes : tuple of str, length K
    specs : tuple of SimilaritySpec, length M
    normalization : str
    input_mean : ndarray of shape (d,) or None
        ``d`` is the length of a transformed instance; None for documents (not normalised).
    input_scale : float
    basis : ndarray of shape (B, d), or csr_matrix of shape (B, W)
        Basis items, transformed and input-normalised; word counts for documents.
    basis_labels : ndarray of shape (B,), int
        Index into ``classes`` of each basis item.
    feature_offset, feature_scale : ndarray of shape (M * B,)
    coef : ndarray of shape (K, M * B)
    intercept : ndarray of shape (K,)
    transform : InputTransform, default none
        Applied to every instance first; see :mod:`service.model.transforms`.
    feature_projection : ndarray of shape (M, B, B), optional
        Nystroem normalisations only.
    idf : ndarray of shape (W,), optional
        Documents only: the training set's inverse document frequencies (tf-idf view).
    vocabulary : Vocabulary, optional
        Documents only: turns raw text into counts, so clients may send text.
    metadata : dict
        Everything else the manifest records (training summary, created time, versions).
    """

    name: str
    input_spec: InputSpec
    classes: tuple[str, ...]
    specs: tuple[SimilaritySpec, ...]
    normalization: str
    input_mean: np.ndarray | None
    input_scale: float
    basis: np.ndarray | sp.csr_matrix
    basis_labels: np.ndarray
    feature_offset: np.ndarray
    feature_scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    transform: InputTransform = _NO_TRANSFORM
    feature_projection: np.ndarray | None = None
    idf: np.ndarray | None = None
    vocabulary: Vocabulary | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One dtype and layout for every array, so the compiled kernels see one signature.
        for name in self._float_arrays:
            array = np.ascontiguousarray(getattr(self, name), dtype=np.float64)
            object.__setattr__(self, name, array)
        basis_documents = None
        if self.is_documents:
            try:
                counts = canonical_counts(self.basis)
            except (InvalidInputError, TypeError, ValueError) as error:
                raise ArtifactIntegrityError(f"model {self.name!r}: basis: {error}") from None
            object.__setattr__(self, "basis", counts)
            basis_documents = Documents(counts, self.idf)
        problems = self._consistency_problems()
        if problems:
            raise ArtifactIntegrityError(f"model {self.name!r} is inconsistent: {problems[0]}")
        # Derived once: the hot path needs these on every call.
        object.__setattr__(self, "_basis_documents", basis_documents)
        object.__setattr__(self, "_grid_shape", self.transform.grid_shape(self.input_spec))
        object.__setattr__(self, "_score_weights", self._fold_projection())

    def _fold_projection(self) -> np.ndarray:
        """The weights applied to unprojected features, shape (M * B, K).

        Scores are linear in the features and a Nystroem projection is linear too, so
        ``(phi P) w = phi (P w)``: folding P into the weights once saves a B x B product per
        instance at serving time.
        """
        weights = np.ascontiguousarray(self.coef.T)
        if self.feature_projection is not None:
            n_basis = self.n_basis
            for m, block_projection in enumerate(self.feature_projection):
                block = slice(m * n_basis, (m + 1) * n_basis)
                weights[block] = block_projection @ weights[block]
        return weights

    @property
    def is_documents(self) -> bool:
        """Bag-of-words inputs: ``counts(W)``."""
        return self.input_spec.kind == "counts"

    @property
    def _float_arrays(self) -> tuple[str, ...]:
        names = _FLOAT_ARRAYS
        if self.is_documents:
            names = (*(n for n in names if n not in ("input_mean", "basis")), "idf")
        if self.feature_projection is None:
            return names
        return (*names, "feature_projection")

    def _consistency_problems(self) -> list[str]:
        if self.input_spec.kind == "text":
            return ["a model reads counts(W) documents, not text; text needs a vocabulary"]
        try:
            d = self.transform.n_features(self.input_spec)
            grid = self.transform.grid_shape(self.input_spec)
            for spec in self.specs:
                spec.check_documents(self.is_documents, f"inputs {self.input_spec}")
                spec.check_grid(grid, d)
        except ModelError as error:
            return [str(error)]
        n_basis = self.basis.shape[0]
        n_features, n_classes = len(self.specs) * n_basis, len(self.classes)
        expected = {
            "basis": (self.basis, (n_basis, d)),
            "basis_labels": (self.basis_labels, (n_basis,)),
            "feature_offset": (self.feature_offset, (n_features,)),
            "feature_scale": (self.feature_scale, (n_features,)),
            "coef": (self.coef, (n_classes, n_features)),
            "intercept": (self.intercept, (n_classes,)),
        }
        if self.is_documents:
            if self.input_mean is not None or self.transform.name != "none":
                return ["documents are neither transformed nor normalised"]
            expected["idf"] = (np.empty(0) if self.idf is None else self.idf, (d,))
            if self.vocabulary is not None and self.vocabulary.size != d:
                return [f"the vocabulary holds {self.vocabulary.size} words, inputs {d}"]
        else:
            if self.idf is not None or self.vocabulary is not None:
                return ["only counts(W) models have an idf or a vocabulary"]
            expected["input_mean"] = (
                np.empty(0) if self.input_mean is None else self.input_mean,
                (d,),
            )
        if self.normalization.startswith("nystroem"):
            expected["feature_projection"] = (
                np.empty(0) if self.feature_projection is None else self.feature_projection,
                (len(self.specs), n_basis, n_basis),
            )
        elif self.feature_projection is not None:
            return [f"a feature_projection makes no sense with {self.normalization}"]
        problems = [
            f"{name} has shape {array.shape}, expected {shape}"
            for name, (array, shape) in expected.items()
            if array.shape != shape
        ]
        if n_classes < 2 or len(set(self.classes)) != n_classes:
            problems.append(f"needs at least two distinct classes, got {list(self.classes)}")
        if not self.specs:
            problems.append("needs at least one similarity")
        if self.normalization not in NORMALIZATIONS:
            problems.append(f"unknown normalization {self.normalization!r}")
        if not (np.isfinite(self.input_scale) and self.input_scale > 0):
            problems.append(f"input_scale must be positive, got {self.input_scale}")
        if not problems and not (self.feature_scale > 0).all():
            problems.append("feature_scale must be positive")
        if not problems:
            problems += [
                f"{name} holds NaN or infinity"
                for name in self._float_arrays
                if not np.isfinite(getattr(self, name)).all()
            ]
        return problems

    @property
    def n_basis(self) -> int:
        return int(self.basis.shape[0])

    @property
    def similarity_names(self) -> list[str]:
        return [format_spec(s) for s in self.specs]

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        """Layout of a transformed instance, which grid measures need."""
        return self._grid_shape

    def validate(self, instances) -> np.ndarray | Documents:
        """Turn a client batch into model inputs: a flat float64 array (see
        :meth:`InputSpec.as_batch`), or for ``counts(W)`` models :class:`Documents` from
        ``{"indices": [...], "counts": [...]}`` objects."""
        if not self.is_documents:
            return self.input_spec.as_batch(instances)
        if len(instances) == 0:
            raise InvalidInputError("the batch is empty: send at least one instance")
        return Documents(counts_from_pairs(instances, self.input_spec.shape[0]), self.idf)

    def encode_texts(self, texts) -> Documents:
        """Raw texts as documents over the model's vocabulary (unknown words dropped).

        Raises
        ------
        InvalidInputError
            The model has no vocabulary, the batch is empty or an item is not a string.
        """
        if self.vocabulary is None:
            if self.is_documents:
                raise InvalidInputError(
                    f"model {self.name!r} has no vocabulary: send word counts as instances"
                )
            raise InvalidInputError(
                f"model {self.name!r} reads {self.input_spec}, not text: send instances"
            )
        if len(texts) == 0:
            raise InvalidInputError("the batch is empty: send at least one text")
        return Documents(self.vocabulary.encode(texts), self.idf)

    def as_inputs(self, X) -> np.ndarray | Documents:
        """Model inputs from what the trainer holds: a flat array; or for documents, texts, a
        sparse count matrix or :class:`Documents`."""
        if not self.is_documents:
            return self._check_flat(X)
        if isinstance(X, Documents):
            return X
        if sp.issparse(X):
            return Documents(canonical_counts(X, self.input_spec.shape[0]), self.idf)
        return self.encode_texts(list(X))

    def normalized_inputs(self, X) -> np.ndarray:
        """Inputs as the basis sees them: transformed, centred and scaled (dense models only).

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)

        Returns
        -------
        ndarray of shape (n_samples, d)
            ``d`` is the length of a transformed instance.
        """
        if self.is_documents:
            raise InvalidInputError(
                f"model {self.name!r} reads documents, which have no normalised dense form"
            )
        X = self.transform.apply(self._check_flat(X), self.input_spec)
        return normalize_inputs(X, self.input_mean, self.input_scale)

    def features(self, X) -> np.ndarray:
        """Basis-expanded features of raw (untransformed, un-normalised) inputs.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features), or documents
            Documents as :meth:`as_inputs` takes them.

        Returns
        -------
        ndarray of shape (n_samples, M * B)
        """
        return self._features(X, projection=self.feature_projection)

    def _features(self, X, projection: np.ndarray | None) -> np.ndarray:
        X = self.as_inputs(X)
        if self.is_documents:
            X_hat, basis = X, self._basis_documents
        else:
            X_hat, basis = self.normalized_inputs(X), self.basis
        return expand(
            X_hat,
            basis,
            self.specs,
            self.feature_offset,
            self.feature_scale,
            projection=projection,
            grid_shape=self.grid_shape,
        )

    def decision_function(self, X) -> np.ndarray:
        """One-vs-rest scores ``w_k . phi(x) + b_k``.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features), or documents
            Documents as :meth:`as_inputs` takes them.

        Returns
        -------
        scores : ndarray of shape (n_samples, K)
        """
        scores = self._features(X, projection=None) @ self._score_weights
        scores += self.intercept
        return scores

    def predict(self, X) -> np.ndarray:
        """Predicted class labels, shape (n_samples,)."""
        return np.asarray(self.classes)[self.decision_function(X).argmax(axis=1)]

    def top_k(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best classes of each row of ``scores``, best first.

        Parameters
        ----------
        scores : ndarray of shape (n_samples, K)
        k : int
            Clipped to K.

        Returns
        -------
        indices, top_scores : ndarray of shape (n_samples, min(k, K))
        """
        if k < 1:
            raise InvalidInputError(f"top_k must be at least 1, got {k}")
        order = np.argsort(-scores, axis=1, kind="stable")[:, : min(k, scores.shape[1])]
        return order, np.take_along_axis(scores, order, axis=1)

    def classify(
        self,
        instances=None,
        top_k: int = 3,
        max_batch_size: int | None = None,
        *,
        texts=None,
    ) -> list[Answer]:
        """Validate a client batch and answer it: the label and top-k classes of each instance.

        Parameters
        ----------
        instances : sequence, optional
            Nested lists (see :meth:`InputSpec.as_batch`), or for ``counts(W)`` models
            ``{"indices": [...], "counts": [...]}`` objects. Exactly one of ``instances`` and
            ``texts``.
        top_k : int
            Classes per instance, clipped to the number of classes.
        max_batch_size : int, optional
            Refuse larger batches with :class:`BatchTooLargeError`.
        texts : sequence of str, optional
            Raw documents, for models with a vocabulary.

        Returns
        -------
        list of Answer, one per instance
        """
        if (instances is None) == (texts is None):
            raise InvalidInputError("send either instances or texts, not both and not neither")
        batch = instances if texts is None else texts
        if max_batch_size is not None and len(batch) > max_batch_size:
            raise BatchTooLargeError(
                f"the batch holds {len(batch)} instances; the limit is {max_batch_size}"
            )
        X = self.validate(instances) if texts is None else self.encode_texts(texts)
        order, scores = self.top_k(self.decision_function(X), top_k)
        known = X.known_words().astype(int).tolist() if self.is_documents else None
        classes = self.classes
        return [
            Answer(
                label=classes[row[0]],
                ranked=[(classes[c], float(s)) for c, s in zip(row, row_scores, strict=True)],
                known_words=None if known is None else known[i],
            )
            for i, (row, row_scores) in enumerate(zip(order.tolist(), scores.tolist(), strict=True))
        ]

    def warm_up(self) -> None:
        """Run the whole prediction path, serial and parallel, so compiled kernels are loaded."""
        if self.is_documents:
            work_per_row = self.n_basis * DOCUMENT_PAIR_WORK
            one_word = sp.csr_matrix(([1.0], ([0], [0])), shape=(1, self.input_spec.shape[0]))
            for rows in (1, int(PARALLEL_MIN_WORK // work_per_row) + 1):
                self.decision_function(sp.vstack([one_word] * rows, format="csr"))
            return
        d = self.input_mean.shape[0]
        work_per_row = min(spec.work(1, self.n_basis, d) for spec in self.specs)
        typical = np.zeros((1, self.input_spec.n_features))
        for rows in (1, int(PARALLEL_MIN_WORK // work_per_row) + 1):
            self.decision_function(np.repeat(typical, rows, axis=0))

    def _check_flat(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        d = self.input_spec.n_features
        if X.ndim != 2 or X.shape[1] != d:
            raise InvalidInputError(f"expected flat inputs of shape (n, {d}), got {X.shape}")
        return np.ascontiguousarray(X, dtype=np.float64)

    # -- artifact form ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike, overwrite: bool = False):
        """Write this model as an artifact directory; see :mod:`service.model.artifact`."""
        manifest = {
            "model_type": MODEL_TYPE,
            "name": self.name,
            "input": {"kind": self.input_spec.kind, "shape": list(self.input_spec.shape)},
            "classes": list(self.classes),
            "transform": str(self.transform),
            "similarities": self.similarity_names,
            "normalization": self.normalization,
            **{k: v for k, v in self.metadata.items() if k not in _RESERVED},
        }
        if self.vocabulary is not None:
            manifest["vocabulary"] = {"size": self.vocabulary.size, **self.vocabulary.settings()}
        arrays = {
            "input_scale": np.asarray(self.input_scale, dtype=np.float64),
            "basis_labels": self.basis_labels.astype(np.int64),
            "feature_offset": self.feature_offset,
            "feature_scale": self.feature_scale,
            "coef": self.coef,
            "intercept": self.intercept,
        }
        if self.feature_projection is not None:
            arrays["feature_projection"] = self.feature_projection
        if self.is_documents:
            arrays |= {
                "basis_indptr": self.basis.indptr,
                "basis_indices": self.basis.indices,
                "basis_counts": self.basis.data,
                "idf": self.idf,
            }
            if self.vocabulary is not None:
                arrays["vocabulary"] = np.asarray(self.vocabulary.terms, dtype=np.str_)
        else:
            arrays |= {"input_mean": self.input_mean, "basis": self.basis}
        return write_artifact(path, manifest, arrays, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Predictor:
        """Load and verify an artifact written by :meth:`save`.

        Raises
        ------
        ArtifactError
            Missing, tampered, truncated, inconsistent or newer-schema artifacts.
        """
        artifact = read_artifact(path)
        m, arrays = artifact.manifest, artifact.arrays
        if m.get("model_type") != MODEL_TYPE:
            raise ArtifactError(f"{path}: model_type {m.get('model_type')!r} is not {MODEL_TYPE!r}")
        try:
            input_spec = InputSpec(m["input"]["kind"], tuple(m["input"]["shape"]))
            transform = parse_transform(m.get("transform", "none"))
            specs = parse_specs(m["similarities"])
            classes = tuple(str(c) for c in m["classes"])
            normalization = m["normalization"]
            vocabulary_settings = m.get("vocabulary")
        except (KeyError, TypeError, ModelError) as error:
            raise ArtifactIntegrityError(f"{path}: malformed manifest: {error!r}") from None
        documents = input_spec.kind == "counts"
        required = set(_ARRAY_NAMES) | (_DOCUMENT_ARRAYS if documents else _DENSE_ARRAYS)
        if vocabulary_settings is not None:
            required.add("vocabulary")
        missing = sorted(required - arrays.keys())
        if missing:
            raise ArtifactIntegrityError(f"{path}: arrays missing from manifest: {missing}")
        vocabulary = None
        if documents:
            basis = _basis_counts(path, arrays, input_spec.shape[0])
            if vocabulary_settings is not None:
                try:
                    vocabulary = Vocabulary(
                        tuple(arrays["vocabulary"].tolist()),
                        lowercase=bool(vocabulary_settings["lowercase"]),
                        token_pattern=str(vocabulary_settings["token_pattern"]),
                    )
                except (KeyError, TypeError, ValueError, re.error) as error:
                    raise ArtifactIntegrityError(f"{path}: bad vocabulary: {error!r}") from None
        else:
            basis = arrays["basis"]
        return cls(
            name=str(m.get("name", artifact.path.name)),
            input_spec=input_spec,
            classes=classes,
            specs=specs,
            normalization=normalization,
            input_mean=arrays.get("input_mean"),
            input_scale=float(arrays["input_scale"]),
            basis=basis,
            basis_labels=arrays["basis_labels"],
            feature_offset=arrays["feature_offset"],
            feature_scale=arrays["feature_scale"],
            coef=arrays["coef"],
            intercept=arrays["intercept"],
            transform=transform,
            feature_projection=arrays.get("feature_projection"),
            idf=arrays.get("idf"),
            vocabulary=vocabulary,
            metadata={k: v for k, v in m.items() if k not in _RESERVED},
        )


def _basis_counts(path, arrays: dict[str, np.ndarray], n_words: int) -> sp.csr_matrix:
    """The basis of a documents model from its three CSR arrays, checked before use."""
    indptr, indices, counts = (arrays[k] for k in ("basis_indptr", "basis_indices", "basis_counts"))
    n_basis = arrays["basis_labels"].shape[0]
    if (
        indptr.ndim != 1
        or indptr.shape[0] != n_basis + 1
        or indptr[0] != 0
        or (np.diff(indptr) < 0).any()
        or indptr[-1] != indices.shape[0]
        or indices.shape != counts.shape
        or (indices.size and not 0 <= indices.min() <= indices.max() < n_words)
    ):
        raise ArtifactIntegrityError(f"{path}: basis_indptr/indices/counts are not a valid CSR")
    return sp.csr_matrix((counts, indices, indptr), shape=(n_basis, n_words))


_DENSE_ARRAYS = frozenset({"input_mean", "basis"})
_DOCUMENT_ARRAYS = frozenset({"basis_indptr", "basis_indices", "basis_counts", "idf"})
_ARRAY_NAMES = (
    "input_scale",
    "basis_labels",
    "feature_offset",
    "feature_scale",
    "coef",
    "intercept",
)
_RESERVED = frozenset(
    {
        "model_type",
        "name",
        "input",
        "classes",
        "transform",
        "similarities",
        "normalization",
        "vocabulary",
        "schema_version",
        "format",
        "arrays",
    }
)

_FLOAT_ARRAYS = ("input_mean", "basis", "feature_offset", "feature_scale", "coef", "intercept")
