"""A search as a client asks it (:class:`SearchQuery`, its own rules checked when it is made),
ready to be ranked (:class:`PreparedQuery`), and its answer (:class:`SearchResult`): what
:class:`service.model.search.index.SearchIndex` takes and gives.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.model.errors import InvalidInputError
from service.model.search.catalogue import Catalogue, RankRequest
from service.model.search.codes import SparseCode
from service.model.search.filters import Filter
from service.model.search.pages import Cursor


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SearchQuery:
    """One search: exactly one of a class, a code, or positive examples.

    Parameters
    ----------
    class_label : str, optional
    code : tuple of (indices, values), optional
        Indices of shape (nnz,) and values of shape (nnz,); checked against the model by
        :meth:`SearchIndex.check_code`.
    bias : float
        With ``code``.
    positives, negatives : sequence, optional
        Catalogue ids (strings or integers) or instances in the model's input shape; neither may
        be empty. Negatives go with positives and default to the catalogue's fixed random sample.
    top_k : int
        At least 1; the catalogue may hold fewer.
    sparsity : int, optional
        Prune the code to this many non-zeros (the strongest kept), at least 1.
    exclude : sequence of ids
    exclude_positives : bool
        Leave out positives given as ids.
    strongest_atoms : int
        Report this many of the code's strongest atoms, each with its best items (>= 0).
    filter : dict or Filter, optional
        Only items whose attributes pass it (Qdrant's shape, see
        :mod:`service.model.search.filters`); parsed here, checked against the catalogue's
        attributes by :meth:`SearchIndex.run`.
    offset : int
        Skip this many of the best items (>= 0).
    cursor : str, optional
        A previous answer's ``next_cursor``: continue its ranking after its last item.
    allow_partial : bool
        Where shards are held elsewhere: answer without those that do not answer in time.

    Raises
    ------
    InvalidInputError
        Not exactly one of ``class_label``, ``code`` and ``positives``; ``negatives`` without
        ``positives``; empty ``positives`` or ``negatives``; ``top_k`` or ``sparsity`` below 1;
        ``strongest_atoms`` or ``offset`` below 0; a malformed filter or cursor.
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
    filter: Any = None
    offset: int = 0
    cursor: Any = None
    allow_partial: bool = False

    def __post_init__(self) -> None:
        given = [q is not None for q in (self.class_label, self.code, self.positives)]
        if sum(given) != 1:
            raise InvalidInputError("send exactly one of class, code or positives")
        if self.negatives is not None and self.positives is None:
            raise InvalidInputError("negatives go with positives")
        if self.positives is not None and len(self.positives) == 0:
            raise InvalidInputError("positives is empty: give at least one id or instance")
        if self.negatives is not None and len(self.negatives) == 0:
            raise InvalidInputError("negatives is empty: leave it out to use the default sample")
        if not _is_integer(self.top_k) or self.top_k < 1:
            raise InvalidInputError(f"top_k must be at least 1, got {self.top_k!r}")
        if self.sparsity is not None and (not _is_integer(self.sparsity) or self.sparsity < 1):
            raise InvalidInputError(f"sparsity must be at least 1, got {self.sparsity!r}")
        if not _is_integer(self.strongest_atoms) or self.strongest_atoms < 0:
            raise InvalidInputError(f"strongest_atoms must be >= 0, got {self.strongest_atoms!r}")
        if not _is_integer(self.offset) or self.offset < 0:
            raise InvalidInputError(f"offset must be >= 0, got {self.offset!r}")
        if self.filter is not None and not isinstance(self.filter, Filter):
            object.__setattr__(self, "filter", Filter.parse(self.filter))
        if self.cursor is not None and not isinstance(self.cursor, Cursor):
            object.__setattr__(self, "cursor", Cursor.decode(self.cursor))


@dataclass(frozen=True)
class AtomReport:
    """One of a code's strongest atoms.

    Parameters
    ----------
    atom : int
    weight : float
        Its weight in the code.
    items : list of (id, score), length <= ITEMS_PER_ATOM
        The items the atom alone ranks highest (lowest for a negative weight), best first.
    """

    atom: int
    weight: float
    items: list[tuple[str, float]]


@dataclass(frozen=True)
class SearchResult:
    """The answer to a :class:`SearchQuery`.

    Parameters
    ----------
    kind : {"class", "code", "positives"}
    code : SparseCode
        The code that ranked the items, pruned to the query's sparsity.
    items : list of (id, score), length <= top_k
        Best first.
    strongest_atoms : list of AtomReport, length <= strongest_atoms
    n_positives, n_negatives : int
        Examples a learned code was fitted on (0 for the other kinds).
    catalogue_version : int
        The catalogue version that answered.
    next_cursor : str or None
        Continues the ranking after the last item (None once fewer than top_k came back).
    missing_shards : tuple of str
        Shards left out of a partial answer.
    """

    kind: str
    code: SparseCode
    items: list[tuple[str, float]]
    strongest_atoms: list[AtomReport]
    n_positives: int = 0
    n_negatives: int = 0
    catalogue_version: int = 0
    next_cursor: str | None = None
    missing_shards: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class PreparedQuery:
    """A query ready to be ranked (see :meth:`SearchIndex.prepare`): all it needs of the model
    and the catalogue is settled, its ranking is not made yet (alone or in a batch).

    Parameters
    ----------
    query : SearchQuery
    catalogue : Catalogue
        The version it is checked against and ranked in.
    kind : {"class", "code", "positives"}
    code : SparseCode
        Pruned to the query's sparsity.
    excluded : ndarray, int64
        Sorted unique global positions it never returns.
    digest : str
        Its ranking's identity (see :func:`service.model.search.pages.query_digest`).
    after : (float, int) or None
        Its cursor's last item.
    n_positives, n_negatives : int
    """

    query: SearchQuery
    catalogue: Catalogue
    kind: str
    code: SparseCode
    excluded: np.ndarray
    digest: str
    after: tuple[float, int] | None
    n_positives: int
    n_negatives: int

    def rank_request(self) -> RankRequest:
        """What its ranking asks of the catalogue: the best offset + top_k items."""
        return RankRequest(
            self.code, self.query.offset + self.query.top_k, self.excluded, self.query.filter,
            self.after,
        )  # fmt: skip
