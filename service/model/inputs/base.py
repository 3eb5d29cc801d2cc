"""Input kinds: how a model reads its inputs, one strategy per kind, chosen once.

The kinds live in :mod:`service.model.inputs.dense` and :mod:`service.model.inputs.documents`;
:mod:`service.model.inputs.kinds` chooses one for an input spec and reads it from an artifact.

Everything on the way from a client's payload to the similarity measures depends on what an
input is, and on nothing else:

=====================  ==========================================  ===========================
                       :class:`DenseInputs`                        :class:`DocumentInputs`
=====================  ==========================================  ===========================
input spec             ``vector(d)``, ``grid(H, W, C)``            ``counts(W)``
client request         nested lists                                ``{"indices", "counts"}``
                                                                   objects, or raw texts (with
                                                                   a vocabulary)
batch                  flat float64 array (n, n_features)          :class:`Documents`
prepared for measures  transformed, centred and scaled array       the documents (with idf)
basis                  array (B, d) of prepared items              word counts (B, W), read
                                                                   through cached postings
artifact arrays        ``input_mean``, ``input_scale`` (a scalar,  ``basis_indptr``,
                       or one per feature), ``basis``
                                                                   ``basis_indices``,
                                                                   ``basis_counts``, ``idf``,
                                                                   ``input_scale`` (always 1),
                                                                   ``vocabulary`` (optional)
manifest keys          ``input``, ``transform``,                   ``input``, ``transform``
                       ``input_normalization`` (per-feature only)
                                                                   (always ``none``),
                                                                   ``vocabulary`` (optional)
=====================  ==========================================  ===========================

Dense models over several transforms hold one mean, scale and basis per transform (see
:mod:`service.model.inputs.dense`).

A :class:`~service.model.predictor.Predictor` holds one :class:`InputKind`, chosen from its input
spec by :func:`~service.model.inputs.kinds.input_kind_for` when the model is fitted or loaded,
and delegates to it: it never asks which kind it holds. Checks that depend only on the model
(the transform applies to the inputs, the measures apply to the items, the grid fits) are made
once, when the strategy is built and the measures are bound (:meth:`InputKind.bind`); per call,
only the client's payload is checked.

The two ways in: :meth:`InputKind.parse` / :meth:`InputKind.parse_texts` take client requests,
:meth:`InputKind.batch` takes what a trainer holds (arrays, sparse counts, texts). Both give a
*batch*, which :meth:`InputKind.prepare` turns into the items the measures compare with
:attr:`InputKind.basis_items`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from service.model.errors import InvalidInputError
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import CellDocuments, Documents, Vocabulary
from service.model.similarity import BoundSimilarity, SimilaritySpec

# The manifest keys the input kinds write and read (a model's metadata never holds them).
MANIFEST_KEYS = frozenset({"input", "transform", "transforms", "vocabulary", "input_normalization"})

NO_TRANSFORM = InputTransform("none")


class InputKind(ABC):
    """What a model's inputs are, and everything that depends on it (see the module docstring).

    Attributes
    ----------
    spec : InputSpec
        What one client instance is.
    has_normalized_form : bool
        Whether :meth:`normalized` gives the inputs as dense normalised vectors (the feature
        space a search model may read instead of the basis-expanded features).
    """

    spec: InputSpec
    has_normalized_form: ClassVar[bool]
    # Every array name the kind may own in an artifact (see :meth:`array_names`).
    ARRAYS: ClassVar[frozenset[str]]

    # -- what the inputs are -------------------------------------------------------------

    @property
    @abstractmethod
    def transform(self) -> InputTransform:
        """Applied to every instance before anything else (``none`` for documents)."""

    @property
    def vocabulary(self) -> Vocabulary | None:
        """Turns raw text into inputs; None if the model reads no text."""
        return None

    @property
    @abstractmethod
    def n_features(self) -> int:
        """Length of a prepared item (what the measures compare), ``d`` or ``W``."""

    @property
    @abstractmethod
    def grid_shape(self) -> tuple[int, int, int] | None:
        """Layout of a prepared item as (height, width, channels), or None if flat."""

    @property
    @abstractmethod
    def basis_items(self) -> np.ndarray | Documents:
        """The basis as the measures read it, shape (n_basis, n_features)."""

    @property
    def n_basis(self) -> int:
        """Basis items, B: the rows of the kind's ``basis``."""
        return int(self.basis.shape[0])

    @property
    @abstractmethod
    def n_basis_values(self) -> int:
        """Numbers the basis keeps: B * d for dense items, the non-zero counts of documents."""

    # -- batches -------------------------------------------------------------------------

    @abstractmethod
    def parse(
        self, instances: Sequence[Any], names: Sequence[str] | None = None
    ) -> np.ndarray | Documents:
        """A client's instances as a batch, each checked against what the model can read.

        Parameters
        ----------
        instances : sequence
        names : sequence of str, optional
            What messages call each instance (default ``instances[i]``).

        Raises
        ------
        InvalidInputError
            Naming the first offending instance; also for an empty batch.
        """

    def parse_prepared(
        self, instances: Sequence[Any], names: Sequence[str] | None = None
    ) -> tuple[np.ndarray | Documents, np.ndarray | Documents | Spaces]:
        """:meth:`parse`, and the batch :meth:`prepare`-d, each step done once.

        Raises
        ------
        InvalidInputError
            As :meth:`parse`.
        """
        batch = self.parse(instances, names)
        return batch, self.prepare(batch)

    def parse_texts(self, texts: Sequence[str]) -> np.ndarray | Documents:
        """A client's raw texts as a batch.

        Raises
        ------
        InvalidInputError
            The model reads no text, the batch is empty or an item is not a string.
        """
        raise InvalidInputError(f"this model reads {self.spec}, not text: send instances")

    @abstractmethod
    def batch(self, X) -> np.ndarray | Documents:
        """What a trainer holds (see the subclasses) as a batch; a batch passes unchanged.

        Raises
        ------
        InvalidInputError
        """

    @abstractmethod
    def prepare(self, batch: np.ndarray | Documents) -> np.ndarray | Documents:
        """A batch as the measures read it, shape (n_samples, n_features); no checks."""

    def prepares_serially(self, n_samples: int) -> bool:
        """Whether :meth:`prepare` of ``n_samples`` items is light work that enters no
        parallel region (see
        :meth:`service.model.inputs.transforms.BoundTransform.runs_serially`)."""
        return True

    def normalized(self, X) -> np.ndarray:
        """The inputs as dense normalised vectors (see :attr:`has_normalized_form`).

        Raises
        ------
        InvalidInputError
            The kind has no such form.
        """
        raise InvalidInputError(
            f"{self.spec} inputs have no normalised dense form: use the basis-expanded features"
        )

    def normalized_of(self, items) -> np.ndarray:
        """:meth:`normalized` of a batch already :meth:`prepare`-d.

        Raises
        ------
        InvalidInputError
            The kind has no such form.
        """
        return self.normalized(items)

    def known_words(self, batch: np.ndarray | Documents) -> list[int] | None:
        """Words of each instance the model knows, for kinds that count words; else None."""
        return None

    @abstractmethod
    def warm_up_batch(self, n_rows: int) -> np.ndarray | Documents:
        """A batch of ``n_rows`` typical instances, to run the prediction path on."""

    # -- measures ------------------------------------------------------------------------

    @abstractmethod
    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        """The measures bound to this kind's prepared items (checked once).

        Raises
        ------
        SpecError
            A measure does not apply to these items.
        """

    # -- rules -------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def settle_transforms(
        cls,
        spec: InputSpec,
        measures: Sequence[SimilaritySpec],
        transform: str | None = None,
    ) -> tuple[InputTransform, ...]:
        """The transforms a model of this kind computes for ``measures``, its own first: the
        one rule of which measures and transforms apply to these inputs, for training and for
        checking a configuration.

        Parameters
        ----------
        spec : InputSpec
            What one input is (``text`` for the raw texts of a text data set).
        measures : sequence of SimilaritySpec
        transform : str, optional
            The model's transform as the user named it; None: the kind's default.

        Raises
        ------
        SpecError
            A measure or a transform does not apply to these inputs, or a measure is given
            twice on one transform.
        """

    # -- artifact form -------------------------------------------------------------------

    @abstractmethod
    def problems(self) -> list[str]:
        """What is inconsistent in this kind's own arrays (empty if nothing)."""

    @abstractmethod
    def manifest(self) -> dict[str, Any]:
        """This kind's manifest entries (keys of :data:`MANIFEST_KEYS`)."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """This kind's arrays, by their artifact names."""

    @classmethod
    @abstractmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        """The arrays an artifact with this manifest must hold for this kind."""

    @classmethod
    @abstractmethod
    def from_artifact(
        cls,
        spec: InputSpec,
        manifest: dict[str, Any],
        arrays: dict[str, np.ndarray],
        path: str | os.PathLike,
    ) -> InputKind:
        """Build from an artifact's manifest and verified arrays.

        Raises
        ------
        ArtifactIntegrityError
            The arrays do not form valid inputs of this kind.
        KeyError, TypeError, ModelError
            A malformed manifest entry (the caller names the manifest).
        """

    def _input_entry(self) -> dict[str, Any]:
        return {"input": {"kind": self.spec.kind, "shape": list(self.spec.shape)}}


def join_items(parts: Sequence[Any]) -> Any:
    """Prepared batches (of one model, from :meth:`InputKind.prepare`) as one batch, their
    items in order: what dynamic batching computes together.

    Parameters
    ----------
    parts : sequence of ndarray, Spaces, Documents or CellDocuments, all of one kind

    Returns
    -------
    The items of every part, of the parts' kind (the first part itself when there is one).
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if isinstance(first, Spaces):
        spaces = zip(*(p.arrays for p in parts), strict=True)
        return Spaces(tuple(join_items(space) for space in spaces))
    if isinstance(first, CellDocuments):
        unreadable = None
        if any(p.unreadable is not None for p in parts):
            unreadable = np.concatenate(
                [np.zeros(len(p), bool) if p.unreadable is None else p.unreadable for p in parts]
            )
        documents = join_items([p.documents for p in parts])
        return CellDocuments(documents, first.cell_weights, unreadable)
    if isinstance(first, Documents):
        counts = sp.vstack([p.counts for p in parts], format="csr")
        counts.sort_indices()  # each part's rows are sorted already: this only sets the flag
        return Documents(counts, first.idf)
    raise TypeError(f"cannot join items of type {type(first).__name__}")
