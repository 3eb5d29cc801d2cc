"""Bag-of-words documents: sparse word counts over a vocabulary, neither transformed nor
normalised, and the rules of which measures apply to them (the sensing kernels, tf-idf linear and
rbf: :mod:`service.model.inputs.words` holds the counts, their views and the measures' drivers).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from service.model.errors import ArtifactIntegrityError, InvalidInputError, SpecError
from service.model.inputs.base import NO_TRANSFORM, InputKind
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform, parse_transform
from service.model.inputs.words import (
    Documents,
    Vocabulary,
    canonical_counts,
    counts_from_pairs,
    stored_counts,
)
from service.model.similarity import BoundSimilarity, SimilaritySpec


@dataclass(frozen=True, eq=False)
class DocumentInputs(InputKind):
    """Bag-of-words documents: sparse word counts, neither transformed nor normalised.

    Parameters
    ----------
    spec : InputSpec
        ``counts(W)``.
    basis : sparse matrix of shape (B, W)
        Word counts of the basis items (made canonical, see :func:`canonical_counts`).
    idf : ndarray of shape (W,)
        The training set's inverse document frequencies (the tf-idf view).
    vocabulary : Vocabulary, optional
        Turns raw text into counts, so clients may send text.

    Raises
    ------
    SpecError
        The spec is not ``counts(W)``.
    ArtifactIntegrityError
        The basis is not word counts.
    """

    spec: InputSpec
    basis: sp.csr_matrix
    idf: np.ndarray
    vocabulary: Vocabulary | None = None
    _basis_items: Documents = field(init=False, repr=False)

    has_normalized_form: ClassVar[bool] = False
    ARRAYS: ClassVar[frozenset[str]] = frozenset(
        {"input_scale", "basis_indptr", "basis_indices", "basis_counts", "idf", "vocabulary"}
    )
    _REQUIRED: ClassVar[frozenset[str]] = ARRAYS - {"vocabulary"}

    def __post_init__(self) -> None:
        if self.spec.kind != "counts":
            raise SpecError(
                f"documents are counts(W) inputs, not {self.spec}"
                + ("; text needs a vocabulary" if self.spec.kind == "text" else "")
            )
        try:
            counts = canonical_counts(self.basis)
        except (InvalidInputError, TypeError, ValueError) as error:
            raise ArtifactIntegrityError(f"document basis: {error}") from None
        idf = np.empty(0) if self.idf is None else self.idf
        object.__setattr__(self, "basis", counts)
        object.__setattr__(self, "idf", np.ascontiguousarray(idf, dtype=np.float64))
        # The basis as the measures read it; its views' postings are built once and cached.
        object.__setattr__(self, "_basis_items", Documents(counts, self.idf))

    @property
    def transform(self) -> InputTransform:
        return NO_TRANSFORM

    @property
    def n_features(self) -> int:
        return self.spec.shape[0]

    @property
    def grid_shape(self) -> None:
        return None

    @property
    def basis_items(self) -> Documents:
        return self._basis_items

    @property
    def n_basis_values(self) -> int:
        return int(self.basis.nnz)

    def parse(self, instances: Sequence[Any], names: Sequence[str] | None = None) -> Documents:
        """``{"indices": [...], "counts": [...]}`` objects, one per document (see
        :func:`counts_from_pairs`)."""
        if len(instances) == 0:
            raise InvalidInputError("the batch is empty: send at least one instance")
        return Documents(counts_from_pairs(instances, self.n_features, names), self.idf)

    def parse_texts(self, texts: Sequence[str]) -> Documents:
        """Raw texts, counted over the vocabulary (unknown words dropped)."""
        if self.vocabulary is None:
            raise InvalidInputError("this model has no vocabulary: send word counts as instances")
        if len(texts) == 0:
            raise InvalidInputError("the batch is empty: send at least one text")
        return Documents(self.vocabulary.encode(texts), self.idf)

    def batch(self, X) -> Documents:
        """:class:`Documents` as they are, a sparse count matrix of shape (n_samples, W), or
        raw texts (with a vocabulary)."""
        if isinstance(X, Documents):
            return X
        if sp.issparse(X):
            return Documents(canonical_counts(X, self.n_features), self.idf)
        return self.parse_texts(list(X))

    def prepare(self, batch: Documents) -> Documents:
        return batch

    def known_words(self, batch: Documents) -> list[int]:
        return batch.known_words().astype(int).tolist()

    def warm_up_batch(self, n_rows: int) -> Documents:
        one_word = sp.csr_matrix(
            (np.ones(n_rows), np.zeros(n_rows, dtype=np.int64), np.arange(n_rows + 1)),
            shape=(n_rows, self.n_features),
        )
        return Documents(canonical_counts(one_word), self.idf)

    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        for spec in specs:
            spec.space_index((str(NO_TRANSFORM),))  # documents are not transformed
        return tuple(spec.bind(self.n_features, documents=True) for spec in specs)

    @classmethod
    def settle_transforms(
        cls,
        spec: InputSpec,
        measures: Sequence[SimilaritySpec],
        transform: str | None = None,
    ) -> tuple[InputTransform, ...]:
        """Documents are not transformed: ``none`` alone, and every measure must read
        documents."""
        if transform is not None:
            parse_transform(transform).check(spec)  # refused with the reason
        for measure in measures:
            measure.check_documents(True, f"inputs {spec}")
            if measure.transform is not None:
                measure.transform.check(spec)  # only none applies, refused with the reason
        return (NO_TRANSFORM,)

    def problems(self) -> list[str]:
        n_words = self.n_features
        if self.basis.shape[1] != n_words:
            return [f"basis has shape {self.basis.shape}, expected ({self.n_basis}, {n_words})"]
        if self.idf.shape != (n_words,):
            return [f"idf has shape {self.idf.shape}, expected {(n_words,)}"]
        if self.vocabulary is not None and self.vocabulary.size != n_words:
            return [f"the vocabulary holds {self.vocabulary.size} words, inputs {n_words}"]
        if not np.isfinite(self.idf).all():
            return ["idf holds NaN or infinity"]
        return []

    def manifest(self) -> dict[str, Any]:
        entries = {**self._input_entry(), "transform": str(self.transform)}
        if self.vocabulary is not None:
            entries["vocabulary"] = {"size": self.vocabulary.size, **self.vocabulary.settings()}
        return entries

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            # Documents are not scaled; every BE-SVM artifact records a scale all the same.
            "input_scale": np.asarray(1.0),
            "basis_indptr": self.basis.indptr,
            "basis_indices": self.basis.indices,
            "basis_counts": self.basis.data,
            "idf": self.idf,
        }
        if self.vocabulary is not None:
            arrays["vocabulary"] = np.asarray(self.vocabulary.terms, dtype=np.str_)
        return arrays

    @classmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        return cls.ARRAYS if manifest.get("vocabulary") is not None else cls._REQUIRED

    @classmethod
    def from_artifact(cls, spec, manifest, arrays, path) -> DocumentInputs:
        if parse_transform(manifest.get("transform", "none")) != NO_TRANSFORM:
            raise ArtifactIntegrityError(f"{path}: documents are neither transformed nor scaled")
        if float(arrays["input_scale"]) != 1.0:
            raise ArtifactIntegrityError(f"{path}: documents are not scaled: input_scale must be 1")
        vocabulary = None
        settings = manifest.get("vocabulary")
        if settings is not None:
            try:
                vocabulary = Vocabulary(
                    tuple(arrays["vocabulary"].tolist()),
                    lowercase=bool(settings["lowercase"]),
                    token_pattern=str(settings["token_pattern"]),
                )
            except (KeyError, TypeError, ValueError, re.error) as error:
                raise ArtifactIntegrityError(f"{path}: bad vocabulary: {error!r}") from None
        basis = _basis_counts(path, arrays, spec.shape[0])
        return cls(spec=spec, basis=basis, idf=arrays["idf"], vocabulary=vocabulary)


def _basis_counts(path, arrays: dict[str, np.ndarray], n_words: int) -> sp.csr_matrix:
    """The basis of a documents model from its three CSR arrays, checked before use."""
    matrix = stored_counts(
        *(arrays[k] for k in ("basis_indptr", "basis_indices", "basis_counts")), n_words
    )
    if matrix is None:
        raise ArtifactIntegrityError(f"{path}: basis_indptr/indices/counts are not a valid CSR")
    return matrix
