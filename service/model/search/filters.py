"""Item attributes and the filters that restrict a search to some of them.

Items carry attributes, strings or numbers, by key: ``{"source": "scan", "year": 2021}``. A
catalogue knows the kind of each key (its *schema*); an item may lack a key.

A filter has Qdrant's shape, which its users already write::

    {"must": [{"key": "source", "match": {"value": "scan"}}],
     "must_not": [{"key": "year", "range": {"lt": 2000}}],
     "should": [{"key": "colour", "match": {"any": ["red", "blue"]}}, {"must": [...]}]}

``must``: every clause holds; ``must_not``: none does; ``should``: at least one does (when
given). A clause is a condition (``match.value``, ``match.any``, or ``range`` with ``gt``,
``gte``, ``lt``, ``lte``, numbers only) or a nested filter. A condition on a key the item lacks
does not hold.

A filter becomes one bit per item inside the scoring kernel: each condition's bits are computed
once per shard (shards never change) and kept (:class:`ConditionCache`), and a request only
combines them, word by word.
"""

from __future__ import annotations

import json
import math
import numbers
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.model.errors import ArtifactIntegrityError, InvalidInputError, brief

ATTRIBUTE_KINDS = ("string", "number")
# Bounds on what one filter may ask: conditions in all, nesting, values of one match.any.
MAX_CONDITIONS = 64
MAX_DEPTH = 4
MAX_ANY_VALUES = 1024
# Longest attribute key, and conditions kept per shard (least recently used dropped first).
MAX_KEY_LENGTH = 128
# Default bounds on distinct attribute keys: of one item, and of a whole catalogue (each key of
# a shard is a column, one or two files, and a catalogue's manifest lists every key).
DEFAULT_ITEM_ATTRIBUTES = 32
DEFAULT_CATALOGUE_ATTRIBUTES = 256
CONDITIONS_KEPT_PER_SHARD = 256
RANGE_BOUNDS = ("gt", "gte", "lt", "lte")
# What no id or string attribute holds: numpy's strings drop it from their end, so "a\0" would
# be stored, and matched, as "a".
NUL = "\0"


# -- columns -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StringColumn:
    """One string attribute of a shard's items.

    Parameters
    ----------
    codes : ndarray of shape (n,), int32
        Index into ``values``, -1 where the item lacks the attribute.
    values : ndarray of shape (n_values,), str
        Sorted, distinct.
    """

    codes: np.ndarray
    values: np.ndarray
    kind = "string"

    def equal(self, value: str) -> np.ndarray:
        at = int(np.searchsorted(self.values, value))
        if at < len(self.values) and self.values[at] == value:
            return self.codes == at
        return np.zeros(self.codes.shape, dtype=bool)

    def any_of(self, values: Sequence[str]) -> np.ndarray:
        wanted = np.asarray(values, dtype=str)
        at = np.searchsorted(self.values, wanted)
        inside = at < len(self.values)
        present = at[inside][self.values[at[inside]] == wanted[inside]]
        return np.isin(self.codes, present)

    def any_held(self) -> bool:
        """Whether some item has the attribute."""
        return bool((self.codes >= 0).any())

    def value_at(self, j: int) -> str | None:
        code = int(self.codes[j])
        return None if code < 0 else str(self.values[code])

    def tally(self, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The values the items of ``mask`` (None: every item) have, and how many have each;
        the values sorted."""
        codes = self.codes if mask is None else self.codes[mask]
        counts = np.bincount(codes[codes >= 0], minlength=len(self.values))
        held = counts > 0
        return self.values[held], counts[held].astype(np.int64)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        return {f"{name}_codes": self.codes, f"{name}_values": self.values}


@dataclass(frozen=True, eq=False)
class NumberColumn:
    """One numeric attribute of a shard's items: float64, NaN where the item lacks it."""

    values: np.ndarray
    kind = "number"

    def equal(self, value: float) -> np.ndarray:
        return self.values == value

    def any_of(self, values: Sequence[float]) -> np.ndarray:
        return np.isin(self.values, np.asarray(values, dtype=np.float64))

    def within(self, bounds: Mapping[str, float]) -> np.ndarray:
        values = self.values
        held = ~np.isnan(values)
        compare = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}
        for name, bound in bounds.items():
            held &= compare[name](values, bound)
        return held

    def any_held(self) -> bool:
        """Whether some item has the attribute."""
        return bool((~np.isnan(self.values)).any())

    def value_at(self, j: int) -> float | None:
        value = float(self.values[j])
        return None if math.isnan(value) else value

    def tally(self, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`StringColumn.tally`."""
        values = self.values if mask is None else self.values[mask]
        values, counts = np.unique(values[~np.isnan(values)], return_counts=True)
        return values, counts.astype(np.int64)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        return {name: self.values}


Column = StringColumn | NumberColumn


@dataclass(frozen=True)
class AttributeLimits:
    """How many distinct attribute keys one item (``per_item``), and one catalogue
    (``per_catalogue``), may have; ``item_setting`` and ``catalogue_setting`` are what the
    limits are called where they are set, for messages (the service's settings)."""

    per_item: int = DEFAULT_ITEM_ATTRIBUTES
    per_catalogue: int = DEFAULT_CATALOGUE_ATTRIBUTES
    item_setting: str = "the limit"
    catalogue_setting: str = "the limit"

    def check(
        self, records: Sequence[Mapping[str, Any] | None], schema: Mapping[str, str], what: str
    ) -> None:
        """InvalidInputError for a record with more keys than :attr:`per_item`, or keys that
        would take the catalogue (``schema``) beyond :attr:`per_catalogue`, naming the first
        of them; before any record is looked at further."""
        new: dict[str, None] = {}
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                continue
            if len(record) > self.per_item:
                raise InvalidInputError(
                    f"{what}: attributes[{i}] has {len(record):,} keys; an item has at most "
                    f"{self.per_item} ({self.item_setting})"
                )
            for key in record:
                if key not in schema:
                    new[key] = None
            if len(schema) + len(new) > self.per_catalogue:
                first = next(iter(new))
                raise InvalidInputError(
                    f"{what}: attributes[{i}] takes the catalogue beyond "
                    f"{self.per_catalogue} attribute keys ({self.catalogue_setting}): it has "
                    f"{len(schema)}, and these items add {len(new):,} more, the first "
                    f"{brief(first)}; use the keys it has (GET .../catalogue lists them)"
                )


def column_from_arrays(kind: str, name: str, arrays: Mapping[str, np.ndarray], n: int) -> Column:
    """The column stored as ``name``'s arrays (see :meth:`StringColumn.arrays`)."""
    try:
        if kind == "string":
            codes, values = arrays[f"{name}_codes"], arrays[f"{name}_values"]
            if codes.shape != (n,) or codes.dtype != np.int32 or values.dtype.kind != "U":
                raise ValueError("shapes or types")
            if codes.size and (codes.min() < -1 or codes.max() >= len(values)):
                raise ValueError("codes out of range")
            return StringColumn(codes, values)
        if kind == "number":
            values = arrays[name]
            if values.shape != (n,) or values.dtype != np.float64:
                raise ValueError("shapes or types")
            return NumberColumn(values)
    except (KeyError, ValueError) as error:
        raise ArtifactIntegrityError(f"attribute column {name}: {error}") from None
    raise ArtifactIntegrityError(f"attribute column {name}: unknown kind {kind!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_key(key: Any, where: str) -> str:
    """An attribute key: a non-empty string of at most :data:`MAX_KEY_LENGTH` characters."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInputError(
            f"{where}: attribute keys are non-empty strings of at most {MAX_KEY_LENGTH} "
            f"characters, got {brief(key)}"
        )
    return key


def kind_of(value: Any, where: str) -> str:
    """``string`` (without NUL characters, which numpy's strings would drop from the end) or
    ``number`` (finite) for an attribute value; InvalidInputError otherwise."""
    if isinstance(value, str):
        if NUL in value:
            raise InvalidInputError(f"{where}: attribute strings hold no NUL character (U+0000)")
        return "string"
    if _is_number(value):
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an integer beyond any float (JSON has no bound on digits)
            finite = False
        if not finite:
            raise InvalidInputError(
                f"{where}: attribute numbers must be finite floats, got {brief(value)}"
            )
        return "number"
    raise InvalidInputError(f"{where}: attribute values are strings or numbers, got {brief(value)}")


def columns_from_records(
    records: Sequence[Mapping[str, Any] | None],
    schema: Mapping[str, str],
    what: str = "items",
    limits: AttributeLimits | None = None,
) -> tuple[dict[str, str], dict[str, Column]]:
    """Attribute columns of ``len(records)`` items, one mapping (or None) per item.

    Parameters
    ----------
    records : sequence of mapping or None
    schema : mapping of key to kind
        The kinds already known (a catalogue's): a key must keep its kind.
    what : str
        How the items are named in messages (``attributes[3]`` of ``what``).
    limits : AttributeLimits, optional
        Checked first; default: none.

    Returns
    -------
    kinds : dict of key to kind
        Of the keys these records use.
    columns : dict of key to Column

    Raises
    ------
    InvalidInputError
        A record that is not an object, a bad key, a value neither string nor finite number, a
        key whose values are of two kinds (here, or against ``schema``), or keys beyond
        ``limits``.
    """
    if limits is not None:
        limits.check(records, schema, what)
    kinds: dict[str, str] = {}
    for i, record in enumerate(records):
        if record is None:
            continue
        where = f"{what}: attributes[{i}]"
        if not isinstance(record, Mapping):
            raise InvalidInputError(f"{where} must be an object of attributes, got {brief(record)}")
        for key, value in record.items():
            check_key(key, where)
            if value is None:
                continue
            kind = kind_of(value, f"{where}[{key!r}]")
            known = kinds.get(key, schema.get(key))
            if known is not None and known != kind:
                raise InvalidInputError(
                    f"{where}[{key!r}] is a {kind}, but attribute {key!r} holds {known}s"
                )
            kinds[key] = kind
    columns: dict[str, Column] = {}
    for key, kind in kinds.items():
        values = [None if r is None else r.get(key) for r in records]
        if kind == "number":
            columns[key] = NumberColumn(
                np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
            )
        else:
            present = sorted({v for v in values if v is not None})
            index = {v: i for i, v in enumerate(present)}
            codes = np.array([-1 if v is None else index[v] for v in values], dtype=np.int32)
            width = max((len(v) for v in present), default=1) or 1
            columns[key] = StringColumn(codes, np.array(present, dtype=f"<U{width}"))
    return kinds, columns


def merged_schema(schema: Mapping[str, str], kinds: Mapping[str, str]) -> dict[str, str]:
    """``schema`` with the keys of ``kinds`` added; InvalidInputError if a key changes kind."""
    merged = dict(schema)
    for key, kind in kinds.items():
        if merged.setdefault(key, kind) != kind:
            raise InvalidInputError(f"attribute {key!r} holds {merged[key]}s, not {kind}s")
    return merged


# -- bits --------------------------------------------------------------------------------------


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """One bit per item, item j at bit ``j % 64`` of word ``j // 64``: the kernels' layout."""
    packed = np.packbits(mask, bitorder="little")
    return np.pad(packed, (0, -packed.size % 8)).view(np.uint64)


def unpack_bits(words: np.ndarray, n: int) -> np.ndarray:
    """The mask of ``n`` items whose bits :func:`pack_bits` packed into ``words``."""
    return np.unpackbits(words.view(np.uint8), count=n, bitorder="little").view(bool)


def count_bits(words: np.ndarray) -> int:
    """The set bits of a bitmap."""
    return int(np.bitwise_count(words).sum())


def merge_tallies(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], limit: int
) -> tuple[list[Any], list[int], int]:
    """Counts per value summed over parts (each values and counts, see
    :meth:`StringColumn.tally`): the ``limit`` values with the most items, most first (ties by
    value), their counts, and the number of distinct values in all.

    Parameters
    ----------
    parts : sequence of (ndarray of shape (n_i,), ndarray of shape (n_i,) int64)
        Values of one kind (strings or numbers).
    limit : int
        At least 1.
    """
    parts = [(values, counts) for values, counts in parts if len(values)]
    if not parts:
        return [], [], 0
    values, at = np.unique(np.concatenate([v for v, _ in parts]), return_inverse=True)
    counts = np.bincount(at, weights=np.concatenate([c for _, c in parts]), minlength=len(values))
    counts = counts.astype(np.int64)
    order = np.lexsort((np.arange(len(values)), -counts))[:limit]
    return values[order].tolist(), counts[order].tolist(), len(values)


def all_bits(n: int) -> np.ndarray:
    """``n`` set bits in the kernels' layout (the unused bits of the last word clear)."""
    return pack_bits(np.ones(n, dtype=bool))


class ConditionCache:
    """Each condition's bits over one shard, computed once and kept (least recently used
    dropped past :data:`CONDITIONS_KEPT_PER_SHARD`); safe to use from several threads."""

    def __init__(self) -> None:
        self._bits: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
        with self._lock:
            bits = self._bits.get(key)
            if bits is not None:
                self._bits.move_to_end(key)
                return bits
        bits = compute()
        bits.flags.writeable = False
        with self._lock:
            self._bits[key] = bits
            while len(self._bits) > CONDITIONS_KEPT_PER_SHARD:
                self._bits.popitem(last=False)
        return bits


# -- filters -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """One condition on one attribute: ``match`` a value, ``any`` of values, or a ``range``.

    Parameters
    ----------
    key : str
    operator : {"value", "any", "range"}
    operand : str, float, tuple or tuple of (bound, number) pairs
    """

    key: str
    operator: str
    operand: Any

    def check(self, schema: Mapping[str, str], where: str) -> None:
        """The key is the catalogue's and the operand of its kind; InvalidInputError if not."""
        kind = schema.get(self.key)
        if kind is None:
            known = ", ".join(repr(k) for k in sorted(schema)) or "none"
            raise InvalidInputError(
                f"{where}: unknown attribute {brief(self.key)}; the catalogue's attributes "
                f"are: {known}"
            )
        if self.operator == "range":
            if kind != "number":
                raise InvalidInputError(
                    f"{where}: range needs a number attribute; {self.key!r} holds strings"
                )
            return
        values = self.operand if self.operator == "any" else (self.operand,)
        for value in values:
            if kind_of(value, where) != kind:
                raise InvalidInputError(
                    f"{where}: attribute {self.key!r} holds {kind}s, not {brief(value)}"
                )

    def holds(self, column: Column | None, n: int) -> np.ndarray:
        """Whether each of ``n`` items holds the condition (False where the key is absent)."""
        if column is None:
            return np.zeros(n, dtype=bool)
        if self.operator == "value":
            return column.equal(self.operand)
        if self.operator == "any":
            return column.any_of(self.operand)
        return column.within(dict(self.operand))

    @property
    def cache_key(self) -> tuple:
        return (self.key, self.operator, self.operand)


@dataclass(frozen=True)
class Filter:
    """A boolean combination of conditions, as Qdrant writes one (see the module docstring).

    Parameters
    ----------
    must, must_not, should : tuple of Condition or Filter
    """

    must: tuple[Condition | Filter, ...] = ()
    must_not: tuple[Condition | Filter, ...] = ()
    should: tuple[Condition | Filter, ...] = ()

    @classmethod
    def parse(cls, document: Any, where: str = "filter") -> Filter:
        """A filter from its JSON form.

        Raises
        ------
        InvalidInputError
            Not of the documented shape, more than :data:`MAX_CONDITIONS` conditions, nested
            deeper than :data:`MAX_DEPTH`, or a match.any of more than :data:`MAX_ANY_VALUES`.
        """
        parsed = _parse_filter(document, where, 1)
        if parsed.n_conditions > MAX_CONDITIONS:
            raise InvalidInputError(
                f"{where}: {parsed.n_conditions} conditions; the limit is {MAX_CONDITIONS}"
            )
        return parsed

    @property
    def n_conditions(self) -> int:
        return sum(
            c.n_conditions if isinstance(c, Filter) else 1
            for c in (*self.must, *self.must_not, *self.should)
        )

    def check(self, schema: Mapping[str, str], where: str = "filter") -> None:
        """Every condition names an attribute of ``schema`` with an operand of its kind."""
        for name in ("must", "must_not", "should"):
            for i, clause in enumerate(getattr(self, name)):
                clause.check(schema, f"{where}.{name}[{i}]")

    def bits(self, shard_bits: Callable[[Condition], np.ndarray], n_words: int) -> np.ndarray:
        """This filter's bits over one shard, from each condition's (``shard_bits``), in
        ``n_words`` words."""
        result = np.full(n_words, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
        for clause in self.must:
            result &= _clause_bits(clause, shard_bits, n_words)
        for clause in self.must_not:
            result &= ~_clause_bits(clause, shard_bits, n_words)
        if self.should:
            any_held = np.zeros(n_words, dtype=np.uint64)
            for clause in self.should:
                any_held |= _clause_bits(clause, shard_bits, n_words)
            result &= any_held
        return result

    def canonical(self) -> str:
        """A canonical text of the filter (what a cursor records of it)."""
        return json.dumps(_as_json(self), sort_keys=True, separators=(",", ":"))


def _clause_bits(clause, shard_bits, n_words: int) -> np.ndarray:
    if isinstance(clause, Filter):
        return clause.bits(shard_bits, n_words)
    return shard_bits(clause)


def _as_json(clause) -> Any:
    if isinstance(clause, Filter):
        return {
            name: [_as_json(c) for c in getattr(clause, name)]
            for name in ("must", "must_not", "should")
            if getattr(clause, name)
        }
    if clause.operator == "range":
        return {"key": clause.key, "range": dict(clause.operand)}
    if clause.operator == "any":
        return {"key": clause.key, "match": {"any": list(clause.operand)}}
    return {"key": clause.key, "match": {"value": clause.operand}}


def _parse_filter(document: Any, where: str, depth: int) -> Filter:
    if depth > MAX_DEPTH:
        raise InvalidInputError(f"{where}: filters nest at most {MAX_DEPTH} deep")
    if not isinstance(document, Mapping):
        raise InvalidInputError(f"{where} must be an object with must, must_not or should")
    unknown = set(document) - {"must", "must_not", "should"}
    if unknown:
        raise InvalidInputError(
            f"{where}: unknown field(s) {', '.join(sorted(map(repr, unknown)))}; a filter has "
            "must, must_not and should"
        )
    parts = {}
    for name in ("must", "must_not", "should"):
        clauses = document.get(name) or []
        if isinstance(clauses, Mapping):  # Qdrant accepts one clause in place of a list
            clauses = [clauses]
        if not isinstance(clauses, list):
            raise InvalidInputError(f"{where}.{name} must be a list of conditions")
        parts[name] = tuple(
            _parse_clause(c, f"{where}.{name}[{i}]", depth) for i, c in enumerate(clauses)
        )
    return Filter(**parts)


def _parse_clause(document: Any, where: str, depth: int) -> Condition | Filter:
    if isinstance(document, Mapping) and "key" not in document:
        return _parse_filter(document, where, depth + 1)
    if not isinstance(document, Mapping):
        raise InvalidInputError(f"{where} must be a condition or a filter object")
    key = check_key(document["key"], where)
    unknown = set(document) - {"key", "match", "range"}
    if unknown or ("match" in document) == ("range" in document):
        raise InvalidInputError(f"{where}: a condition has a key and one of match or range")
    if "range" in document:
        bounds = document["range"]
        if not isinstance(bounds, Mapping) or not bounds or set(bounds) - set(RANGE_BOUNDS):
            raise InvalidInputError(f"{where}.range takes gt, gte, lt and lte (at least one)")
        pairs = []
        for name in RANGE_BOUNDS:
            if name in bounds and bounds[name] is not None:
                if kind_of(bounds[name], f"{where}.range.{name}") != "number":
                    raise InvalidInputError(f"{where}.range.{name} must be a number")
                pairs.append((name, float(bounds[name])))
        return Condition(key, "range", tuple(pairs))
    match = document["match"]
    if not isinstance(match, Mapping) or len(match) != 1 or not {"value", "any"} & set(match):
        raise InvalidInputError(f"{where}.match takes one of value or any")
    if "value" in match:
        value = match["value"]
        kind_of(value, f"{where}.match.value")
        return Condition(key, "value", float(value) if _is_number(value) else value)
    values = match["any"]
    if not isinstance(values, list) or not values or len(values) > MAX_ANY_VALUES:
        raise InvalidInputError(f"{where}.match.any must be a list of 1 to {MAX_ANY_VALUES} values")
    kinds = {kind_of(v, f"{where}.match.any") for v in values}
    if len(kinds) > 1:
        raise InvalidInputError(f"{where}.match.any mixes strings and numbers")
    operand = tuple(sorted(float(v) if _is_number(v) else v for v in values))
    return Condition(key, "any", operand)
