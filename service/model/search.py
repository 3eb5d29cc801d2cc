r"""Search over a precomputed catalogue with Union-of-Subspaces SVM codes (US-SVM paper).

Every class classifier is :math:`w_k = D z_k` with a sparse code :math:`z_k` over the dictionary
:math:`D` (d x A). For a catalogue X (N items) the trainer stores :math:`X' = D^T X` once, atom
major (A x N float32, memory-mapped), so that

.. math:: s_j = z_k^T x'_j + b_k

reads only the rows of :math:`X'` where :math:`z_k` is non-zero. A new class costs no pass over
the catalogue either: :math:`w^T x = z^T (D^T x)`, so a code is learned on the precomputed rows of
the positives and of a fixed sample of catalogue items as negatives (a small sparse SVM in A
dimensions).

The artifact lives inside the model's directory, so retraining the model retires it::

    model-dir/                 the Basis Expanding SVM (see service.model.predictor)
        search/                the dictionary, the class codes and biases (manifest + .npy)
            catalogue/         projected.npy (A x N float32), ids, negatives sample, labels

Each level records the checksum of the level it derives from and refuses to load over another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import (
    StreamedArray,
    manifest_digest,
    read_artifact,
    write_artifact,
)
from service.model.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    BatchTooLargeError,
    InvalidInputError,
    NotFoundError,
)
from service.model.predictor import Predictor
from service.model.search_kernels import search_top_k

MODEL_TYPE = "us-svm"
CATALOGUE_TYPE = "catalogue"
SEARCH_DIR = "search"
CATALOGUE_DIR = "catalogue"
FEATURE_SPACES = ("inputs", "besvm")
DEFAULT_NEGATIVES = 1000
ITEMS_PER_ATOM = 5
# The regularisation path of learned codes: from the smallest C with a non-zero weight (without
# class weights: the weighted one is larger), C grows by this factor for at most this many steps.
LEARN_C_FACTOR = 2.0
LEARN_C_STEPS = 24


def search_dir(model_dir: str | os.PathLike) -> Path:
    """Where a model's search model lives."""
    return Path(model_dir) / SEARCH_DIR


def catalogue_dir(model_dir: str | os.PathLike) -> Path:
    """Where a model's catalogue lives."""
    return search_dir(model_dir) / CATALOGUE_DIR


def feature_space_for(predictor: Predictor, requested: str = "auto") -> str:
    """The feature space a search model reads: ``inputs`` (the model's normalised inputs) or
    ``besvm`` (its basis-expanded features); ``auto`` is ``inputs`` for dense inputs and
    ``besvm`` for documents, which have no dense normalised form."""
    if requested == "auto":
        return "besvm" if predictor.is_documents else "inputs"
    if requested not in FEATURE_SPACES:
        raise InvalidInputError(
            f"feature space must be one of {', '.join(FEATURE_SPACES)} or auto, got {requested!r}"
        )
    if requested == "inputs" and predictor.is_documents:
        raise InvalidInputError(
            f"model {predictor.name!r} reads documents: use the besvm feature space"
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


@dataclass(frozen=True)
class SparseCode:
    """A linear classifier over the atoms: ``score = weights . x'[atoms] + bias``.

    Entries are ordered by decreasing ``|weight|``: the strongest atoms first.
    """

    atoms: np.ndarray
    weights: np.ndarray
    bias: float

    @classmethod
    def from_dense(cls, code: np.ndarray, bias: float, n_nonzero: int | None = None) -> SparseCode:
        """The non-zeros of a dense code of shape (A,), the ``n_nonzero`` largest kept."""
        atoms = np.flatnonzero(code)
        order = np.argsort(-np.abs(code[atoms]), kind="stable")
        if n_nonzero is not None:
            order = order[:n_nonzero]
        atoms = atoms[order].astype(np.int64)
        return cls(atoms, code[atoms].astype(np.float64), float(bias))

    @property
    def n_nonzero(self) -> int:
        return int(self.atoms.shape[0])

    def pruned(self, n_nonzero: int | None) -> SparseCode:
        if n_nonzero is None or n_nonzero >= self.n_nonzero:
            return self
        return SparseCode(self.atoms[:n_nonzero], self.weights[:n_nonzero], self.bias)


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
        try:
            k = self.classes.index(label)
        except ValueError:
            shown = ", ".join(self.classes[:20]) + (", ..." if len(self.classes) > 20 else "")
            raise InvalidInputError(f"unknown class {label!r}; the classes are: {shown}") from None
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
        artifact = read_artifact(path)
        m = artifact.manifest
        if m.get("model_type") != MODEL_TYPE:
            raise ArtifactError(f"{path}: model_type {m.get('model_type')!r} is not {MODEL_TYPE!r}")
        _check_parent(path, m, "model_manifest_sha256", manifest_digest(model_path), model_path)
        missing = sorted({"dictionary", "codes", "intercept"} - artifact.arrays.keys())
        if missing:
            raise ArtifactIntegrityError(f"{path}: arrays missing from manifest: {missing}")
        reserved = {
            "model_type", "feature_space", "classes", "model_manifest_sha256", "schema_version",
            "format", "arrays", "created", "versions",
        }  # fmt: skip
        try:
            return cls(
                feature_space=str(m["feature_space"]),
                classes=tuple(str(c) for c in m["classes"]),
                metadata={k: v for k, v in m.items() if k not in reserved},
                **{k: artifact.arrays[k] for k in ("dictionary", "codes", "intercept")},
            )
        except (KeyError, TypeError) as error:
            raise ArtifactIntegrityError(f"{path}: malformed manifest: {error!r}") from None


def _check_parent(path, manifest: dict, key: str, expected: str, parent) -> None:
    if manifest.get(key) != expected:
        raise ArtifactIntegrityError(
            f"{path} was built for another version of {parent}: rebuild it "
            "(python -m training dictionary / index)"
        )


@dataclass(frozen=True, eq=False)
class Catalogue:
    """Projected catalogue items and their ids.

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32
        ``D^T x`` of every item, atom major; usually a read-only memory map.
    ids : ndarray of shape (N,), str
    negatives : ndarray of shape (n_negatives,), int64
        Positions of the fixed random sample that serves as negatives of learned codes.
    labels : ndarray of shape (N,), str, optional
        Known classes of the items (evaluation only).
    metadata : dict
    """

    projected: np.ndarray
    ids: np.ndarray
    negatives: np.ndarray
    labels: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_items = self.projected.shape[1]
        if self.projected.dtype != np.float32 or not self.projected.flags.c_contiguous:
            raise ArtifactIntegrityError("catalogue: projected must be C-contiguous float32")
        if self.ids.shape != (n_items,) or (
            self.labels is not None and self.labels.shape != (n_items,)
        ):
            raise ArtifactIntegrityError(f"catalogue: ids and labels must have {n_items} entries")
        if self.negatives.size and not 0 <= self.negatives.min() <= self.negatives.max() < n_items:
            raise ArtifactIntegrityError("catalogue: negatives sample is out of range")
        order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[order]
        if n_items > 1 and (sorted_ids[1:] == sorted_ids[:-1]).any():
            raise ArtifactIntegrityError("catalogue: ids are not unique")
        object.__setattr__(self, "_id_order", order)
        object.__setattr__(self, "_sorted_ids", sorted_ids)
        # Gathered once: columns of an atom-major map are scattered reads, paid at load time.
        object.__setattr__(
            self, "_negative_rows", np.ascontiguousarray(self.projected[:, self.negatives].T)
        )

    @property
    def n_items(self) -> int:
        return int(self.projected.shape[1])

    @property
    def n_atoms(self) -> int:
        return int(self.projected.shape[0])

    def positions(self, ids: Sequence[str], what: str = "id") -> np.ndarray:
        """Catalogue positions of ``ids``, shape (n,); unknown ids raise InvalidInputError."""
        # As wide as the query needs: casting to the ids' width would cut longer ids to a match.
        wanted = np.asarray([str(i) for i in ids], dtype=str)
        if wanted.size == 0:
            return np.zeros(0, dtype=np.int64)
        at = np.searchsorted(self._sorted_ids, wanted)
        at_clipped = np.minimum(at, self.n_items - 1)
        found = (at < self.n_items) & (self._sorted_ids[at_clipped] == wanted)
        if not found.all():
            unknown = [str(i) for i in np.asarray(ids, dtype=object)[~found][:5]]
            more = "" if (~found).sum() <= 5 else f" (and {(~found).sum() - 5} more)"
            raise InvalidInputError(
                f"unknown catalogue {what}(s): {', '.join(map(repr, unknown))}{more}"
            )
        return self._id_order[at_clipped].astype(np.int64)

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """Projected items at ``positions``, shape (n, A)."""
        return np.ascontiguousarray(self.projected[:, positions].T, dtype=np.float64)

    def negative_rows(self, excluded: np.ndarray) -> np.ndarray:
        """The fixed negatives sample, without the items at ``excluded``, shape (n, A)."""
        keep = ~np.isin(self.negatives, excluded)
        return self._negative_rows[keep].astype(np.float64)

    def top(self, code: SparseCode, k: int, excluded: np.ndarray | None = None):
        """The ``k`` best items for ``code``: (positions, scores), best first."""
        return search_top_k(self.projected, code.atoms, code.weights, code.bias, k, excluded)


def write_catalogue(
    path: str | os.PathLike,
    model: UnionOfSubspacesModel,
    search_path: str | os.PathLike,
    ids: np.ndarray,
    fill_projected: Callable[[np.ndarray], None],
    labels: np.ndarray | None = None,
    n_negatives: int = DEFAULT_NEGATIVES,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a catalogue artifact; ``fill_projected`` writes ``D^T x`` into an (A, N) float32
    memory map, chunk by chunk, so memory stays bounded.

    Parameters
    ----------
    path : path-like
    model : UnionOfSubspacesModel
    search_path : path-like
        The search model's directory (its checksum is recorded).
    ids : ndarray of shape (N,)
        Unique item ids (stored as strings).
    fill_projected : callable
    labels : ndarray of shape (N,), optional
    n_negatives : int
        Size of the fixed random sample of negatives for learned codes.
    seed : int
    """
    ids = _narrow_strings(ids)
    n_items = len(ids)
    if n_items == 0:
        raise InvalidInputError("the catalogue is empty")
    sorted_ids = np.sort(ids)
    repeated = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if repeated.size:
        raise InvalidInputError(f"duplicate catalogue ids, e.g. {str(sorted_ids[repeated[0]])!r}")
    del sorted_ids
    negatives = _sample_positions(n_items, min(n_negatives, n_items), np.random.default_rng(seed))
    arrays: dict[str, Any] = {
        "projected": StreamedArray((model.n_atoms, n_items), np.dtype(np.float32), fill_projected),
        "ids": ids,
        "negatives": negatives.astype(np.int64),
    }
    if labels is not None:
        arrays["labels"] = _narrow_strings(labels)
    manifest = {
        "model_type": CATALOGUE_TYPE,
        "n_items": n_items,
        "n_atoms": model.n_atoms,
        "search_manifest_sha256": manifest_digest(search_path),
        "negatives_seed": seed,
        **(metadata or {}),
    }
    return write_artifact(path, manifest, arrays, overwrite=overwrite)


def _narrow_strings(values) -> np.ndarray:
    """As a Unicode array only as wide as its longest entry: ``np.arange(n).astype(str)`` is 21
    characters (84 bytes) an item, the ids of a large catalogue would take more than its rows."""
    values = np.asarray(values)
    if values.size and values.dtype.kind in "iu":
        width = max(len(str(values.min())), len(str(values.max())))
        return values.astype(f"<U{width}")
    if values.dtype.kind != "U":
        values = values.astype(str)
    width = int(np.char.str_len(values).max()) if values.size else 1
    return values.astype(f"<U{max(width, 1)}", copy=False)


def _sample_positions(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` distinct positions of ``0..n-1``, uniformly, in O(m) memory (Floyd's algorithm),
    sorted."""
    chosen: set[int] = set()
    for j in range(n - m, n):
        t = int(rng.integers(0, j + 1))
        chosen.add(j if t in chosen else t)
    return np.sort(np.fromiter(chosen, dtype=np.int64, count=m))


def read_catalogue(path: str | os.PathLike, search_path: str | os.PathLike) -> Catalogue:
    """Load a catalogue (``projected`` memory-mapped) built for the search model at
    ``search_path``."""
    artifact = read_artifact(path, mmap=frozenset({"projected"}))
    m, arrays = artifact.manifest, artifact.arrays
    if m.get("model_type") != CATALOGUE_TYPE:
        raise ArtifactError(f"{path}: model_type {m.get('model_type')!r} is not a catalogue")
    _check_parent(path, m, "search_manifest_sha256", manifest_digest(search_path), search_path)
    missing = sorted({"projected", "ids", "negatives"} - arrays.keys())
    if missing:
        raise ArtifactIntegrityError(f"{path}: arrays missing from manifest: {missing}")
    reserved = {"model_type", "schema_version", "format", "arrays"}
    return Catalogue(
        projected=arrays["projected"],
        ids=arrays["ids"],
        negatives=arrays["negatives"].astype(np.int64),
        labels=arrays.get("labels"),
        metadata={k: v for k, v in m.items() if k not in reserved},
    )


def sparse_svm_code(X: np.ndarray, y: np.ndarray, n_nonzero: int) -> SparseCode:
    """An l1-regularised linear SVM with at most ``n_nonzero`` weights.

    Walks the regularisation path (C growing geometrically) and keeps the last model with at
    most ``n_nonzero`` non-zeros. Pruning one l1 model to 5 non-zeros after the fact was much
    worse on digits: with 5 positives of each class, the top 20 held 72% of the class against
    97% along the path (36% against 92% with an untuned dictionary), because the large weights
    of a dense solution partly cancel each other. Classes are balanced: a few
    positives face many negatives.

    Parameters
    ----------
    X : ndarray of shape (n_samples, A)
    y : ndarray of shape (n_samples,)
        +1 for positives, -1 for negatives.
    n_nonzero : int

    Returns
    -------
    SparseCode
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC, l1_min_c

    chosen = None
    C = l1_min_c(X, y, loss="squared_hinge") if np.any(X) else 1.0
    for _ in range(LEARN_C_STEPS):
        svm = LinearSVC(
            penalty="l1", dual=False, C=C, class_weight="balanced", random_state=0, max_iter=2000
        )
        with warnings.catch_warnings():
            # Early points of the path need not converge tightly: only their support is used.
            warnings.simplefilter("ignore", ConvergenceWarning)
            svm.fit(X, y)
        nonzeros = np.count_nonzero(svm.coef_)
        if nonzeros > n_nonzero:
            if chosen is None:  # the first non-empty model is already too dense: prune it
                chosen = svm
            break
        if nonzeros:
            chosen = svm
        C *= LEARN_C_FACTOR
    if chosen is None:
        # Nothing separates the examples at all: rank by the most discriminative atom.
        gap = X[y > 0].mean(axis=0) - X[y < 0].mean(axis=0)
        best = int(np.argmax(np.abs(gap)))
        return SparseCode(np.array([best], dtype=np.int64), np.array([np.sign(gap[best])]), 0.0)
    return SparseCode.from_dense(chosen.coef_[0], float(chosen.intercept_[0]), n_nonzero)


@dataclass(frozen=True)
class SearchQuery:
    """One search: exactly one of a class, a code, or positive examples.

    Parameters
    ----------
    class_label : str, optional
    code : tuple of (indices, values), optional
    bias : float
        With ``code``.
    positives, negatives : sequence, optional
        Catalogue ids (strings or integers) or instances in the model's input shape.
        Negatives default to the catalogue's fixed random sample.
    top_k : int
    sparsity : int, optional
        Prune the code to this many non-zeros (the strongest kept).
    exclude : sequence of ids
    exclude_positives : bool
        Leave out positives given as ids.
    strongest_atoms : int
        Report this many of the code's strongest atoms, each with its best items.
    """

    class_label: str | None = None
    code: tuple[Sequence[int], Sequence[float]] | None = None
    bias: float = 0.0
    positives: Sequence[Any] | None = None
    negatives: Sequence[Any] | None = None
    top_k: int = 10
    sparsity: int | None = None
    exclude: Sequence[Any] = ()
    exclude_positives: bool = True
    strongest_atoms: int = 0


@dataclass(frozen=True)
class AtomReport:
    atom: int
    weight: float
    items: list[tuple[str, float]]


@dataclass(frozen=True)
class SearchResult:
    kind: str
    code: SparseCode
    items: list[tuple[str, float]]
    strongest_atoms: list[AtomReport]
    n_positives: int = 0
    n_negatives: int = 0


class SearchIndex:
    """A search model with its catalogue, answering :class:`SearchQuery`.

    Parameters
    ----------
    predictor : Predictor
        Computes the features of inputs given as examples.
    model : UnionOfSubspacesModel
    catalogue : Catalogue or None
        Without one, only the model's codes are known: searches are refused.
    """

    def __init__(
        self, predictor: Predictor, model: UnionOfSubspacesModel, catalogue: Catalogue | None
    ):
        self.predictor = predictor
        self.model = model
        self.catalogue = catalogue

    @classmethod
    def load(cls, model_dir: str | os.PathLike, predictor: Predictor) -> SearchIndex | None:
        """The search index under ``model_dir``, or None if the model has none."""
        model_path, catalogue_path = search_dir(model_dir), catalogue_dir(model_dir)
        if not model_path.exists():
            return None
        model = UnionOfSubspacesModel.load(model_path, model_dir)
        catalogue = None
        if catalogue_path.exists():
            catalogue = read_catalogue(catalogue_path, model_path)
            if catalogue.n_atoms != model.n_atoms:
                raise ArtifactIntegrityError(
                    f"{catalogue_path}: {catalogue.n_atoms} atoms, the dictionary has "
                    f"{model.n_atoms}"
                )
        return cls(predictor, model, catalogue)

    def require_catalogue(self) -> Catalogue:
        if self.catalogue is None:
            raise NotFoundError(
                f"model {self.predictor.name!r} has no catalogue to search: build one with "
                "python -m training index"
            )
        return self.catalogue

    def run(
        self, query: SearchQuery, max_top_k: int, max_examples: int | None = None
    ) -> SearchResult:
        """Answer one query.

        Parameters
        ----------
        query : SearchQuery
        max_top_k : int
            Most items a query may ask for.
        max_examples : int, optional
            Most positives and negatives together; more raise :class:`BatchTooLargeError`.

        Raises
        ------
        BatchTooLargeError
            More examples than ``max_examples``.
        InvalidInputError
            Unknown class or id, code indices out of range, top_k or sparsity out of bounds,
            empty positives, or not exactly one kind of query.
        NotFoundError
            No catalogue.
        """
        catalogue = self.require_catalogue()
        given = [q is not None for q in (query.class_label, query.code, query.positives)]
        if sum(given) != 1:
            raise InvalidInputError("send exactly one of class, code or positives")
        if not 1 <= query.top_k <= max_top_k:
            raise InvalidInputError(f"top_k must be between 1 and {max_top_k}, got {query.top_k}")
        if query.sparsity is not None and query.sparsity < 1:
            raise InvalidInputError(f"sparsity must be at least 1, got {query.sparsity}")
        if query.strongest_atoms < 0:
            raise InvalidInputError("strongest_atoms must be >= 0")
        examples = len(query.positives or ()) + len(query.negatives or ())
        if max_examples is not None and examples > max_examples:
            raise BatchTooLargeError(
                f"{examples} positives and negatives; the limit is {max_examples}"
            )
        excluded = [catalogue.positions(list(query.exclude), "id")]
        n_positives = n_negatives = 0
        if query.class_label is not None:
            kind, code = "class", self.model.class_code(str(query.class_label))
        elif query.code is not None:
            kind, code = "code", self.check_code(*query.code, bias=query.bias)
        else:
            kind = "positives"
            code, positive_positions, n_positives, n_negatives = self.learn_code(
                query.positives, query.negatives, query.sparsity
            )
            if query.exclude_positives:
                excluded.append(positive_positions)
        code = code.pruned(query.sparsity)
        excluded_positions = np.unique(np.concatenate(excluded)).astype(np.int64)
        positions, scores = catalogue.top(code, query.top_k, excluded_positions)
        return SearchResult(
            kind=kind,
            code=code,
            items=self._named(positions, scores),
            strongest_atoms=self.strongest_atoms(code, query.strongest_atoms),
            n_positives=n_positives,
            n_negatives=n_negatives,
        )

    def check_code(self, indices, values, bias: float = 0.0) -> SparseCode:
        """A client's code: indices in range and distinct, values finite, same lengths."""
        try:
            atoms = np.asarray(indices, dtype=np.int64)
            weights = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError("code indices must be integers and values numbers") from None
        if atoms.ndim != 1 or atoms.shape != weights.shape:
            raise InvalidInputError(
                f"code indices and values must be flat lists of one length, got "
                f"{atoms.shape} and {weights.shape}"
            )
        if atoms.size == 0:
            raise InvalidInputError("the code is empty: give at least one index and value")
        n_atoms = self.model.n_atoms
        bad = atoms[(atoms < 0) | (atoms >= n_atoms)]
        if bad.size:
            raise InvalidInputError(
                f"code index {int(bad[0])} is out of range: atoms are 0..{n_atoms - 1}"
            )
        if np.unique(atoms).size != atoms.size:
            raise InvalidInputError("code indices must be distinct")
        if not np.isfinite(weights).all() or not np.isfinite(bias):
            raise InvalidInputError("code values and bias must be finite numbers")
        dense = np.zeros(n_atoms)
        dense[atoms] = weights
        return SparseCode.from_dense(dense, bias)

    def learn_code(self, positives, negatives, sparsity: int | None):
        """Learn a code with D fixed, on precomputed rows (section "on-the-fly classes"): see
        :func:`sparse_svm_code`.

        Returns
        -------
        code : SparseCode
        positive_positions : ndarray of int64
            Catalogue positions of positives given as ids.
        n_positives, n_negatives : int
        """
        catalogue = self.require_catalogue()
        if not positives:
            raise InvalidInputError("positives is empty: give at least one id or instance")
        positive_rows, positive_positions = self._example_rows(positives, "positive")
        if negatives is None:
            negative_rows = catalogue.negative_rows(positive_positions)
        elif not negatives:
            raise InvalidInputError("negatives is empty: leave it out to use the default sample")
        else:
            negative_rows, _ = self._example_rows(negatives, "negative")
        if len(negative_rows) == 0:
            raise InvalidInputError("no negatives left: every sampled item is a positive")
        X = np.vstack([positive_rows, negative_rows])
        y = np.r_[np.ones(len(positive_rows)), -np.ones(len(negative_rows))]
        n_nonzero = sparsity or self.model.metadata.get("n_nonzero") or self.model.n_atoms
        code = sparse_svm_code(X, y, n_nonzero)
        return code, positive_positions, len(positive_rows), len(negative_rows)

    def _example_rows(self, examples: Sequence[Any], what: str):
        """Projected rows of examples: ids (str or int) from the catalogue, instances through
        the model's features and D^T."""
        catalogue = self.require_catalogue()
        ids = [e for e in examples if isinstance(e, str | int) and not isinstance(e, bool)]
        instances = [
            e for e in examples if not (isinstance(e, str | int) and not isinstance(e, bool))
        ]
        positions = catalogue.positions(ids, what) if ids else np.zeros(0, dtype=np.int64)
        rows = [catalogue.rows(positions)]
        if instances:
            X = self.predictor.validate(instances)
            features = search_features(self.predictor, self.model.feature_space, X)
            rows.append(self.model.project(features))
        return np.vstack(rows), positions

    def strongest_atoms(self, code: SparseCode, n: int) -> list[AtomReport]:
        """The code's ``n`` strongest atoms, each with the items it ranks highest (modality
        discovery: which modes of a class the atoms stand for)."""
        reports = []
        for atom, weight in zip(code.atoms[:n].tolist(), code.weights[:n].tolist(), strict=True):
            items = self.atom_items(atom, ITEMS_PER_ATOM, sign=1.0 if weight >= 0 else -1.0)
            reports.append(AtomReport(atom, weight, items))
        return reports

    def atom_items(self, atom: int, top_k: int, sign: float = 1.0) -> list[tuple[str, float]]:
        """The items scoring highest on one atom alone (attribute discovery)."""
        catalogue = self.require_catalogue()
        if not 0 <= atom < self.model.n_atoms:
            raise NotFoundError(f"no atom {atom}: atoms are 0..{self.model.n_atoms - 1}")
        code = SparseCode(np.array([atom], dtype=np.int64), np.array([sign]), 0.0)
        return self._named(*catalogue.top(code, top_k))

    def atom_classes(self, atom: int) -> list[tuple[str, float]]:
        """Classes whose code uses ``atom``, by decreasing ``|z|``."""
        row = self.model.codes[atom]
        order = np.argsort(-np.abs(row), kind="stable")
        return [(self.model.classes[k], float(row[k])) for k in order if row[k] != 0.0]

    def _named(self, positions: np.ndarray, scores: np.ndarray) -> list[tuple[str, float]]:
        ids = self.require_catalogue().ids[positions]
        return list(zip(ids.tolist(), scores.tolist(), strict=True))

    def warm_up(self) -> None:
        """Compile and page in the scoring path (serial and parallel) with the first class."""
        if self.catalogue is None:
            return
        code = self.model.class_code(self.model.classes[0])
        self.catalogue.top(code, 10)
        if code.n_nonzero:
            self.catalogue.top(code.pruned(1), 10)
