"""The stages of forward selection, in order (the BE-SVM paper's greedy answer, section 3.5,
to "which measures, at which resolution"). A kernel's width, the SVM's C and the basis size
depend on each other (a narrow rbf pays only with a larger basis and a larger C), so they are
searched together and revisited, not fixed one after the other:

1. **Inputs** (images only): the transform (pixels, or HOG cells at one or two cell sizes) under
   either input normalisation, with ``rbf(gamma=1)``; the best fixes the transform.
2. **Widths and C**: every candidate measure at each value of a coarse log grid of its scale
   (:data:`~training.selection.space.SCALES`: rbf's gamma over 2.4 decades, sensing's n over 2
   decades, rigid's shift) times a coarse grid of C, under both input normalisations (dense
   inputs), as a kernel SVM's grid search does.
3. **Basis size** per class: a grid (10, 25, 50, ...) up to the largest class of a fold, whose
   every item is a candidate basis on small sets, and up to a prediction-work budget
   (:data:`~training.selection.space.MAX_FEATURES` rbf-equivalent basis items; a measure costing
   9 times an rbf per pair counts 9 times; a class smaller than the basis per class counts its
   own items, :func:`~training.selection.space.basis_cap`).
4. **Refinement**, repeated while it moves: the width one step either way on its scale's ladder,
   C one step either way (together: 8 neighbours) and the basis one size either way.
5. **Added measures**: the measure whose ``+``-combination with those chosen helps most,
   repeatedly, up to :data:`~training.selection.space.MAX_MEASURES`; a second rbf of another
   width is a candidate (the linear SVM then learns a combination of two kernels, which one SVC
   cannot be).
6. **C** one step either way, then **the basis strategy** (``random``, ``kmedoids``).
7. **Large basis**, with what is left of the budget, where the folds hold every training item
   (small sets; larger ones search it on the whole split after the basis ladder,
   :mod:`training.selection.basis_ladder`): the largest basis the folds allow under the
   kernel's own map ``nystroem(clip)`` (for kernels: at every item, the kernel SVM itself) and
   the paper's ``besvm`` (not ``auto``'s ``nystroem(square)``, whose accuracy falls as the
   basis grows), at every width of the coarse grid, either input normalisation and a large C
   (:func:`~training.selection.space.large_basis_candidates`), then refined as in 4 if one was
   taken.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.model.inputs.dense import GLOBAL_NORMALIZATION
from service.model.inputs.spec import InputSpec
from service.model.similarity import parse_spec
from training.selection.space import (
    LARGE_BASIS_NORMALIZATIONS,
    MAX_MEASURES,
    MIN_BASIS_PER_CLASS,
    STRATEGIES,
    Candidate,
    KindRules,
    basis_cap,
    basis_size_candidates,
    basis_weight,
    ladder_around,
    large_basis_candidates,
    learns_from_items,
    measure_candidates,
    measure_scale,
    measures,
    neighbour_candidates,
)
from training.selection.state import SelectionState

# Rounds of the refinement stage at most (each moves the width, C or the basis one step).
MAX_REFINEMENTS = 4


def run_stages(
    state: SelectionState,
    spec: InputSpec,
    class_counts: np.ndarray,
    rules: KindRules,
    transforms: list[str | None],
    every_item: bool = False,
) -> None:
    """The stages of the module docstring, in order, on ``state``; ``class_counts`` are the
    items of each class in a fold's training part, ``transforms`` the input transforms to try;
    ``every_item``: the folds hold every training item (no basis ladder follows), so the large
    basis is searched on them."""
    if len(transforms) > 1:
        state.step(
            "inputs",
            [
                Candidate(
                    f"{normalization} normalisation, {transform}",
                    {
                        **state.current,
                        "input_normalization": normalization,
                        "input_transform": transform,
                    },
                )
                for transform in transforms
                for normalization in rules.input_normalizations
                # word counts are not normalised: one candidate for bof
                if not learns_from_items(transform) or normalization == GLOBAL_NORMALIZATION
            ],
        )
    state.step("widths and C", _coarse_candidates(state, spec, rules, class_counts))

    def sizes() -> list[int]:
        weight = basis_weight(state.current["similarity"])
        return basis_size_candidates(class_counts, weight, rules.max_features)

    state.vary("basis size", "basis_per_class", sizes(), lambda size: f"{size} bases per class")
    for _ in range(MAX_REFINEMENTS):
        if not state.step("refine", _refinements(state, sizes())):
            break
    _add_measures(state, spec, class_counts, rules)
    state.vary("C", "C", ladder_around(state.current["C"], 1), lambda C: f"C = {C:g}")
    state.vary("basis strategy", "basis_strategy", STRATEGIES, lambda strategy: f"{strategy} basis")
    if every_item and not rules.documents:
        _large_basis(state, rules, sizes()[-1])


def _large_basis(state: SelectionState, rules: KindRules, largest: int) -> None:
    """What decides small sets, with what is left of the budget: the largest basis the folds
    allow, under :data:`~training.selection.space.LARGE_BASIS_NORMALIZATIONS`, at every width
    of the coarse grid, either input normalisation and a large C
    (:func:`large_basis_candidates`); then, if one was taken, its width and C refined."""
    candidates = large_basis_candidates(state.current, rules, largest, LARGE_BASIS_NORMALIZATIONS)
    if not state.step("large basis", candidates):
        return
    for _ in range(MAX_REFINEMENTS):
        if not state.step("refine", neighbour_candidates(state.current)):
            break


def with_measure(
    params: dict[str, Any], similarity: str, class_counts: np.ndarray, max_features: int
) -> dict[str, Any] | None:
    """``params`` with ``similarity``, its basis shrunk to fit the feature budget.

    Parameters
    ----------
    params : dict
        The configuration, with its ``basis_per_class``.
    similarity : str
        The measures to offer it with.
    class_counts : ndarray of shape (n_classes,)
        Items of each class in a fold's training part.
    max_features : int
        Basis items times the measures' weight, at most (:func:`basis_cap`).

    Returns
    -------
    dict or None
        ``params`` with ``similarity`` and its basis unchanged where every item fits; else with
        its basis at most the cap; None where the cap is under :data:`MIN_BASIS_PER_CLASS`.
    """
    cap = basis_cap(similarity, class_counts, max_features)
    if cap >= np.max(class_counts):  # every item fits: nothing to shrink
        return {**params, "similarity": similarity}
    if cap < MIN_BASIS_PER_CLASS:
        return None
    return {
        **params,
        "similarity": similarity,
        "basis_per_class": min(params["basis_per_class"], cap),
    }


def _coarse_candidates(
    state: SelectionState, spec: InputSpec, rules: KindRules, class_counts: np.ndarray
):
    """Every measure at the coarse grid of its scale, times the coarse grid of C, under each
    input normalisation; the most promising first (the middle of each grid, the current
    normalisation), so that a stage the budget cuts has scored those."""
    current = state.current
    ranked = []
    normalizations = rules.input_normalizations
    if learns_from_items(current["input_transform"]):
        normalizations = (GLOBAL_NORMALIZATION,)  # word counts are not normalised
    for n, normalization in enumerate(normalizations):
        if normalization == current["input_normalization"]:
            n = -1
        for measure in measure_candidates(spec, current["input_transform"]):
            params = with_measure(current, measure, class_counts, rules.max_features)
            if params is None:
                continue
            Cs = rules.coarse_C(measure)
            for c, C in enumerate(Cs):
                where = "" if rules.documents else f", {normalization}"
                priority = _rung(measure) + abs(c - len(Cs) // 2) + 0.5 * (n >= 0)
                candidate = Candidate(
                    f"{measure}, C = {C:g}{where}",
                    {**params, "C": C, "input_normalization": normalization},
                )
                ranked.append((priority, len(ranked), candidate))
    return [candidate for *_, candidate in sorted(ranked, key=lambda r: r[:2])]


def _rung(measure: str) -> float:
    """How far a measure is from the middle of the coarse grids: 0 for the middle width, one
    more a step away; linear 0.5, measures without a scale 2."""
    scaled = measure_scale(measure)
    if scaled is None:
        return 0.5 if parse_spec(measure).kind.linear_in_input else 2.0
    scale, value = scaled
    coarse = list(scale.coarse)
    middle = coarse[len(coarse) // 2]
    return abs(coarse.index(value) - coarse.index(middle)) if value in coarse else 2.0


def _refinements(state: SelectionState, sizes: list[int]) -> list[Candidate]:
    """The current width and C one step either way, together, and the basis one size either
    way on ``sizes``."""
    current = state.current
    candidates = neighbour_candidates(current)
    size = current["basis_per_class"]
    below = [s for s in sizes if s < size]
    above = [s for s in sizes if s > size]
    for other in below[-1:] + above[:1]:
        candidates.append(
            Candidate(f"{other} bases per class", {**current, "basis_per_class": other})
        )
    return candidates


def _added_measures(current: str, spec: InputSpec, transform: str | None) -> list[str]:
    """Measures to join the chosen ones: every candidate measure at its coarse scale, and the
    chosen scaled measures two steps either way (a second rbf of another width)."""
    chosen = measures(current)
    offered = list(measure_candidates(spec, transform))
    for measure in chosen:
        scaled = measure_scale(measure)
        if scaled is not None:
            scale, value = scaled
            offered += [scale.measure(other) for other in scale.steps(value, 2)]
    names = {parse_spec(m).measure_name for m in chosen}
    unique = []
    for measure in offered:
        name = parse_spec(measure).measure_name
        if name not in names:
            names.add(name)
            unique.append(measure)
    return unique


def _add_measures(
    state: SelectionState, spec: InputSpec, class_counts: np.ndarray, rules: KindRules
) -> None:
    """Add the measure that helps most, while one helps; the basis shrinks if the measures
    would otherwise exceed the feature budget."""
    while len(measures(state.current["similarity"])) < MAX_MEASURES:
        current = state.current
        candidates = []
        for measure in _added_measures(current["similarity"], spec, current["input_transform"]):
            params = with_measure(
                current, f"{current['similarity']} + {measure}", class_counts, rules.max_features
            )
            if params is None:
                continue
            shrunk = params["basis_per_class"] < current["basis_per_class"]
            candidates.append(
                Candidate(
                    f"+ {measure}"
                    + (f" ({params['basis_per_class']} bases per class)" if shrunk else ""),
                    params,
                )
            )
        if not state.step("add measure", candidates):
            return
