"""Pages of a ranking: a cursor that continues a search after its last item, valid for the
catalogue version it came from.

A cursor holds the last item's unbiased score (exact, as the kernel summed it) and global
position, the catalogue version's identity, and a digest of the query (its code, filter and
exclusions), so that it continues the ranking it came from and nothing else. It is opaque to
clients: URL-safe base64 of a small JSON object, of no use beyond a page (it says nothing a
client could not see).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from service.model.errors import InvalidInputError, VersionConflictError
from service.model.search.codes import SparseCode
from service.model.search.filters import Filter

MAX_CURSOR_LENGTH = 1024


@dataclass(frozen=True)
class Cursor:
    """Where a page ended.

    Parameters
    ----------
    catalogue : str
        The catalogue version's digest (its manifest's sha256).
    version : int
        Its version number (for messages).
    after_sum : float
        The last item's unbiased score.
    after_position : int
        Its global position.
    query : str
        See :func:`query_digest`.
    """

    catalogue: str
    version: int
    after_sum: float
    after_position: int
    query: str

    def encode(self) -> str:
        document = {
            "c": self.catalogue,
            "v": self.version,
            "s": float(self.after_sum).hex(),
            "p": self.after_position,
            "q": self.query,
        }
        text = json.dumps(document, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(text).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``text`` holds; InvalidInputError if it is not one of ours."""
        if not isinstance(text, str) or not text or len(text) > MAX_CURSOR_LENGTH:
            raise InvalidInputError(
                "cursor is not a cursor of this service: send next_cursor as given"
            )
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            document = json.loads(raw)
            cursor = cls(
                catalogue=str(document["c"]),
                version=_integer(document["v"]),
                after_sum=float.fromhex(document["s"]),
                after_position=_integer(document["p"]),
                query=str(document["q"]),
            )
        except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
            raise InvalidInputError(
                "cursor is not a cursor of this service: send next_cursor as given"
            ) from None
        if cursor.after_position < 0:
            raise InvalidInputError("cursor is not a cursor of this service")
        return cursor

    def check(self, catalogue: str, version: int, n_positions: int, query: str) -> None:
        """Raise VersionConflictError if the catalogue version changed since the cursor was
        made, InvalidInputError if it belongs to another query."""
        if catalogue != self.catalogue:
            raise VersionConflictError(
                f"the cursor is for catalogue version {self.version}, which is no longer "
                f"served: version {version} is; search again without a cursor"
            )
        if query != self.query or self.after_position >= n_positions:
            raise InvalidInputError(
                "the cursor belongs to another query: send it with the query it came from "
                "(the same code, filter and exclusions)"
            )


def _integer(value: object) -> int:
    """A cursor's integer field as encoded (never a float: 1e400, Infinity and 2.5 are no
    position); ValueError otherwise."""
    if type(value) is not int:
        raise ValueError("not an integer")
    return value


def query_digest(code: SparseCode, query_filter: Filter | None, excluded: np.ndarray) -> str:
    """What identifies a ranking within a catalogue version: the code, the filter and the
    excluded positions."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(code.atoms, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(code.weights, dtype=np.float64).tobytes())
    digest.update(float(code.bias).hex().encode())
    digest.update(b"" if query_filter is None else query_filter.canonical().encode())
    digest.update(np.ascontiguousarray(excluded, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]
