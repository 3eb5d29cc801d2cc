"""The training rows where the workers hold them: a shard or an array cut into pieces that
keep every worker thread busy (:func:`row_pieces`), the classes and their counts over the
pieces, the items of given ranks within their class, fetched from the pieces that hold them
(the basis a fit draws), and a stratified sample of sharded data (:func:`draw_sample`, what the
model selection cross-validates).

A piece is a ``(rows, labels)`` pair on a worker (a future): read from a shard there
(:func:`training.cluster.shards.read_shard`), or scattered from an array given to ``fit``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from training.cluster.shards import ShardedData, read_shard

# Shards and blocks are cut into row pieces so that each worker thread gets this many (a shard
# whole on one worker leaves the others idle), of MIN_PIECE_ROWS rows at least: smaller pieces
# cost a small set's fit more in tasks than they gain in balance.
PIECES_PER_THREAD = 2


MIN_PIECE_ROWS = 1_000


def row_pieces(n_rows: Sequence[int], n_pieces: int) -> list[tuple[int, int, int]]:
    """Each part's rows cut into pieces of about equal size, towards ``n_pieces`` in all: no
    piece under :data:`MIN_PIECE_ROWS` rows (a part smaller than that stays whole).

    Parameters
    ----------
    n_rows : sequence of int
        Rows of each part (a shard, or an array given to ``fit``), in order.
    n_pieces : int
        Pieces wanted in all.

    Returns
    -------
    list of (part, start, stop)
        In the parts' order, then the rows'.
    """
    most = max(MIN_PIECE_ROWS, -(-sum(n_rows) // max(n_pieces, 1)))
    pieces = []
    for part, rows in enumerate(n_rows):
        count = max(1, min(-(-rows // most), rows // MIN_PIECE_ROWS))
        cuts = np.linspace(0, rows, count + 1).round().astype(int)
        pieces.extend((part, int(a), int(b)) for a, b in itertools.pairwise(cuts))
    return pieces


def _labels(piece) -> np.ndarray:
    return np.unique(piece[1])


def _class_counts(piece, classes) -> np.ndarray:
    return np.bincount(np.searchsorted(classes, piece[1]), minlength=len(classes))


def classes_of(client, pieces: Sequence) -> np.ndarray:
    """The sorted labels of every piece, each piece's found where it is."""
    return np.unique(np.concatenate(client.gather(client.map(_labels, pieces, pure=False))))


def class_counts_by_piece(client, pieces: Sequence, classes: np.ndarray) -> np.ndarray:
    """Items of each class (columns) in each piece (rows), ``classes`` sorted."""
    return np.array(client.gather(client.map(_class_counts, pieces, classes=classes, pure=False)))


@dataclass(frozen=True)
class _Picks:
    """The ranks to take of each class (one sorted array per class): one object in a task's
    arguments, which Dask passes as it is (a list or a set there is a graph to walk)."""

    ranks: tuple[np.ndarray, ...]


def _ranked_rows(piece, first_rank, prepare, classes, wanted: _Picks):
    """The rows of a piece whose rank within their class (over all pieces, in order) is
    wanted, prepared, with their codes and ranks.

    ``first_rank[c]``: the rank of the piece's first item of class c."""
    codes = np.searchsorted(classes, piece[1])
    ranks = np.empty(len(codes), dtype=np.int64)
    keep = np.zeros(len(codes), dtype=bool)
    for code in np.unique(codes):
        members = np.flatnonzero(codes == code)
        ranks[members] = first_rank[code] + np.arange(len(members))
        keep[members] = np.isin(ranks[members], wanted.ranks[code])
    if not keep.any():
        return None
    rows = piece[0][keep]
    return rows if prepare is None else prepare(rows), codes[keep], ranks[keep]


def items_at(
    client, pieces: Sequence, classes: np.ndarray, counts: np.ndarray, wanted, prepare=None
):
    """The items of each class c whose ranks within the class are ``wanted[c]`` (sorted), with
    their codes, by class, then rank; fetched from the pieces that hold them.

    Parameters
    ----------
    client : distributed.Client
    pieces : sequence of Future
    classes : ndarray
        The sorted labels.
    counts : ndarray of shape (n_pieces, n_classes)
        Each piece's items of each class (:func:`class_counts_by_piece`).
    wanted : sequence of ndarray
        The ranks to take of each class, sorted.
    prepare : callable, optional
        Applied to the rows on the worker that holds them (None: the rows as stored).

    Returns
    -------
    items : ndarray of shape (n_wanted, ...)
    codes : ndarray of shape (n_wanted,), int
    """
    first_rank = np.vstack([np.zeros(len(classes), dtype=np.int64), np.cumsum(counts, axis=0)[:-1]])
    parts = client.gather(
        client.map(
            _ranked_rows,
            pieces,
            list(first_rank),
            prepare=prepare,
            classes=classes,
            wanted=_Picks(tuple(wanted)),
            pure=False,
        )
    )
    parts = [part for part in parts if part is not None]
    items = np.vstack([p[0] for p in parts])
    codes = np.concatenate([p[1] for p in parts])
    ranks = np.concatenate([p[2] for p in parts])
    order = np.lexsort((ranks, codes))
    return items[order], codes[order]


def draw_sample(client, data: ShardedData, n_items: int, random_state: int):
    """A stratified sample of sharded data, drawn where the shards are: each class's share of
    about ``n_items`` items (at least 2 of a class that has them), at random among the
    class's items (seeded by ``random_state``).

    Returns
    -------
    X : ndarray of shape (n_drawn, n_features)
        The rows as the shards store them, by class, then in the shards' order.
    y : ndarray of shape (n_drawn,)
        Their labels.
    class_counts : ndarray of shape (n_classes,)
        Items of each class in the whole data (the classes sorted).
    """
    pieces = client.map(read_shard, data.shards, pure=False)
    classes = classes_of(client, pieces)
    counts = class_counts_by_piece(client, pieces, classes)
    totals = counts.sum(axis=0)
    share = min(1.0, n_items / totals.sum())
    rng = np.random.default_rng(random_state)
    wanted = [
        np.sort(rng.choice(total, size=min(total, max(2, round(share * total))), replace=False))
        for total in totals
    ]
    rows, codes = items_at(client, pieces, classes, counts, wanted)
    return rows, classes[codes], totals
