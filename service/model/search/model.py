"""The US-SVM classifiers ``w_k = D z_k`` of a model's classes, and the feature space they
read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.model.artifact import manifest_digest, read_typed_artifact
from service.model.artifact_writing import write_artifact
from service.model.errors import ArtifactIntegrityError, InvalidInputError, brief
from service.model.predictor import Predictor
from service.model.search.codes import SparseCode
from service.model.search.layout import check_parent

MODEL_TYPE = "us-svm"
FEATURE_SPACES = ("inputs", "besvm")


def feature_space_for(predictor: Predictor, requested: str = "auto") -> str:
    """The feature space a search model reads: ``inputs`` (the model's normalised inputs) or
    ``besvm`` (its basis-expanded features); ``auto`` is ``inputs`` for dense inputs and
    ``besvm`` for documents, which have no dense normalised form.

    Raises
    ------
    InvalidInputError
        An unknown feature space, or ``inputs`` for a model that reads documents.
    """
    if requested == "auto":
        return "inputs" if predictor.inputs.has_normalized_form else "besvm"
    if requested not in FEATURE_SPACES:
        raise InvalidInputError(
            f"feature space must be one of {', '.join(FEATURE_SPACES)} or auto, got {requested!r}"
        )
    if requested == "inputs" and not predictor.inputs.has_normalized_form:
        raise InvalidInputError(
            f"model {predictor.name!r} reads {predictor.input_spec}, which has no normalised "
            "dense form: use the besvm feature space"
        )
    return requested


def search_features(predictor: Predictor, feature_space: str, X) -> np.ndarray:
    """The features a search model's classifiers act on.

    Parameters
    ----------
    predictor : Predictor
    feature_space : {"inputs", "besvm"}
    X : ndarray of shape (n_samples, input_spec.n_features), or documents

    Returns
    -------
    ndarray of shape (n_samples, d)
    """
    if feature_space == "inputs":
        return predictor.normalized_inputs(X)
    return predictor.features(X)


def prepared_search_features(predictor: Predictor, feature_space: str, items) -> np.ndarray:
    """:func:`search_features` of a client batch already prepared (see
    :meth:`Predictor.validate_prepared`), so that each transform is computed once."""
    if feature_space == "inputs":
        return predictor.prepared_normalized(items)
    return predictor.prepared_features(items)


@dataclass(frozen=True, eq=False)
class UnionOfSubspacesModel:
    """Learned US-SVM classifiers ``w_k = D z_k`` ready to serve.

    Parameters
    ----------
    feature_space : {"inputs", "besvm"}
    dictionary : ndarray of shape (d, A)
    codes : ndarray of shape (A, K)
        ``z_k`` in column k, pruned at training time.
    intercept : ndarray of shape (K,)
    classes : tuple of str, length K
    metadata : dict
        Hyper-parameters and training summary, as recorded in the manifest.
    """

    feature_space: str
    dictionary: np.ndarray
    codes: np.ndarray
    intercept: np.ndarray
    classes: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("dictionary", "codes", "intercept"):
            object.__setattr__(
                self, name, np.ascontiguousarray(getattr(self, name), dtype=np.float64)
            )
        problem = self._consistency_problem()
        if problem:
            raise ArtifactIntegrityError(f"search model is inconsistent: {problem}")

    def _consistency_problem(self) -> str | None:
        if self.feature_space not in FEATURE_SPACES:
            return f"unknown feature space {self.feature_space!r}"
        if self.dictionary.ndim != 2 or self.codes.ndim != 2:
            return "dictionary and codes must be matrices"
        n_atoms, n_classes = self.codes.shape
        if self.dictionary.shape[1] != n_atoms:
            return f"dictionary has {self.dictionary.shape[1]} atoms, codes have {n_atoms}"
        if self.intercept.shape != (n_classes,) or len(self.classes) != n_classes:
            return f"codes have {n_classes} classes, intercept {self.intercept.shape}, " + (
                f"labels {len(self.classes)}"
            )
        if not all(np.isfinite(a).all() for a in (self.dictionary, self.codes, self.intercept)):
            return "non-finite values"
        return None

    @property
    def n_atoms(self) -> int:
        return int(self.dictionary.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.dictionary.shape[0])

    def project(self, features: np.ndarray) -> np.ndarray:
        """``x' = D^T x`` of every row, shape (n_samples, A)."""
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or features.shape[1] != self.n_features:
            raise InvalidInputError(
                f"expected features of shape (n, {self.n_features}), got {features.shape}"
            )
        return features @ self.dictionary

    def decision_function(self, features: np.ndarray) -> np.ndarray:
        """Class scores ``z_k^T D^T x + b_k``, shape (n_samples, K)."""
        return self.project(features) @ self.codes + self.intercept

    def class_code(self, label: str) -> SparseCode:
        """The code ``z_k`` and bias ``b_k`` of one class; unknown ones raise InvalidInputError."""
        try:
            k = self.classes.index(label)
        except ValueError:
            shown = ", ".join(self.classes[:20]) + (", ..." if len(self.classes) > 20 else "")
            raise InvalidInputError(
                f"unknown class {brief(label)}; the classes are: {shown}"
            ) from None
        return SparseCode.from_dense(self.codes[:, k], self.intercept[k])

    def save(self, path: str | os.PathLike, model_path: str | os.PathLike, overwrite=False):
        """Write under a model's directory; a catalogue built with an older dictionary goes."""
        manifest = {
            **self.metadata,
            "model_type": MODEL_TYPE,
            "feature_space": self.feature_space,
            "classes": list(self.classes),
            "model_manifest_sha256": manifest_digest(model_path),
        }
        arrays = {"dictionary": self.dictionary, "codes": self.codes, "intercept": self.intercept}
        return write_artifact(path, manifest, arrays, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, model_path: str | os.PathLike) -> UnionOfSubspacesModel:
        """Load and verify; the model it was trained for must be the one at ``model_path``."""
        artifact = read_typed_artifact(
            path,
            MODEL_TYPE,
            {"dictionary", "codes", "intercept"},
            {"feature_space", "classes", "model_manifest_sha256", "created", "versions"},
        )
        m = artifact.manifest
        check_parent(path, m, "model_manifest_sha256", manifest_digest(model_path), model_path)
        try:
            return cls(
                feature_space=str(m["feature_space"]),
                classes=tuple(str(c) for c in m["classes"]),
                metadata=artifact.metadata,
                **{k: artifact.arrays[k] for k in ("dictionary", "codes", "intercept")},
            )
        except (KeyError, TypeError) as error:
            raise ArtifactIntegrityError(f"{path}: malformed manifest: {error!r}") from None
