"""Sums over the pieces the workers hold, added where they are: a tree of tasks, so that the
driver receives a few partial results however many pieces (Spark's ``treeAggregate`` has this
shape)."""

from __future__ import annotations

from collections.abc import Sequence

# Partial sums are added in groups of this many per task, level by level, until at most this
# many are left, which the driver fetches and adds: the driver receives at most this many
# (n_features + 1) x k blocks a call, however many shards. Each level costs a round trip through
# the scheduler (tens of milliseconds on a loaded machine), so few shards skip the tree.
REDUCTION_FAN_IN = 16


def _add(*parts):
    """The sum of partial results: arrays, or tuples of arrays added member by member."""
    if isinstance(parts[0], tuple):
        return tuple(_add(*members) for members in zip(*parts, strict=True))
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def tree_sum(client, parts: Sequence):
    """The total of futures of partial results (arrays, or tuples of arrays added member by
    member), added in a tree of tasks of :data:`REDUCTION_FAN_IN` each, the last level here."""
    parts = list(parts)
    while len(parts) > REDUCTION_FAN_IN:
        parts = [
            client.submit(_add, *parts[i : i + REDUCTION_FAN_IN], pure=False)
            for i in range(0, len(parts), REDUCTION_FAN_IN)
        ]
    return _add(*client.gather(parts))
