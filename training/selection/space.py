"""The space forward selection explores: the parameters it chooses
(:data:`SELECTED_PARAMETERS`), the candidate measures and transforms for each kind of input, the
scale of each measure (:class:`Scale`: a coarse grid, and a ladder the refinement steps on),
the grids of C and of basis sizes, and the caps on prediction work that bound them; what differs
for documents is one :class:`KindRules` object, chosen once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.model.features import resolve_normalization
from service.model.inputs.dense import GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform
from service.model.similarity import parse_spec, split_specs
from training.selection.budget import (
    DOCUMENT_LADDER_BUDGET_S_PER_1000_ITEMS,
    LADDER_BUDGET_S_PER_1000_ITEMS,
    ladder_budget_for,
)
from training.selection.grown_basis import GROWN_WITHIN_MEMORY
from training.selection.memory import basis_per_class_holding, features_within, square_matrices

MAX_MEASURES = 3

# Basis items times the measures' work per pair, relative to an rbf's (rigid(1) counts 9, the
# SimilarityKind.cost of the measure): caps training memory and, above all, serving cost.
MAX_FEATURES = 1000

# A measure that can have fewer basis items a class than this within MAX_FEATURES is not offered
# (unless that is every item of each class).
MIN_BASIS_PER_CLASS = 5

# Documents: their measures read sparse tf-idf or word-frequency vectors, cheap per basis item,
# and accuracy keeps growing with the basis far beyond 1,000 items, for every measure but
# sensing0 (docs/measurements/results.md#fortunes): the folds' cap (the basis grown for the
# split is bounded by the memory budget).
MAX_DOCUMENT_FEATURES = 6400

# The similarity normalisation for documents. The ``auto`` rule's nystroem(square) for tf-idf
# linear makes the SVM several times slower on fortunes for no accuracy
# (docs/measurements/model-selection.md#the-selections-constants-measured); the report's
# fortunes results are all ``besvm``.
DOCUMENT_NORMALIZATION = "besvm"

# Dense inputs selected on a sample: the basis the folds chose grows with the split (as for
# documents) to at most this share of the training items (basis items times measures), and within
# the fit's memory budget (training.selection.memory). The selection's own cap (MAX_FEATURES)
# bounds what its folds cost; the final fit affords more, and accuracy keeps growing with the
# basis on large splits, but not past a share of the items, where the SVM overfits: the grown size
# is the basis ladder's first rung, which is taken unvalidated
# (docs/how-it-works/model-selection.md has the figures).
MAX_GROWN_SHARE = 0.2

# The basis ladder's first rung, taken unvalidated, has at most this many basis items times
# measures; above it the ladder grows the basis only where the hold-out says it pays, within the
# memory budget. The 60,000-image set fitted in about 3 minutes at 4,000 features and took 359 s
# at 8,000, of which 285 s were the expansion (issue 34): a first rung as large as the memory
# budget allows would spend that on every large set, whether it pays there or not.
MAX_FIRST_RUNG_FEATURES = 4000

# The work of a HOG transform per input pixel, in multiply-adds: an 8 x 8 digit's transform
# costs about three times an rbf against 250 bases of 64 numbers (16,000 multiply-adds)
# (docs/measurements/model-selection.md#the-selections-constants-measured). Only compared
# between candidates (ties go to the cheaper).
HOG_WORK_PER_PIXEL = 800.0

# A large basis pays under the paper's normalisation, with a narrower kernel and a larger C than
# the small one the folds choose: nystroem(square)'s features of a basis of thousands are
# ill-conditioned (test accuracy falls past a few hundred a class and the solver runs to its
# iteration cap), where besvm's keep gaining up to every training item (phoneme, spambase:
# docs/measurements/model-selection.md#issue-34-item-5-the-large-basis-search). The basis
# ladder's large-basis search tries the chosen measure under it at every width of the coarse
# grid, each input normalisation, and these C.
LARGE_BASIS_NORMALIZATION = "besvm"

# On a small set's folds (its largest basis within the folds' work cap) the kernel's own map
# too: the Nystroem map with the spectrum clipped, K^(-1/2), for positive definite measures. With
# every training item as the basis its linear SVM is the kernel SVM (squared hinge), so it holds
# up as the basis grows where auto's nystroem(square), K^(-1), overfits (segment, seed 0,
# rbf(gamma=1), C = 100: 97.58% at every item against 83.91%; the default 96.14% -> 96.77% on
# segment, 91.05% -> 91.59% on phishing; docs/measurements/model-selection.md, "The kernel's own
# map at a large basis"). Not in the ladder's search on the splits the kernel grid reaches
# (KERNEL_GRID_MAX_ITEMS, where the grid offers it at every item): there its eigendecomposition
# at thousands of basis items took the time budget the besvm candidates needed (spambase 93.74%
# -> 93.45%, phoneme 89.66% -> 88.77%, the same section); computed from a Cholesky factor
# instead, its fits cost about what besvm's do, but twice the candidates left phoneme's seed 1
# short of the width it needed (89.66% -> 88.48%; spambase 93.74% either way: "The kernel's map
# from a Cholesky factor"). On larger splits the ladder's search offers it first
# (KindRules.large_basis_normalizations), under the ladder's budget: at 100,000 synthetic items
# it is the best configuration measured, where besvm scores far below auto ("The kernel's map in
# the ladder's search on tall splits").
KERNEL_MAP_NORMALIZATION = "nystroem(clip)"
LARGE_BASIS_NORMALIZATIONS = (KERNEL_MAP_NORMALIZATION, LARGE_BASIS_NORMALIZATION)

# Splits of dense inputs up to this many items (selected on a sample, the basis grown on the
# ladder) cross-validate the kernel's map at every item against the ladder's choice
# (training.selection.kernel_grid). Its fold fits hold every item of a fold as the basis: at
# 5,000 items about 4,000 x 4,000 features and Gram matrix, 15 to 80 CPU seconds a candidate's
# folds on spambase (3,447 items); the cost grows as the items squared to cubed.
KERNEL_GRID_MAX_ITEMS = 5000

LARGE_BASIS_C = (10.0, 100.0)

START_MEASURE = "rbf(gamma=1)"

START_BASIS_PER_CLASS = 25

BASIS_SIZES = (10, 25, 50, 100, 200, 400, 800)

STRATEGIES = ("index", "random", "kmedoids")


@dataclass(frozen=True)
class Scale:
    """A measure's scale parameter: the values it may take (``ladder``, sorted; the refinement
    moves one step on it) and the coarse grid every selection starts from."""

    kind: str
    parameter: str
    ladder: tuple[float, ...]
    coarse: tuple[float, ...]

    def measure(self, value: float) -> str:
        return f"{self.kind}({self.parameter}={value:g})"

    def neighbours(self, value: float) -> list[float]:
        """The values one step below and above ``value`` on the ladder (its nearest rung if
        it is not on it)."""
        logs = np.abs(np.log(np.asarray(self.ladder)) - math.log(value))
        at = int(np.argmin(logs))
        return [self.ladder[i] for i in (at - 1, at + 1) if 0 <= i < len(self.ladder)]

    def steps(self, value: float, n: int) -> list[float]:
        """The values ``n`` steps below and above ``value`` on the ladder."""
        logs = np.abs(np.log(np.asarray(self.ladder)) - math.log(value))
        at = int(np.argmin(logs))
        return [self.ladder[i] for i in (at - n, at + n) if 0 <= i < len(self.ladder)]


# rbf widths relative to the normalised inputs: both normalisations make the mean norm 1, so the
# mean squared distance between two items is about 2 and gamma = 1 is scikit-learn's "scale".
# The coarse grid spans 1/16 to 16 (2.4 decades, a factor of 4 apart); the ladder halves it.
RBF_SCALE = Scale(
    "rbf", "gamma", tuple(2.0**k for k in range(-6, 7)), (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
)

# sensing1's n (the words a document is scaled to): 15 to 1,500, half a decade apart.
SENSING_SCALE = Scale(
    "sensing1",
    "n",
    (5, 9, 15, 27, 50, 87, 150, 270, 500, 870, 1500, 2700, 5000),
    (15, 50, 150, 500, 1500),
)

# rigid's scale is its shift range in cells: each step multiplies its work per pair by 2.8 (1)
# to 9 (2), so the prediction-work budget decides how far it may go.
RIGID_SCALE = Scale("rigid", "h", (1, 2), (1, 2))

SCALES = {scale.kind: scale for scale in (RBF_SCALE, SENSING_SCALE, RIGID_SCALE)}

# C: the coarse grids below, then one step either way on this ladder (a factor of about 3).
C_LADDER = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)

# Kernel measures' features are weak one by one when the kernel is narrow, and pay with a larger
# C (the tuned SVC's best C is 10 to 100 on the sets whose best width is narrow); the linear
# measure's, with a smaller one.
COARSE_C = (1.0, 10.0, 100.0)

COARSE_C_LINEAR = (0.1, 1.0, 10.0)

# Documents' SVMs are slow (fortunes: seconds a fold fit): the coarse grid keeps C = 1 there.
COARSE_C_DOCUMENTS = (1.0,)

# Images at least this many pixels a side are offered the bof transform (16 x 16 patches every 8
# pixels: a 3 x 3 grid of patches at least).
BOF_MIN_SIDE = 32

# The estimator's parameters the selection chooses: with ``similarity="auto"`` the command line
# refuses options that would set them, since the selection would override them.
SELECTED_PARAMETERS = (
    "similarity",
    "input_transform",
    "input_normalization",
    "basis_per_class",
    "basis_strategy",
    "normalization",
    "C",
)


@dataclass(frozen=True)
class Candidate:
    """One setting to cross-validate: the selected parameters, with what it changes, in words."""

    change: str
    params: dict[str, Any]


def measures(similarity: str) -> list[str]:
    """The measures of a ``+``-joined similarity, as written."""
    return [m.strip() for m in split_specs(similarity)]


def held_square_matrices(params: Mapping[str, Any]) -> int:
    """The F x F matrices a fit of ``params`` holds beside its features:
    :func:`~training.selection.memory.square_matrices` of its normalisation, ``auto`` decided by
    its measures."""
    specs = [parse_spec(text) for text in measures(params["similarity"])]
    return square_matrices(resolve_normalization(params.get("normalization", "auto"), specs))


def basis_weight(similarity: str) -> float:
    """Work per basis item of ``similarity``'s measures, in rbf pairs: the sum of each
    measure's :attr:`~service.model.similarity.SimilarityKind.cost` (linear, rbf and the
    document measures 1, ``rigid(1)`` 9, ``deformable(1, 1)`` 106)."""
    total = 0.0
    for text in measures(similarity):
        spec = parse_spec(text)
        total += spec.kind.cost(*[value for _, value in spec.params])
    return total


def basis_cap(similarity: str, class_counts, max_features: int) -> int:
    """The most basis items per class that ``similarity`` may have within ``max_features``.

    A class smaller than the cap gives every item it has and counts those alone
    (:func:`~training.selection.memory.basis_items`): the cap is at least ``max_features``
    shared out evenly (or the largest class, where that is smaller), and larger where a class is
    smaller than that share.

    Parameters
    ----------
    similarity : str
        The measures, their weight per basis item :func:`basis_weight`.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class the basis is drawn from.
    max_features : int
        Basis items times the measures' weight, at most.

    Returns
    -------
    int
        At least 1, at most the largest class.
    """
    return basis_per_class_holding(max_features / max(basis_weight(similarity), 1e-9), class_counts)


def measure_candidates(input_spec: InputSpec, transform: str | None) -> list[str]:
    """The measures forward selection may use on inputs of ``input_spec`` read through
    ``transform``, each scaled one at the coarse grid of its :class:`Scale`: linear and rbf for
    vectors; those, ``rigid`` and ``deformable(1, 1)`` on image grids (pixels or HOG cells);
    ``sensing1`` and tf-idf ``linear`` for documents and for bags of visual words (``bof``)."""
    if input_spec.is_documents or learns_from_items(transform):
        return document_measures()
    candidates = ["linear"] + [RBF_SCALE.measure(gamma) for gamma in RBF_SCALE.coarse]
    if input_spec.kind == "grid" and transform is not None:
        candidates += [RIGID_SCALE.measure(h) for h in RIGID_SCALE.coarse]
        candidates += ["deformable(1, 1)"]
    return candidates


def document_measures() -> list[str]:
    """The measures for documents and word counts: sensing1 at its coarse widths, tf-idf
    ``linear``."""
    return [SENSING_SCALE.measure(n) for n in SENSING_SCALE.coarse] + ["linear"]


def learns_from_items(transform: str | None) -> bool:
    """Whether ``transform`` learns from the training items (bof's visual words), in one
    process: its outputs are word counts, read by the document measures and never
    input-normalised."""
    return transform is not None and parse_transform(transform).is_fitted


def transform_candidates(input_spec: InputSpec) -> list[str | None]:
    """Input transforms to try: pixels and HOG cells at one or two cell sizes (about 4 x 4 and
    7 x 7 cells) for images; and bags of visual words on a pyramid (``bof``, its defaults) for
    images of at least :data:`BOF_MIN_SIDE` pixels a side; none otherwise."""
    if input_spec.kind != "grid" or input_spec.shape[2] not in (1, 3):
        return [None]
    side = min(input_spec.shape[:2])
    cells = sorted({c for c in (side // 4, side // 7) if c >= 2}, reverse=True)
    bof = ["bof"] if side >= BOF_MIN_SIDE else []
    return ["pixels"] + [f"hog({c})" for c in cells] + bof


def basis_size_candidates(
    class_counts, weight: float, max_features: int = MAX_FEATURES
) -> list[int]:
    r"""Per-class basis sizes to try: :data:`BASIS_SIZES` below the cap, then the cap.

    Parameters
    ----------
    class_counts : array-like of int, shape (n_classes,)
        Items of each class the basis is drawn from (a fold's training part).
    weight : float
        The measures' work per basis item (:func:`basis_weight`).
    max_features : int, default=MAX_FEATURES
        Basis items times ``weight``, at most.

    Returns
    -------
    list of int
        Increasing; the last is the cap: the largest k whose basis, :math:`\sum_c \min(k, n_c)`
        items, holds ``max_features / weight`` (as :func:`basis_cap`), at most the largest class
        (every item a basis item).
    """
    cap = basis_per_class_holding(max_features / max(weight, 1e-9), class_counts)
    sizes = [size for size in BASIS_SIZES if size < cap]
    return [*sizes, cap]


def prediction_work(params: dict[str, Any], input_spec: InputSpec, n_classes: int) -> float:
    """Multiply-adds to score one input under ``params``, roughly: the transform, each
    measure against the basis (a linear measure folds into weights on the input), the SVM.
    Only compared between candidates: a cheaper one that is as accurate wins."""
    n_basis = params["basis_per_class"] * n_classes
    if input_spec.is_documents:
        n_features, work = 1, 0.0
    else:
        transform = parse_transform(params["input_transform"])
        n_features = transform.n_features(input_spec)
        work = 0.0 if transform.is_identity else HOG_WORK_PER_PIXEL * input_spec.n_features
    for text in measures(params["similarity"]):
        spec = parse_spec(text)
        if spec.kind.linear_in_input and not input_spec.is_documents:
            work += n_features * n_classes
        else:
            work += spec.work(1, n_basis, n_features) + n_basis * n_classes
    return work


def measure_scale(measure: str) -> tuple[Scale, float] | None:
    """One measure's :class:`Scale` and its value, if it has one."""
    spec = parse_spec(measure)
    scale = SCALES.get(spec.name)
    if scale is None:
        return None
    return scale, dict(spec.params)[scale.parameter]


def scaled_measure(similarity: str) -> tuple[int, Scale, float] | None:
    """The first measure of ``similarity`` that has a :class:`Scale`: its position among the
    measures, the scale and its value; None if no measure has one."""
    for position, measure in enumerate(measures(similarity)):
        found = measure_scale(measure)
        if found is not None:
            return position, *found
    return None


def with_scale(similarity: str, value: float) -> str | None:
    """``similarity`` with its first scaled measure (:func:`scaled_measure`) at ``value``
    (unchanged if none of its measures has a scale); None where another of its measures is
    that one already (``rbf(gamma=1) + rbf(gamma=4)`` at gamma 4), which a similarity may not
    hold twice."""
    found = scaled_measure(similarity)
    if found is None:
        return similarity
    position, scale, _ = found
    chosen = measures(similarity)
    moved = scale.measure(value)
    others = chosen[:position] + chosen[position + 1 :]
    if parse_spec(moved).measure_name in {parse_spec(m).measure_name for m in others}:
        return None
    return " + ".join([*chosen[:position], moved, *chosen[position + 1 :]])


def neighbour_candidates(params: dict[str, Any]) -> list[Candidate]:
    """``params`` with the width of its first scaled measure one step either way on its
    scale's ladder, C one step either way on :data:`C_LADDER`, and both together (at most 8)."""
    found = scaled_measure(params["similarity"])
    widths: list[tuple[str, str]] = [("", params["similarity"])]
    if found is not None:
        _, scale, value = found
        widths += [
            (f"{scale.parameter} {other:g}", moved)
            for other in scale.neighbours(value)
            if (moved := with_scale(params["similarity"], other)) is not None
        ]
    Cs = [("", params["C"])] + [(f"C = {C:g}", C) for C in ladder_around(params["C"], 1)]
    return [
        Candidate(", ".join(x for x in (width, c) if x), {**params, "similarity": s, "C": C})
        for width, s in widths
        for c, C in Cs
        if width or c
    ]


def large_basis_candidates(
    params: dict[str, Any],
    rules: KindRules,
    per_class: int,
    normalizations: tuple[str, ...] = (LARGE_BASIS_NORMALIZATION,),
    alone: bool = False,
) -> list[Candidate]:
    """The configurations a large basis is tried under: ``params`` with ``per_class`` basis
    items a class, under each of ``normalizations``, its first scaled measure at each width of
    the scale's coarse grid, each input normalisation of ``rules`` (not for word counts) and
    each C of :data:`LARGE_BASIS_C` (a similarity without a scaled measure, such as
    ``linear``, is replaced by :data:`START_MEASURE`'s kernel). With ``alone``, where the
    similarity joins several measures, its scaled measure alone is offered too, at the same
    widths: a fraction of the features (a large basis costs its features, and the search its
    time budget), and a measure a small basis needed a partner for may not need one at every
    item. Twice the candidates are twice the chances that one wins by noise: the basis ladder's
    search asks for them (its hold-out is thousands of items, and a gain within its noise is
    tested on more), a small set's folds do not (on breast cancer's seed 1 the measure alone
    won by 1.2 standard errors in cross-validation and lost 3.5 points on the test split). The
    most promising first, so that a search the budget cuts has scored those: C large
    before small, the width one coarse step narrower than the chosen one first (a large basis
    pays with a narrower kernel), then outwards; at each, the measure alone before the joined
    ones, under the normalisations in the order given. A normalisation is offered once
    (``auto`` is ``besvm`` or ``nystroem(square)`` by the measures), a ``nystroem`` one only
    where every measure is positive definite (of an indefinite measure's Gram matrix it is not
    the kernel's map, and ``auto`` gives ``besvm`` there). For documents (already under
    besvm) the other document measures instead (:func:`document_measures_at`;
    ``normalizations`` and ``alone`` do not apply).
    """
    if rules.documents:
        return document_measures_at(params, per_class)
    similarity = params["similarity"]
    if scaled_measure(similarity) is None:
        # measures without a width (linear): the kernel a large basis is for, from the start
        similarity = START_MEASURE
    position, scale, value = scaled_measure(similarity)
    joined = measures(similarity)
    shapes = [joined[position], similarity] if alone and len(joined) > 1 else [similarity]
    # ranked by log distance from one coarse step narrower than the chosen width
    steps = np.log(np.asarray(scale.coarse, dtype=float))
    target = math.log(value) + (steps[1] - steps[0] if len(steps) > 1 else 0.0)
    widths = [
        ((abs(step - target), shape), moved)
        for step, other in zip(steps, scale.coarse, strict=True)
        for shape, measure in enumerate(shapes)
        if (moved := with_scale(measure, other)) is not None
    ]
    inputs = rules.input_normalizations
    if learns_from_items(params.get("input_transform")):
        inputs = (GLOBAL_NORMALIZATION,)  # word counts are not normalised
    ranked = []
    for (distance, shape), similarity in widths:
        for normalization in _offered_normalizations(similarity, normalizations):
            for input_normalization in inputs:
                moved = input_normalization != params.get("input_normalization")
                for c, C in enumerate(sorted(LARGE_BASIS_C, reverse=True)):
                    ranked.append(
                        (
                            (distance, moved, c, shape, normalizations.index(normalization)),
                            len(ranked),
                            Candidate(
                                f"{similarity}, {normalization}, C = {C:g}, "
                                f"{input_normalization}, {per_class} bases per class",
                                {
                                    **params,
                                    "similarity": similarity,
                                    "normalization": normalization,
                                    "input_normalization": input_normalization,
                                    "basis_per_class": per_class,
                                    "C": C,
                                },
                            ),
                        )
                    )
    return [candidate for *_, candidate in sorted(ranked, key=lambda r: r[:2])]


def _offered_normalizations(similarity: str, normalizations: tuple[str, ...]) -> list[str]:
    """The ``normalizations`` of :func:`large_basis_candidates` offered for ``similarity``, in
    their order: each once as ``auto`` resolves it, nystroem's for kernels only."""
    specs = [parse_spec(text) for text in measures(similarity)]
    all_positive_definite = all(spec.kind.positive_definite for spec in specs)
    offered, seen = [], set()
    for normalization in normalizations:
        resolved = resolve_normalization(normalization, specs)
        if resolved in seen or (resolved.startswith("nystroem") and not all_positive_definite):
            continue
        seen.add(resolved)
        offered.append(normalization)
    return offered


def document_measures_at(params: dict[str, Any], per_class: int) -> list[Candidate]:
    """``params`` with each other document measure alone (:func:`document_measures`),
    ``per_class`` basis items a class: the measure the folds chose on a sample of
    a few thousand quotes is not always the best on the split (fortunes, seed 1: the folds took
    ``sensing1(n=150)``, 42.77% on the test split at 432 quotes a class, where tf-idf
    ``linear`` scores 43.64%). ``linear`` first, then sensing1's widths nearest the chosen
    one (150 quotes' words when the choice has none)."""
    found = scaled_measure(params["similarity"])
    width = math.log(found[2] if found is not None and found[1] is SENSING_SCALE else 150.0)

    def distance(measure: str) -> float:
        scaled = measure_scale(measure)
        return -1.0 if scaled is None else abs(math.log(scaled[1]) - width)

    others = sorted((m for m in document_measures() if m != params["similarity"]), key=distance)
    return [
        Candidate(
            f"{measure}, {per_class} bases per class",
            {**params, "similarity": measure, "basis_per_class": per_class},
        )
        for measure in others
    ]


def ladder_around(C: float, steps: int) -> list[float]:
    """The values of :data:`C_LADDER` up to ``steps`` rungs either way of the one nearest
    ``C`` (on a log scale), in increasing order."""
    at = int(np.argmin(np.abs(np.log(C_LADDER) - math.log(C))))
    low, high = max(0, at - steps), min(len(C_LADDER), at + steps + 1)
    return [*C_LADDER[low:at], *C_LADDER[at + 1 : high]]


@dataclass(frozen=True)
class KindRules:
    """What the selection does differently for a kind of input."""

    normalization: str  # the similarity normalisation every candidate uses
    max_features: int  # basis items times the measures' weight, in the selection
    grown_max_share: float | None  # the basis grown for the split: at most this share of the items
    grow_unsampled: bool  # grow the basis even when the selection saw every training item
    input_normalizations: tuple[str, ...]  # chosen with the widths and C
    documents: bool
    # a basis selected on a sample grows along the validated ladder from at most this many
    # features (None: the grown size) ...
    first_rung_features: int | None
    # ... and the large-basis search runs at its top even when that is the rung taken (its
    # candidates differ in more than the size)
    search_at_the_rung: bool
    # splits up to this many items cross-validate the kernel's map at every item after the
    # ladder (0: never; training.selection.kernel_grid)
    kernel_grid_max_items: int
    # the ladder's default budget per 1,000 items of the split (training.selection.budget)
    ladder_budget_s_per_1000_items: float

    def ladder_budget(self, n_split_items: int, selection_budget_s: float) -> float:
        """The basis ladder's default budget in seconds on a split of ``n_split_items`` items
        (:func:`~training.selection.budget.ladder_budget_for` at this kind's rate)."""
        return ladder_budget_for(
            n_split_items, selection_budget_s, self.ladder_budget_s_per_1000_items
        )

    def large_basis_normalizations(self, n_split_items: int) -> tuple[str, ...]:
        """The normalisations the basis ladder's large-basis search offers on a split of
        ``n_split_items`` items: :data:`LARGE_BASIS_NORMALIZATIONS`, the kernel's own map first,
        on dense splits the kernel grid does not reach (above :attr:`kernel_grid_max_items`),
        so that the kernel's map is offered on every dense split (to kernels only:
        :func:`large_basis_candidates`); elsewhere :data:`LARGE_BASIS_NORMALIZATION` alone
        (documents: their other measures, whatever these say)."""
        if self.offers_kernel_map_on_the_split(n_split_items):
            return LARGE_BASIS_NORMALIZATIONS
        return (LARGE_BASIS_NORMALIZATION,)

    def offers_kernel_map_on_the_split(self, n_split_items: int) -> bool:
        """Whether the large-basis search on a split of ``n_split_items`` items stands in for
        the kernel grid: dense splits above :attr:`kernel_grid_max_items`, which the grid does
        not reach."""
        return not self.documents and n_split_items > self.kernel_grid_max_items

    def large_basis_budget(self, n_split_items: int, selection_budget_s: float) -> float:
        """The large-basis search's default budget in seconds on a split of ``n_split_items``
        items: on dense splits above the kernel grid's bound, where the search stands in for
        the grid and offers the kernel's map (:meth:`large_basis_normalizations`; one such fit
        at 100,000 items takes minutes), the ladder's (:meth:`ladder_budget`); elsewhere the
        selection's, as the kernel grid's beside it."""
        if self.offers_kernel_map_on_the_split(n_split_items):
            return self.ladder_budget(n_split_items, selection_budget_s)
        return selection_budget_s

    def climbs_ladder(
        self, validated_items: int, n_train: int, whole_split: bool, this_machine: bool
    ) -> bool:
        """Whether the basis grows along the validated ladder
        (:mod:`training.selection.basis_ladder`): inputs selected on a sample of a split held in
        this process (on a cluster, or from shards, it grows by its share)."""
        return whole_split and this_machine and validated_items < n_train

    def first_rung(self, grown: int, similarity: str, class_counts) -> int:
        """The basis ladder's first rung: the basis ``grown`` for the split (per class),
        within :attr:`first_rung_features` of a basis drawn from the split's ``class_counts``
        items a class (:func:`basis_cap`; the split's, not the ladder's fit part's: the final
        fit's basis is drawn from the split)."""
        if self.first_rung_features is None:
            return grown
        return min(grown, basis_cap(similarity, class_counts, self.first_rung_features))

    def grows_basis(self, validated_items: int, n_train: int) -> bool:
        """Whether the chosen basis grows from the folds to the whole split."""
        return self.grow_unsampled or validated_items < n_train

    def grown_feature_limits(
        self, n_train: int, memory_budget: int, squares: int
    ) -> dict[str, int]:
        """The limits on a grown basis of ``n_train`` training items, by name, in features
        (basis items times the measures' weight): the features within ``memory_budget`` bytes
        beside ``squares`` F x F matrices (:func:`held_square_matrices`,
        :func:`~training.selection.memory.features_within`) and the kind's share of the items
        where it has one."""
        limits = {GROWN_WITHIN_MEMORY: max(1, features_within(n_train, memory_budget, squares))}
        if self.grown_max_share is not None:
            limits["the share of the items"] = max(1, int(self.grown_max_share * n_train))
        return limits

    def coarse_C(self, measure: str) -> tuple[float, ...]:
        """The values of C the coarse grid tries with ``measure``."""
        if self.documents:
            return COARSE_C_DOCUMENTS
        return COARSE_C_LINEAR if parse_spec(measure).kind.linear_in_input else COARSE_C


DENSE_RULES = KindRules(
    normalization="auto",
    max_features=MAX_FEATURES,
    grow_unsampled=False,
    grown_max_share=MAX_GROWN_SHARE,
    input_normalizations=(GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION),
    documents=False,
    first_rung_features=MAX_FIRST_RUNG_FEATURES,
    search_at_the_rung=False,
    kernel_grid_max_items=KERNEL_GRID_MAX_ITEMS,
    ladder_budget_s_per_1000_items=LADDER_BUDGET_S_PER_1000_ITEMS,
)

DOCUMENT_RULES = KindRules(
    normalization=DOCUMENT_NORMALIZATION,
    max_features=MAX_DOCUMENT_FEATURES,
    grow_unsampled=True,
    # On fortunes (the document set measured) test accuracy grows with the basis to every
    # training quote, past the 6,400 features the grown basis was once capped at (44.92% at 200
    # a class, 45.68% at every quote): only the memory budget bounds it
    # (docs/measurements/model-selection.md#documents-every-quote-and-every-word).
    grown_max_share=None,
    input_normalizations=(GLOBAL_NORMALIZATION,),  # documents are not input-normalised
    documents=True,
    # the grown basis, in proportion to the items, within the memory budget (fortunes: every
    # quote of the ladder's fit part since the bound counts small classes at their size)
    first_rung_features=None,
    search_at_the_rung=True,
    # documents are under besvm, and their measures' maps are not a kernel SVM's
    kernel_grid_max_items=0,
    ladder_budget_s_per_1000_items=DOCUMENT_LADDER_BUDGET_S_PER_1000_ITEMS,
)


def rules_for(spec: InputSpec) -> KindRules:
    return DOCUMENT_RULES if spec.is_documents else DENSE_RULES
