"""The basis grown from the folds to the whole training split: a selection's folds hold a
fraction of the split, and the basis size they choose is theirs; the final fit's basis is
grown from it (:func:`grown_basis_per_class`) or kept, within the memory budget
(:func:`split_basis`). The basis ladder (:mod:`training.selection.basis_ladder`) then
validates a larger basis on the split where the rules say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.selection.memory import basis_per_class_holding, basis_per_class_within

# What a grown basis may be bounded by, as the training record names it (besides the feature
# limits of KindRules.grown_feature_limits).
GROWN_IN_PROPORTION = "in proportion to the items"
GROWN_EVERY_ITEM = "every item of the largest class"
GROWN_AS_SEARCHED = "the size the folds chose"
GROWN_WITHIN_MEMORY = "the memory budget"


@dataclass(frozen=True)
class GrownBasis:
    """A basis grown to the whole training split: its size per class and what bounded it
    (:data:`GROWN_IN_PROPORTION`, :data:`GROWN_EVERY_ITEM`, :data:`GROWN_AS_SEARCHED` or the
    name of a feature limit)."""

    per_class: int
    bound: str


def grown_basis_per_class(
    per_class: int,
    validated_items: int,
    class_counts,
    weight: float,
    feature_limits: Mapping[str, int],
) -> GrownBasis:
    """The per-class basis size for the whole training split, grown from the one the folds chose.

    Grown in proportion to the items: the basis keeps the same share of each class. Bounded by
    the largest class and by each of ``feature_limits`` (a class smaller than the basis per
    class counts at its size), never below ``per_class`` unless the memory budget (the limit
    :data:`GROWN_WITHIN_MEMORY`, if given) is smaller: that one is a bound on the final fit,
    not on the growth. For documents, and for dense inputs selected on a sample: there the
    selection runs on folds far smaller than the split, and accuracy keeps growing with the
    basis, so the size the folds support would leave most of the split's information out.

    Parameters
    ----------
    per_class : int
        The basis per class the folds chose.
    validated_items : int
        Items of a fold's training part.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class of the whole training split.
    weight : float
        Features per basis item (:func:`~training.selection.space.basis_weight`).
    feature_limits : mapping of str to int
        Each limit's name and its most features.

    Returns
    -------
    GrownBasis
    """
    n_train, largest_class = int(np.sum(class_counts)), int(np.max(class_counts))
    sizes = {
        GROWN_IN_PROPORTION: round(per_class * n_train / max(1, validated_items)),
        GROWN_EVERY_ITEM: largest_class,
        **{
            name: basis_per_class_holding(features / max(weight, 1e-9), class_counts)
            for name, features in feature_limits.items()
        },
    }
    memory = sizes.pop(GROWN_WITHIN_MEMORY, None)
    bound = min(sizes, key=sizes.__getitem__)
    grown = GrownBasis(sizes[bound], bound) if sizes[bound] > per_class else None
    grown = grown or GrownBasis(per_class, GROWN_AS_SEARCHED)
    if memory is not None and memory < grown.per_class:
        return GrownBasis(memory, GROWN_WITHIN_MEMORY)
    return grown


def split_basis(
    chosen: Mapping[str, Any],
    *,
    fold_largest: int,
    fold_items: int,
    class_counts,
    n_items: int,
    rules,
    memory_budget: int,
    weight: float,
    squares: int,
) -> tuple[dict[str, Any], str | None]:
    """The chosen parameters with the basis for the whole split, and what bounded it: grown in
    proportion where ``rules`` say so (documents, a selection on a sample) within their limits
    and ``memory_budget`` bytes, every item of each class within the kind's feature cap when
    the folds chose every item of theirs, else as the folds chose it; never above what
    ``memory_budget`` holds. ``weight`` and ``squares`` are ``chosen``'s, computed by the caller
    (:mod:`training.selection.space` knows the measures, and imports this module).

    Parameters
    ----------
    chosen : mapping
        The selected parameters, with the folds' ``basis_per_class``.
    fold_largest, fold_items : int
        The largest class of a fold's training part, and its items.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class of the whole training split.
    n_items : int
        The items the selection validated (the whole split, or a sample of it).
    rules : KindRules
        The kind of input's rules (:func:`~training.selection.space.rules_for`; not imported
        here: that module imports this one).
    memory_budget : int
        Bytes the training features may take.
    weight : float
        Features per basis item of ``chosen`` (:func:`~training.selection.space.basis_weight`).
    squares : int
        The F x F matrices a fit of ``chosen`` holds beside its features
        (:func:`~training.selection.space.held_square_matrices`).

    Returns
    -------
    params : dict
    bound : str or None
        What bounded a grown basis (:class:`GrownBasis`' names, ``the size the folds chose``
        where growing kept it), or the memory budget that bounded one not grown; None where
        neither growth in proportion nor the memory budget set it (the folds' size, or every
        item of each class within the kind's feature cap).
    """
    chosen = dict(chosen)
    counts = np.asarray(class_counts)
    n_train = int(counts.sum())
    if rules.grows_basis(n_items, n_train):
        grown = grown_basis_per_class(
            chosen["basis_per_class"],
            fold_items,
            counts,
            weight,
            rules.grown_feature_limits(n_train, memory_budget, squares),
        )
        return {**chosen, "basis_per_class": grown.per_class}, grown.bound
    if chosen["basis_per_class"] >= fold_largest:
        cap = basis_per_class_holding(rules.max_features / weight, counts)
        chosen["basis_per_class"] = max(chosen["basis_per_class"], cap)
    within = basis_per_class_within(counts, weight, memory_budget, squares)
    if within < chosen["basis_per_class"]:
        return {**chosen, "basis_per_class": within}, GROWN_WITHIN_MEMORY
    return chosen, None
