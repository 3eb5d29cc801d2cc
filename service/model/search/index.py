"""Queries over a search model and its catalogue: by class, by a client's code, or by a code
learned on the fly from positive (and optionally negative) examples.

The rules that belong to a query itself (one kind of query, counts at least 1, non-empty example
lists) are checked once, when a :class:`SearchQuery` is made; :meth:`SearchIndex.run` checks what
needs the model and the catalogue (classes, ids, atoms, instance shapes). Serving limits (how
many items or examples a client may ask for) are the HTTP layer's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.model.errors import (
    ArtifactIntegrityError,
    InvalidInputError,
    NotFoundError,
    brief,
    located,
)
from service.model.kernels.search import search_many_bytes, search_runs_serially
from service.model.predictor import Predictor
from service.model.search.catalogue import Catalogue, Ranking, RankRequest
from service.model.search.codes import SparseCode, sparse_svm_code
from service.model.search.copies import NO_PROGRESS, Progress
from service.model.search.filters import AttributeLimits
from service.model.search.layout import catalogue_dir, search_dir
from service.model.search.model import UnionOfSubspacesModel, prepared_search_features
from service.model.search.pages import Cursor, query_digest
from service.model.search.queries import AtomReport, PreparedQuery, SearchQuery, SearchResult
from service.model.search.remote import CatalogueSource
from service.model.search.snapshots import (
    Snapshot,
    restore_model_catalogue,
    snapshot_model_catalogue,
)
from service.model.search.store import CatalogueUpdate, CommitGate
from service.model.search.versions import UpdateResult, check_ids, rows_filler

# Bound on a client code's values and bias: with float32 catalogue entries (at most 3.4e38) and
# at most A terms, no score can overflow to infinity (which JSON cannot carry).
MAX_CODE_MAGNITUDE = 1e100
# Bytes per item and attribute key of an upsert's columns while they are built: a float64 entry
# and a list's reference per item and key (string columns take less: int32 codes).
UPSERT_BYTES_PER_VALUE = 16
ITEMS_PER_ATOM = 5
WARM_UP_POSITIVES = 2


class SearchIndex:
    """A search model with its catalogue, answering :class:`SearchQuery`.

    Parameters
    ----------
    predictor : Predictor
        Computes the features of inputs given as examples.
    model : UnionOfSubspacesModel
    catalogue : Catalogue or None
        Without one, only the model's codes are known: searches are refused.
    model_dir : path-like, optional
        Where the model lives: updates of the catalogue are written there.
    answers_elsewhere : bool
        The catalogue's shards are searched by other processes (a cluster's workers): a query
        waits for them, and must never run on an event loop.
    """

    def __init__(
        self,
        predictor: Predictor,
        model: UnionOfSubspacesModel,
        catalogue: Catalogue | None,
        model_dir: str | os.PathLike | None = None,
        answers_elsewhere: bool = False,
    ):
        self.predictor = predictor
        self.model = model
        self.catalogue = catalogue
        self.model_dir = None if model_dir is None else Path(model_dir)
        self.answers_elsewhere = answers_elsewhere

    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike,
        predictor: Predictor,
        reuse: SearchIndex | None = None,
        source: CatalogueSource | None = None,
    ) -> SearchIndex | None:
        """The search index under ``model_dir``, or None if the model has none.

        Parameters
        ----------
        model_dir : path-like
        predictor : Predictor
        reuse : SearchIndex, optional
            The index loaded before from the same model (the one served): its search model
            is kept if its manifest is unchanged, and the catalogue shards it holds are taken
            as they are (a new catalogue version loads only its new shards).
        source : CatalogueSource, optional
            Where the catalogue's shards are searched; default: in this process.
        """
        model_path, catalogue_path = search_dir(model_dir), catalogue_dir(model_dir)
        if not model_path.exists():
            return None
        model = UnionOfSubspacesModel.load(model_path, model_dir)
        source = source or CatalogueSource()
        catalogue = None
        if catalogue_path.exists():
            previous = None if reuse is None else reuse.catalogue
            catalogue = source.open(catalogue_path, model_path, previous)
            if catalogue.n_atoms != model.n_atoms:
                raise ArtifactIntegrityError(
                    f"{catalogue_path}: {catalogue.n_atoms} atoms, the dictionary has "
                    f"{model.n_atoms}"
                )
        return cls(predictor, model, catalogue, model_dir, source.remote)

    def require_catalogue(self) -> Catalogue:
        if self.catalogue is None:
            raise NotFoundError(
                f"model {self.predictor.name!r} has no catalogue to search: build one with "
                "python -m training index"
            )
        return self.catalogue

    def runs_serially(self, query: SearchQuery) -> bool:
        """Whether :meth:`run` of ``query`` stays on the calling thread: no parallel region
        (at most A non-zeros over the catalogue, one atom per strongest atom) and no code to
        learn. False without a catalogue: such a query fails anyway."""
        if self.catalogue is None or query.positives is not None:
            return False
        if self.answers_elsewhere:
            return True  # no parallel region here: the shards are searched elsewhere
        return search_runs_serially(self.model.n_atoms, self.catalogue.n_positions)

    def batch_runs_serially(self, queries: Sequence[SearchQuery]) -> bool:
        """Whether :meth:`run_many` of ``queries`` stays on the calling thread (see
        :meth:`runs_serially`): every query would, and all of them together read fewer entries
        than a parallel region is worth."""
        if not all(self.runs_serially(query) for query in queries):
            return False
        if self.answers_elsewhere:
            return True
        assert self.catalogue is not None  # runs_serially is False without one
        return search_runs_serially(self.model.n_atoms * len(queries), self.catalogue.n_positions)

    def batch_bytes(self, queries: Sequence[SearchQuery]) -> int:
        """Bytes :meth:`run_many` holds for ``queries`` while it ranks them (see
        :func:`service.model.kernels.search.search_many_bytes`): the bitmap of each distinct
        filter over the catalogue (built on the workers, for shards held elsewhere) and each
        query's heaps."""
        catalogue = self.require_catalogue()
        filters = {query.filter.canonical() for query in queries if query.filter is not None}
        return search_many_bytes(
            0 if self.answers_elsewhere else len(filters),
            catalogue.n_positions,
            sum(query.offset + query.top_k for query in queries),
        )

    def run(self, query: SearchQuery) -> SearchResult:
        """Answer one query (its own rules were checked when it was made).

        Parameters
        ----------
        query : SearchQuery

        Returns
        -------
        SearchResult

        Raises
        ------
        InvalidInputError
            Unknown class or id, code indices out of range or repeated, non-finite code values,
            or instances not in the model's input shape.
        NotFoundError
            No catalogue.
        """
        prepared = self.prepare(query)
        request = prepared.rank_request()
        ranking = prepared.catalogue.top(
            request.code, request.k, request.excluded, request.query_filter, request.after,
            query.allow_partial,
        )  # fmt: skip
        return self.finish(prepared, ranking)

    def run_many(self, queries: Sequence[SearchQuery]) -> list[SearchResult]:
        """Answer a batch of queries, each exactly as :meth:`run` answers it alone, from one
        catalogue version and one pass over its shards (see :meth:`Catalogue.top_many`).

        Every query is checked before any is ranked: the first that fails fails the batch, its
        error naming it (``searches[3]: ...``), and nothing is ranked.

        Parameters
        ----------
        queries : sequence of SearchQuery

        Returns
        -------
        list of SearchResult
            In the order of ``queries``.
        """
        prepared = []
        for i, query in enumerate(queries):
            with located(f"searches[{i}]"):
                prepared.append(self.prepare(query))
        catalogue = self.require_catalogue()
        # Shards held elsewhere answer the batch at once: it is partial only if every query
        # allows it.
        allow_partial = all(query.allow_partial for query in queries)
        rankings = catalogue.top_many([p.rank_request() for p in prepared], allow_partial)
        return [self.finish(p, r) for p, r in zip(prepared, rankings, strict=True)]

    def prepare(self, query: SearchQuery) -> PreparedQuery:
        """Everything of ``query`` that needs the model and the catalogue but not a ranking: its
        code (learned from examples if need be), the positions it excludes, its cursor checked.

        Raises
        ------
        InvalidInputError, NotFoundError, VersionConflictError
            See :meth:`run`; a cursor of another catalogue version.
        """
        catalogue = self.require_catalogue()
        if query.filter is not None:
            catalogue.check_filter(query.filter)
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
        digest = query_digest(code, query.filter, excluded_positions)
        after = None
        if query.cursor is not None:
            query.cursor.check(catalogue.digest, catalogue.version, catalogue.n_positions, digest)
            after = (query.cursor.after_sum, query.cursor.after_position)
        return PreparedQuery(
            query, catalogue, kind, code, excluded_positions, digest, after, n_positives,
            n_negatives,
        )  # fmt: skip

    def finish(self, prepared: PreparedQuery, ranking: Ranking) -> SearchResult:
        """The answer to a prepared query from its ranking: its page, scores and next cursor,
        and the strongest atoms it asked for."""
        query, catalogue, code = prepared.query, prepared.catalogue, prepared.code
        page = slice(query.offset, None)
        positions, sums = ranking.positions[page], ranking.sums[page]
        next_cursor = None
        if len(positions) == query.top_k:
            last = Cursor(catalogue.digest, catalogue.version, float(sums[-1]),
                          int(positions[-1]), prepared.digest)  # fmt: skip
            next_cursor = last.encode()
        scores = (code.bias + sums).tolist()
        return SearchResult(
            kind=prepared.kind,
            code=code,
            items=list(zip(ranking.ids[page], scores, strict=True)),
            strongest_atoms=self.strongest_atoms(code, query.strongest_atoms),
            n_positives=prepared.n_positives,
            n_negatives=prepared.n_negatives,
            catalogue_version=catalogue.version,
            next_cursor=next_cursor,
            missing_shards=ranking.missing_shards,
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
        if np.abs(weights).max() > MAX_CODE_MAGNITUDE or abs(bias) > MAX_CODE_MAGNITUDE:
            raise InvalidInputError(
                f"code values and bias must be at most {MAX_CODE_MAGNITUDE:g} in magnitude"
            )
        dense = np.zeros(n_atoms)
        dense[atoms] = weights
        return SparseCode.from_dense(dense, bias)

    def learn_code(self, positives, negatives, sparsity: int | None):
        """Learn a code with D fixed, on precomputed rows (section "on-the-fly classes"): see
        :func:`sparse_svm_code`.

        Parameters
        ----------
        positives : sequence, non-empty
            Catalogue ids (str or int) or instances in the model's input shape.
        negatives : sequence or None
            The same kinds; None for the catalogue's fixed sample less the positives.
        sparsity : int or None
            Most non-zeros of the code; None for the model's ``n_nonzero``.

        Returns
        -------
        code : SparseCode
        positive_positions : ndarray of shape (n_positive_ids,), int64
            Catalogue positions of positives given as ids.
        n_positives, n_negatives : int
        """
        catalogue = self.require_catalogue()
        if len(positives) == 0:  # a SearchQuery never holds one; direct callers may
            raise InvalidInputError("positives is empty: give at least one id or instance")
        _refuse_shared_ids(positives, negatives)
        positive_rows, positive_positions = self._example_rows(positives, "positive")
        if negatives is None:
            negative_rows = catalogue.negative_rows(positive_positions)
        elif len(negatives) == 0:
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
        the model's features and D^T.

        Returns
        -------
        rows : ndarray of shape (len(examples), A)
            The ids' rows first, then the instances'.
        positions : ndarray of shape (n_ids,), int64
            Catalogue positions of the ids.
        """
        catalogue = self.require_catalogue()
        is_id = [isinstance(e, str | int) and not isinstance(e, bool) for e in examples]
        ids = [e for e, an_id in zip(examples, is_id, strict=True) if an_id]
        instances = [e for e, an_id in zip(examples, is_id, strict=True) if not an_id]
        positions = catalogue.positions(ids, what) if ids else np.zeros(0, dtype=np.int64)
        rows = [catalogue.rows(positions)]
        if instances:
            names = [f"{what}s[{j}]" for j, an_id in enumerate(is_id) if not an_id]
            _, items = self.predictor.validate_prepared(instances, names)
            features = prepared_search_features(self.predictor, self.model.feature_space, items)
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
        ranking = catalogue.top(code, top_k)
        return list(zip(ranking.ids, ranking.sums.tolist(), strict=True))

    def atom_classes(self, atom: int) -> list[tuple[str, float]]:
        """Classes whose code uses ``atom``, by decreasing ``|z|``."""
        row = self.model.codes[atom]
        order = np.argsort(-np.abs(row), kind="stable")
        return [(self.model.classes[k], float(row[k])) for k in order if row[k] != 0.0]

    # -- updates -------------------------------------------------------------------------------

    def project_instances(self, instances: Sequence[Any], what: str = "instances") -> np.ndarray:
        """``D^T x`` of instances in the model's input shape, shape (n, A), float64; malformed
        instances raise InvalidInputError naming them (``instances[3]``)."""
        names = [f"{what}[{j}]" for j in range(len(instances))]
        _, items = self.predictor.validate_prepared(list(instances), names)
        features = prepared_search_features(self.predictor, self.model.feature_space, items)
        rows = self.model.project(features)
        bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
        if bad.size:
            raise InvalidInputError(f"{what}[{int(bad[0])}] has non-finite features")
        return rows

    def _model_dir(self) -> Path:
        if self.model_dir is None:
            raise NotFoundError("this search index was not loaded from a model directory")
        return self.model_dir

    def _update(self, gate: CommitGate | None = None) -> CatalogueUpdate:
        model_dir = self._model_dir()
        return CatalogueUpdate(
            catalogue_dir(model_dir), search_dir(model_dir), self.model.n_atoms,
            reuse=self.catalogue, gate=gate,
        )  # fmt: skip

    def upsert_bytes(
        self,
        n_items: int,
        attributes: Sequence[dict[str, Any] | None] | None = None,
        limits: AttributeLimits | None = None,
    ) -> int:
        """Memory an upsert of ``n_items`` items with ``attributes`` takes beyond its request,
        at most: the instances and their features (float64), their projections (float64,
        then float32), and a column per distinct key (an entry and a reference per item while
        it is built). Keys beyond ``limits`` (against the version served) are refused first.

        Returns
        -------
        int

        Raises
        ------
        InvalidInputError
            Keys beyond ``limits``.
        """
        records = list(attributes or ())
        if limits is not None:
            served = {} if self.catalogue is None else self.catalogue.attributes
            limits.check(records, served, "items")
        n_keys = len({key for record in records if isinstance(record, dict) for key in record})
        inputs = self.predictor.input_spec.n_features
        per_item = 8 * (inputs + self.model.n_features) + 12 * self.model.n_atoms
        return n_items * (per_item + UPSERT_BYTES_PER_VALUE * n_keys)

    def upsert(
        self,
        ids: Sequence[Any],
        instances: Sequence[Any],
        attributes: Sequence[dict[str, Any] | None] | None = None,
        limits: AttributeLimits | None = None,
        gate: CommitGate | None = None,
    ) -> UpdateResult:
        """Project ``instances`` and add them to the catalogue as a new shard, under ``ids``;
        items already there under those ids are replaced (see
        :meth:`service.model.search.store.CatalogueUpdate.upsert`). Returns once the new
        version is on disk; this index keeps answering from the version it holds.

        Parameters
        ----------
        ids, instances : sequence
        attributes : sequence of dict or None, optional
        limits : AttributeLimits, optional
            On the attributes' keys: checked against the version served before any instance
            is projected (see :meth:`upsert_bytes`), and against the newest on disk before the
            version is written.
        gate : CommitGate, optional
            Asked before the version is committed (see
            :class:`~service.model.search.store.CommitGate`).

        Raises
        ------
        InvalidInputError
            Ids and instances of other lengths, empty or repeated ids, malformed instances,
            attributes of the wrong kind, keys beyond ``limits``.
        ChangeAbandonedError
            ``gate`` was abandoned before the commit: nothing was applied.
        """
        if not len(ids):
            raise InvalidInputError("ids is empty: give at least one item")
        if len(ids) != len(instances):
            raise InvalidInputError(f"{len(ids)} ids but {len(instances)} instances")
        if attributes is not None and len(attributes) != len(ids):
            raise InvalidInputError(f"{len(ids)} ids but {len(attributes)} attributes")
        check_ids(ids)
        self.upsert_bytes(len(ids), attributes, limits)  # refuses keys beyond the limits now
        rows = self.project_instances(instances).astype(np.float32)
        with self._update(gate) as update:
            return update.upsert(ids, rows_filler(rows), attributes, limits=limits)

    def delete(self, ids: Sequence[Any], gate: CommitGate | None = None) -> UpdateResult:
        """Remove the items of ``ids`` from the catalogue (a new version, on disk when this
        returns, unless ``gate`` was abandoned first); ids it lacks are reported in the
        result."""
        self.require_catalogue()
        with self._update(gate) as update:
            return update.delete(ids)

    def snapshot(self, out: str | os.PathLike, progress: Progress = NO_PROGRESS) -> Snapshot:
        """Write a snapshot of the newest catalogue version on disk to ``out`` (see
        :func:`service.model.search.snapshots.take_snapshot`)."""
        return snapshot_model_catalogue(self._model_dir(), out, progress)

    def restore(
        self, snapshot: str | os.PathLike, progress: Progress = NO_PROGRESS
    ) -> UpdateResult:
        """Verify the snapshot at ``snapshot`` and make its version the catalogue's newest (see
        :func:`service.model.search.snapshots.restore_snapshot`); on disk when this returns,
        served by this index's successor."""
        _, result = restore_model_catalogue(snapshot, self._model_dir(), progress)
        return result

    def warm_up(self) -> None:
        """Make the first query of every kind as fast as the next: compile and page in the
        scoring path (serial and parallel, one query and a batch) with the first class, and
        learn one code from the first live items as positives (the path solver's first call
        otherwise loads its compiled code)."""
        catalogue = self.catalogue
        if catalogue is None:
            return
        code = self.model.class_code(self.model.classes[0])
        catalogue.top(code, 10)
        if code.n_nonzero:
            catalogue.top(code.pruned(1), 10)
        catalogue.top_many([RankRequest(code, 10), RankRequest(code.pruned(1), 10)])
        positions = catalogue.negatives[:WARM_UP_POSITIVES]
        positives = catalogue.rows(positions)
        negatives = catalogue.negative_rows(positions)
        if not len(negatives):
            # A catalogue no larger than that: every sampled item is a positive.
            negatives = -positives
        X = np.vstack([positives, negatives])
        y = np.r_[np.ones(len(positives)), -np.ones(len(negatives))]
        n_nonzero = self.model.metadata.get("n_nonzero") or self.model.n_atoms
        # The same rows on both sides (an all-zero catalogue) are refused, compiled all the same.
        with contextlib.suppress(InvalidInputError):
            sparse_svm_code(X, y, n_nonzero)


def _example_ids(examples: Sequence[Any] | None) -> set[str]:
    """The catalogue ids among examples (strings or integers), as strings."""
    return {str(e) for e in examples or () if isinstance(e, str | int) and not isinstance(e, bool)}


def _refuse_shared_ids(positives: Sequence[Any], negatives: Sequence[Any] | None) -> None:
    """An id among both positives and negatives makes the code meaningless: InvalidInputError
    naming it."""
    shared = sorted(_example_ids(positives) & _example_ids(negatives))
    if shared:
        named = ", ".join(brief(i) for i in shared[:5])
        more = "" if len(shared) <= 5 else f" (and {len(shared) - 5} more)"
        raise InvalidInputError(
            f"id(s) among both positives and negatives: {named}{more}; an item is one or the other"
        )
