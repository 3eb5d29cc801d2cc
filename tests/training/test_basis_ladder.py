"""The basis ladder on the whole training split (training/selection/basis_ladder.py): it grows
while a larger basis pays on the hold-out, stops when the gain is within its standard error,
keeps its bounds (every item, memory, time), and lists its path in the selection's record."""

import itertools
import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_wine, make_classification
from sklearn.model_selection import train_test_split

from service.model.inputs.spec import InputSpec
from tests.training.computing import another_thread_computing
from training import BasisExpandingSVC, ForwardSelectionCV
from training.estimator.solver import cpu_time_limit
from training.selection import budget as selection_budget
from training.selection import holdout as holdout_module
from training.selection import space
from training.selection.basis_ladder import (
    climb_basis_ladder,
    describe_large_basis,
    ladder_sizes,
    scaled_fit_cost,
)
from training.selection.budget import SelectionBudget, ladder_budget_for
from training.selection.folds import paired_gain
from training.selection.holdout import HOLDOUT_SHARE, HoldOut
from training.selection.memory import basis_per_class_within
from training.selection.space import Candidate, document_measures_at

pytestmark = pytest.mark.slow

GENEROUS = 600.0


def _digits():
    X, y = load_digits(return_X_y=True)
    return X.astype(np.float64), y.astype(str)


def _wine():
    X, y = load_wine(return_X_y=True)
    return X, y.astype(str)


def _three_classes_of_1200():
    """1,200 items of 8 numbers in 3 classes (labels as str), and an estimator that reads
    them."""
    X, y = make_classification(
        n_samples=1200, n_features=8, n_informative=6, n_classes=3, random_state=0
    )
    estimator = BasisExpandingSVC(n_jobs=1, input_shape=str(InputSpec("vector", (8,))))
    return X, y.astype(str), estimator


def _climb(
    X,
    y,
    similarity,
    start,
    *,
    budget=GENEROUS,
    memory_budget=None,
    C=10.0,
    normalization="auto",
    prefer="cost",
    work=None,
):
    return climb_basis_ladder(
        BasisExpandingSVC(n_jobs=1),
        {"similarity": similarity, "C": C, "normalization": normalization},
        X,
        y,
        start=start,
        weight=1.0,
        min_gain_se=1.0,
        budget=SelectionBudget(budget, 1),
        memory_budget=memory_budget,
        prefer=prefer,
        work=work,
    )


def test_the_ladder_grows_while_a_larger_basis_pays():
    X, y = _digits()
    result = _climb(X, y, "rbf(gamma=1)", 2)
    sizes = [rung["basis_per_class"] for rung in result.path]
    assert sizes == [2 * 2**k for k in range(len(sizes))]  # doubling from the start
    # Two images a class are far from enough for ten digits: the ladder climbs.
    assert result.basis_per_class >= 8
    taken = [rung for rung in result.path if rung["taken"]]
    assert taken[0]["basis_per_class"] == 2
    assert taken[-1]["basis_per_class"] == result.basis_per_class
    for rung in taken[1:]:  # each step up is a real gain
        assert rung["gain"] > rung["standard_error"] > 0
    assert result.path[-1]["held_out_accuracy"] > result.path[0]["held_out_accuracy"] + 0.03
    # The hold-out is a stratified fifth of the split, never fitted on.
    assert result.holdout_items == round(HOLDOUT_SHARE * len(y))
    assert result.fit_items + result.holdout_items == len(y)


def test_the_held_out_accuracy_is_that_of_a_model_fitted_without_the_hold_out():
    X, y = _digits()
    result = _climb(X, y, "rbf(gamma=1)", 4, budget=0.05)  # one rung
    X_fit, X_held, y_fit, y_held = train_test_split(
        X, y, test_size=result.holdout_items, stratify=y, random_state=0
    )
    model = BasisExpandingSVC(n_jobs=1, similarity="rbf(gamma=1)", C=10.0, basis_per_class=4)
    expected = float(np.mean(model.fit(X_fit, y_fit).predict(X_held) == y_held))
    assert result.path[0]["held_out_accuracy"] == pytest.approx(expected, abs=1e-12)


def test_the_ladder_stops_when_the_gain_is_within_its_standard_error():
    # A linear measure on wine's 13 numbers has rank 13 at most: 8 bases a class span what 16
    # do, and the held-out predictions do not change.
    X, y = _wine()
    result = _climb(X, y, "linear", 8, C=1.0)
    assert [rung["basis_per_class"] for rung in result.path] == [8, 16]
    last = result.path[-1]
    assert not last["taken"]
    assert last["gain"] <= last["standard_error"]
    assert result.basis_per_class == 8
    assert result.stopped.startswith("gain below min_gain_se standard errors")


@pytest.mark.parametrize("prefer", ["cost", "accuracy"])
def test_a_rung_within_the_noise_is_taken_as_prefer_says(prefer):
    """The search's rule on the rungs: a gain beyond a standard error is taken; within it a
    larger basis (never cheaper to predict) is taken only under "accuracy", when it scores
    better. On digits from 4 a class, 16 a class gains exactly its error over 8."""
    X, y = _digits()
    result = _climb(X, y, "rbf(gamma=1)", 4, prefer=prefer)
    for rung in result.path[1:]:
        beyond = rung["gain"] > rung["standard_error"]
        assert rung["taken"] == (beyond or (prefer == "accuracy" and rung["gain"] > 0)), rung
    within = [r for r in result.path[1:] if r["taken"] and r["gain"] <= r["standard_error"]]
    assert bool(within) == (prefer == "accuracy")
    taken = [rung["basis_per_class"] for rung in result.path if rung["taken"]]
    assert result.basis_per_class == taken[-1]


def test_a_rung_cheaper_than_the_last_taken_and_as_accurate_is_taken_under_cost():
    """The rule compares a rung's prediction work with the last rung taken's: were a larger
    basis cheaper (a work that falls with the basis), a rung as accurate would win the tie
    under "cost", as a cheaper candidate does in the search."""
    X, y = _digits()
    result = _climb(X, y, "rbf(gamma=1)", 4, work=lambda params: -params["basis_per_class"])
    within = [r for r in result.path[1:] if r["taken"] and r["gain"] <= r["standard_error"]]
    assert within  # 16 a class, within its error over 8, taken as cheaper
    for rung in result.path[1:]:
        assert rung["taken"] == (rung["gain"] >= 0), rung


def test_the_gain_and_its_error_are_the_paired_difference_on_the_hold_out():
    rng = np.random.default_rng(0)
    reference = rng.random((1, 400)) < 0.8
    candidate = reference | (rng.random((1, 400)) < 0.1)
    gain, error = paired_gain(candidate, reference)
    differences = candidate[0].astype(float) - reference[0]
    assert gain == pytest.approx(differences.mean())
    assert error == pytest.approx(differences.std(ddof=1) / math.sqrt(400))


def test_every_item_of_the_largest_class_is_the_top_rung():
    X, y = _wine()
    fit_largest = 57  # 71 items of the largest class, less its fifth held out
    result = _climb(X, y, "rbf(gamma=1)", 100)
    assert [rung["basis_per_class"] for rung in result.path] == [fit_largest]
    assert result.stopped == "every item of the largest class"
    # The final fit takes every item of the split's largest class.
    assert result.basis_per_class == 71


def test_the_memory_budget_caps_the_ladder():
    X, y = _digits()
    # Memory for 6 bases a class (60 features on 1,797 items: 8 * (1,797 * 60 + 3 * 60^2)
    # bytes) and not 7.
    budget = 8 * (len(y) * 60 + 3 * 60**2)
    assert basis_per_class_within(np.unique(y, return_counts=True)[1], 1.0, budget) == 6
    result = _climb(X, y, "rbf(gamma=1)", 2, memory_budget=budget)
    assert result.memory_bound_per_class == 6
    assert max(rung["basis_per_class"] for rung in result.path) <= 6
    if all(rung["taken"] for rung in result.path):
        assert result.stopped == "memory bound"
        assert result.path[-1]["basis_per_class"] == 6


def test_the_memory_bound_counts_the_square_matrices_of_the_normalisation():
    X, y = _digits()
    # 20 bases a class of an rbf: 200 features of 1,797 items, beside nystroem's three
    # 200 x 200 matrices (the basis Gram matrix, its eigenvectors, the projection).
    budget = 8 * (len(y) * 200 + 3 * 200**2)
    nystroem = _climb(X, y, "rbf(gamma=1)", 30, memory_budget=budget)
    assert nystroem.memory_bound_per_class == 20
    # besvm keeps the basis Gram matrix alone: F^2 + 1,797 F fits budget / 8 up to F = 235
    # (477,520 numbers; 236 would be 479,788 of 479,400), 23 a class.
    besvm = _climb(X, y, "rbf(gamma=1)", 30, memory_budget=budget, normalization="besvm")
    assert besvm.memory_bound_per_class == 23
    assert [rung["basis_per_class"] for rung in besvm.path] == [23]


def test_the_time_budget_stops_the_ladder_after_its_first_rung():
    X, y = _digits()
    result = _climb(X, y, "rbf(gamma=1)", 2, budget=0.05)
    assert len(result.path) == 1
    assert result.stopped == "time budget spent"
    assert result.basis_per_class == 2


def test_a_hold_out_fit_on_one_thread_counts_its_own_cpu_time():
    """Fits on one core are counted by their thread's clock: another thread of the process
    computing meanwhile (a core's worth) is not counted, where the process's clock counted
    it."""
    X, y = _digits()
    holdout = HoldOut(X, y, 0)
    params = {"similarity": "rbf(gamma=1)", "basis_per_class": 50, "C": 100.0}
    BasisExpandingSVC(n_jobs=1).set_params(**params).fit(X[:200], y[:200])  # compiled
    budget = SelectionBudget(GENEROUS, 1)
    with another_thread_computing() as other:
        process, others = time.process_time(), other.cpu_time()
        # every core's n_jobs: the hold-out fits on the budget's one core all the same
        scored = [holdout.score(BasisExpandingSVC(), params, budget) for _ in range(3)]
        # the other thread's window inside the process's: read it last at the start, first here
        others = other.cpu_time() - others
        process = time.process_time() - process
    assert all(fit.model.n_jobs == 1 for fit in scored)
    assert others > 0.1
    # What the process spent, less the other thread's, is the fits' and this thread's rest.
    assert 0 < budget.cpu_seconds <= process - others


@pytest.mark.parametrize(("cores", "clock"), [(1, time.thread_time), (2, time.process_time)])
def test_a_hold_out_fits_time_limit_reads_the_fits_clock(cores, clock, monkeypatch):
    """The solver's time limit reads the clock the fit is counted by: on one core its thread's,
    so that another thread's work does not cut it short either."""
    given = []

    def recording(seconds, fit_clock=time.process_time):
        given.append(fit_clock)
        return cpu_time_limit(seconds, fit_clock)

    monkeypatch.setattr(holdout_module, "cpu_time_limit", recording)
    X, y = _wine()
    params = {"similarity": "rbf(gamma=1)", "basis_per_class": 10, "C": 1.0}
    HoldOut(X, y, 0).score(BasisExpandingSVC(), params, SelectionBudget(GENEROUS, cores))
    assert given == [clock]


def test_a_hold_out_fit_stops_where_its_budget_runs_out():
    # A fit's cost is known only once it has run: the solver stops at what is left of the
    # budget, and the model is scored as it stands.
    X, y = _digits()
    holdout = HoldOut(X, y, 0)
    params = {"similarity": "rbf(gamma=1)", "basis_per_class": 20, "C": 100.0}
    roomy = SelectionBudget(GENEROUS, 1)
    finished = holdout.score(BasisExpandingSVC(n_jobs=1), params, roomy)
    assert finished.model.n_iter_ > 0
    assert not finished.truncated
    spent = SelectionBudget(10.0, 1)
    spent.add(10.0)
    stopped = holdout.score(BasisExpandingSVC(n_jobs=1), params, spent)
    assert stopped.model.n_iter_ == 0  # the zero weights: one class for every item
    assert stopped.truncated  # never to be taken
    assert stopped.correct.shape == (1, len(holdout.held))
    assert spent.used_s == pytest.approx(10.0 + stopped.cost)
    # The ladder's first rung, which every later one is compared with, is not cut short.
    first = holdout.score(BasisExpandingSVC(n_jobs=1), params, spent, bounded=False)
    assert first.model.n_iter_ == finished.model.n_iter_
    assert not first.truncated
    # A reserve is left to what comes after: a fit may not spend it.
    reserved = holdout.score(BasisExpandingSVC(n_jobs=1), params, roomy, reserve=GENEROUS)
    assert reserved.truncated


def test_ladder_sizes_double_to_the_top():
    assert ladder_sizes(100, 1000) == [100, 200, 400, 800, 1000]
    assert ladder_sizes(100, 400) == [100, 200, 400]
    assert ladder_sizes(500, 400) == [500]


def test_a_selection_on_a_sample_records_its_ladder():
    X, y, estimator = _three_classes_of_1200()
    selection = ForwardSelectionCV(estimator, budget=GENEROUS, n_jobs=1, max_items=300, refit=False)
    selection.fit(X, y)
    ladder = selection.record()["basis_ladder"]
    assert ladder == selection.ladder_
    assert json.loads(json.dumps(selection.record()))["basis_ladder"] == ladder  # for the manifest
    path = ladder["path"]
    assert path[0]["taken"]
    assert {"basis_per_class", "held_out_accuracy", "seconds"} <= set(path[0])
    # The first rung is the basis grown from the folds; the choice is the last rung taken.
    assert path[0]["basis_per_class"] >= selection.searched_basis_per_class_
    taken = [rung["basis_per_class"] for rung in path if rung["taken"]]
    # Then the kernel SVM's grid on the split (training/selection/kernel_grid.py), against the
    # ladder's choice; the choice is the grid's where it took one.
    grid = selection.record()["kernel_grid"]
    assert grid == selection.kernel_grid_
    assert json.loads(json.dumps(grid)) == grid
    assert grid["items"] == 1200
    assert grid["compared_with"]["basis_per_class"] in (taken[-1], 400)  # 400: every item
    assert selection.best_params_ == (grid["chosen"] or grid["compared_with"])
    assert "basis ladder on the split" in selection.describe()
    assert "kernel grid on the split" in selection.describe()


def test_the_ladder_budget_grows_with_the_split_not_the_sample(monkeypatch):
    # A selection's budget grows with the items it cross-validates (a sample), the ladder's with
    # the split its rungs are fitted on. Here the sample's budget (0.01 s per 1,000 items) would
    # stop the ladder after its first rung; the split's (1,000 s per 1,000 items) lets it climb.
    monkeypatch.setattr(selection_budget, "BUDGET_S_PER_1000_ITEMS", 0.01)
    monkeypatch.setattr(
        space, "DENSE_RULES", replace(space.DENSE_RULES, ladder_budget_s_per_1000_items=1000.0)
    )
    X, y, estimator = _three_classes_of_1200()
    selection = ForwardSelectionCV(estimator, n_jobs=1, max_items=300, refit=False)
    selection.fit(X, y)
    assert selection.budget_s_ == 0.01
    assert selection.ladder_budget_s_ == 1200.0
    ladder = selection.record()["basis_ladder"]
    assert ladder["budget_s"] == 1200.0
    assert len(ladder["path"]) >= 2
    assert ladder["stopped"] != "time budget spent"
    # the large-basis search's is the selection's where the kernel grid follows it (1,200 items)
    assert selection.large_basis_budget_s_ == ladder["large_basis"]["budget_s"] == 0.01
    # A budget given is the ladder's too, and the large-basis search's.
    given = ForwardSelectionCV(estimator, budget=0.01, n_jobs=1, max_items=300, refit=False)
    given.fit(X, y)
    assert given.ladder_budget_s_ == given.ladder_["budget_s"] == 0.01
    assert given.large_basis_budget_s_ == 0.01
    assert len(given.ladder_["path"]) == 1
    assert given.ladder_["stopped"] == "time budget spent"


@pytest.mark.slow
def test_above_the_kernel_grids_bound_the_large_basis_search_has_the_ladders_budget(monkeypatch):
    # the sample's budget 0.01 s; the ladder's 2 s on the split's 1,200 items, and the
    # large-basis search's the same where no kernel grid follows it
    monkeypatch.setattr(selection_budget, "BUDGET_S_PER_1000_ITEMS", 0.01)
    monkeypatch.setattr(
        space,
        "DENSE_RULES",
        replace(
            space.DENSE_RULES, ladder_budget_s_per_1000_items=2.0 / 1.2, kernel_grid_max_items=1199
        ),
    )
    X, y, estimator = _three_classes_of_1200()
    selection = ForwardSelectionCV(estimator, n_jobs=1, max_items=300, refit=False)
    selection.fit(X, y)
    assert selection.budget_s_ == 0.01
    assert selection.ladder_budget_s_ == pytest.approx(2.0)
    assert selection.large_basis_budget_s_ == selection.ladder_budget_s_
    assert selection.ladder_["large_basis"]["budget_s"] == selection.ladder_budget_s_
    assert selection.kernel_grid_ is None


def test_the_kernel_grid_runs_on_splits_of_a_few_thousand_items_only(monkeypatch):
    X, y, estimator = _three_classes_of_1200()
    tiny = ForwardSelectionCV(estimator, budget=0.01, n_jobs=1, max_items=300, refit=False)
    assert tiny.fit(X, y).kernel_grid_["items"] == 1200
    # above the rules' bound, the ladder's choice is final and the record has no kernel grid
    monkeypatch.setattr(
        space, "DENSE_RULES", replace(space.DENSE_RULES, kernel_grid_max_items=1199)
    )
    selection = tiny.fit(X, y)
    assert selection.ladder_ is not None
    assert selection.kernel_grid_ is None
    assert "kernel_grid" not in selection.record()


def test_above_the_kernel_grids_bound_the_ladders_search_offers_the_kernels_map_first():
    # Up to the kernel grid's bound the grid offers the kernel's map on the split, and the
    # ladder's large-basis search besvm alone under the selection's budget; above it the search
    # offers the kernel's map too, first, under the ladder's budget (its fits are the split's).
    rules = space.DENSE_RULES
    assert not rules.offers_kernel_map_on_the_split(5000)
    assert rules.offers_kernel_map_on_the_split(5001)
    assert not space.DOCUMENT_RULES.offers_kernel_map_on_the_split(100_000)
    assert rules.large_basis_normalizations(5000) == (space.LARGE_BASIS_NORMALIZATION,)
    assert rules.large_basis_normalizations(5001) == (
        space.KERNEL_MAP_NORMALIZATION,
        space.LARGE_BASIS_NORMALIZATION,
    )
    assert rules.large_basis_budget(5000, 120.0) == 120.0
    assert rules.large_basis_budget(100_000, 120.0) == pytest.approx(300.0)
    # documents: their other measures under besvm, the selection's budget, at any size
    assert space.DOCUMENT_RULES.large_basis_normalizations(100_000) == (
        space.LARGE_BASIS_NORMALIZATION,
    )
    assert space.DOCUMENT_RULES.large_basis_budget(100_000, 40.0) == 40.0


@pytest.mark.slow
def test_a_split_the_kernel_grid_does_not_reach_searches_the_kernels_map_on_the_ladder(
    monkeypatch,
):
    X, y, estimator = _three_classes_of_1200()
    selection = ForwardSelectionCV(estimator, budget=5.0, n_jobs=1, max_items=300, refit=False)

    def searched():
        selection.fit(X, y)
        large = selection.ladder_["large_basis"]
        assert large["budget_s"] == selection.large_basis_budget_s_ == 5.0
        return [entry["change"] for entry in large["candidates"]]

    within = searched()
    assert selection.kernel_grid_ is not None
    assert within
    assert not any("nystroem(clip)" in change for change in within)
    monkeypatch.setattr(
        space, "DENSE_RULES", replace(space.DENSE_RULES, kernel_grid_max_items=1199)
    )
    above = searched()
    assert selection.kernel_grid_ is None
    assert "nystroem(clip)" in above[0]
    assert any("besvm" in change for change in above)


def test_the_ladder_budget_is_the_selections_up_to_40000_items():
    assert ladder_budget_for(10_000, 120.0) == ladder_budget_for(40_000, 120.0) == 120.0
    assert ladder_budget_for(100_000, 120.0) == pytest.approx(300.0)
    assert ladder_budget_for(1_000_000, 120.0) == pytest.approx(3000.0)
    assert space.DENSE_RULES.ladder_budget(100_000, 120.0) == pytest.approx(300.0)


# The classes of fortunes' seed-1 split less the ladder's hold-out (load_dataset("fortunes",
# seed=1), HoldOut(..., 0).fit).
FORTUNES_SEED_1_FIT_COUNTS = [
    62, 77, 88, 90, 90, 97, 118, 119, 122, 124, 125, 136, 157, 164, 170, 202, 255, 258, 279, 300,
    324, 329, 349, 375, 378, 390, 422, 432, 630, 680, 722, 750,
]  # fmt: skip


def test_the_ladder_budget_of_documents_holds_two_rungs_of_fortunes():
    # A rung of fortunes' seed 1 (551 a class of 8,814 fit quotes) took 189 CPU seconds, and the
    # next (every quote, 750 a class) adds 7% of its items: the dense rate's 120 s held the first
    # alone, the documents' rate holds both.
    documents = space.DOCUMENT_RULES.ladder_budget(11_018, 120.0)
    assert documents == pytest.approx(40.0 * 11.018)
    assert space.DENSE_RULES.ladder_budget(11_018, 120.0) == 120.0
    counts = FORTUNES_SEED_1_FIT_COUNTS
    assert sum(counts) == 8814
    first, second = 189.0, scaled_fit_cost(189.0, 551, 750, counts)
    assert second == pytest.approx(189.0 * 8814 / 8236)
    assert first + second <= documents
    assert documents < first + 2 * first  # twice the last rung, the former estimate, overran
    # At 1,000 items a text selection's budget (40 s) is the floor.
    assert space.DOCUMENT_RULES.ladder_budget(1_000, 40.0) == 40.0


def test_the_ladder_predicts_each_rung_from_the_last_by_its_bases_items():
    # Digits with one class whole and the others cut to 30 images: past 24 a class (the small
    # classes' fit part) a rung adds the large class's items only.
    X, y = _digits()
    keep = np.concatenate(
        [np.flatnonzero(y == "0")] + [np.flatnonzero(y == c)[:30] for c in np.unique(y)[1:]]
    )
    X, y = X[keep], y[keep]
    result = _climb(X, y, "rbf(gamma=1)", 20)
    path = result.path
    assert [rung["basis_per_class"] for rung in path][:2] == [20, 40]
    assert "predicted_cost_s" not in path[0]  # the first rung runs whatever it costs
    fit_counts = np.unique(y[HoldOut(X, y, 0).fit], return_counts=True)[1]
    assert sorted(fit_counts)[:9] == [24] * 9
    for before, rung in itertools.pairwise(path):
        items = [np.minimum(fit_counts, r["basis_per_class"]).sum() for r in (before, rung)]
        assert rung["n_basis"] == items[1]
        assert rung["predicted_cost_s"] == pytest.approx(
            before["cost_s"] * items[1] / items[0], rel=1e-3, abs=1e-3
        )
    # 20 to 40 a class adds 28% of the items, not 100%
    assert path[1]["predicted_cost_s"] < 1.5 * path[0]["cost_s"] + 1e-3
    # What the ladder's budget counted is its rungs' costs, whatever their wall time.
    assert result.budget_used_s == pytest.approx(
        sum(rung["cost_s"] for rung in path), abs=1e-4 * len(path)
    )
    assert 0 < result.budget_used_s < result.budget_s


def test_a_fit_costs_its_bases_items_not_the_sizes_ratio():
    balanced = [500] * 10
    assert scaled_fit_cost(10.0, 100, 200, balanced) == pytest.approx(20.0)  # doubled
    assert scaled_fit_cost(10.0, 100, 400, balanced) == pytest.approx(40.0)
    # past the largest class the basis is every item, and costs no more
    assert scaled_fit_cost(10.0, 500, 1000, balanced) == pytest.approx(10.0)
    # a rung past the small classes adds the large classes' items only
    unbalanced = [10, 10, 1000]
    assert scaled_fit_cost(12.0, 10, 20, unbalanced) == pytest.approx(16.0)  # 30 to 40 items
    assert scaled_fit_cost(12.0, 20, 10, unbalanced) == pytest.approx(9.0)


def test_a_selection_on_every_item_has_no_ladder():
    X, y = _wine()
    selection = ForwardSelectionCV(
        BasisExpandingSVC(n_jobs=1), budget=GENEROUS, n_jobs=1, repeats=1, refit=False
    ).fit(X, y)
    assert selection.ladder_ is None
    assert selection.kernel_grid_ is None
    assert "basis_ladder" not in selection.record()
    assert "kernel_grid" not in selection.record()


def test_a_class_of_one_item_stays_in_the_fit_part():
    X, y = _digits()
    keep = np.flatnonzero(y != "9")
    one_nine = np.flatnonzero(y == "9")[:1]
    positions = np.concatenate([keep, one_nine])
    result = _climb(X[positions], y[positions], "rbf(gamma=1)", 4, budget=0.05)
    assert result.fit_items + result.holdout_items == len(positions)
    assert result.path[0]["held_out_accuracy"] > 0.8


def test_the_first_rung_is_capped_and_the_ladder_climbs_from_there(monkeypatch):
    # The grown basis would be 6 times the folds' share; the first rung, taken unvalidated,
    # keeps within the dense rules' first_rung_features (MAX_FIRST_RUNG_FEATURES; here 30
    # features: 10 a class for one measure and three classes), and the ladder doubles from it.
    monkeypatch.setattr(space, "DENSE_RULES", replace(space.DENSE_RULES, first_rung_features=30))
    X, y, estimator = _three_classes_of_1200()
    selection = ForwardSelectionCV(
        estimator, budget=GENEROUS, n_jobs=1, max_items=300, refit=False
    ).fit(X, y)
    # the folds' choice, which the first rung grows (the kernel grid may change the final one)
    measures = len(selection.path_[-1]["similarity"].split("+"))
    searched = selection.searched_basis_per_class_
    grown = max(searched, min(6 * searched, 400, 240 // (3 * measures)))
    path = selection.ladder_["path"]
    assert path[0]["basis_per_class"] == min(grown, 30 // (3 * measures)) < grown
    assert [rung["basis_per_class"] for rung in path[:2]] in (
        [path[0]["basis_per_class"]],
        [path[0]["basis_per_class"], 2 * path[0]["basis_per_class"]],
    )


def test_documents_searched_on_a_sample_climb_the_ladder_from_the_grown_basis(text_dataset):
    # Fortunes' accuracy grows to every training quote (docs/measurements/model-selection.md),
    # past the feature cap that bounded a document basis before: documents selected on a
    # sample climb the ladder as dense inputs do, from the basis grown in proportion to the
    # split (no first-rung cap: the dense rules' would be 4,000 features); then the other
    # document measures are tried at the ladder's top, even when that is the rung taken.
    selection = ForwardSelectionCV(
        BasisExpandingSVC(min_df=1), budget=GENEROUS, n_jobs=1, max_items=60, refit=False
    ).fit(text_dataset.X_train, text_dataset.y_train)
    assert selection.n_items_ == 60
    assert selection.kernel_grid_ is None  # documents: no kernel SVM's grid
    ladder = selection.record()["basis_ladder"]
    searched = selection.searched_basis_per_class_
    path = ladder["path"]
    # Folds of 40 items, a split of 120 (40 a class): three times the share, at most 40, and
    # no rung above the fit part's 32 a class.
    assert path[0]["basis_per_class"] == min(max(searched, min(3 * searched, 40)), 32)
    assert [rung["basis_per_class"] for rung in path] == ladder_sizes(
        path[0]["basis_per_class"], 32
    )[: len(path)]  # doubling towards the fit part's 32 documents a class
    taken = [rung["basis_per_class"] for rung in path if rung["taken"]]
    large = ladder["large_basis"]
    measures = {"linear", *(f"sensing1(n={n})" for n in (15, 50, 150, 500, 1500))}
    # (a refinement's candidates, after one is taken, name a width or C instead)
    scored = [
        entry["change"].split(", ")
        for entry in large["candidates"]
        if entry["change"].endswith("bases per class")
    ]
    assert scored
    assert all(measure in measures for measure, *_ in scored)
    # at the top the time budget allows, never below the rung taken
    assert all(int(rest[-1].split()[0]) >= taken[-1] for _, *rest in scored)
    chosen = large["chosen"]
    if chosen is None:
        assert selection.best_params_["basis_per_class"] in (taken[-1], 40)  # 40: every one
    else:
        assert selection.best_params_["similarity"] == chosen["similarity"]


def test_documents_on_the_split_try_the_other_measures_linear_first():
    params = {"similarity": "sensing1(n=1500)", "C": 1.0, "normalization": "besvm"}
    candidates = document_measures_at(params, 300)
    assert [c.params["similarity"] for c in candidates] == [
        "linear",
        "sensing1(n=500)",
        "sensing1(n=150)",
        "sensing1(n=50)",
        "sensing1(n=15)",
    ]  # the chosen left out, then outwards from its width
    assert all(
        c.params == {**params, "similarity": c.params["similarity"], "basis_per_class": 300}
        for c in candidates
    )
    linear = document_measures_at({**params, "similarity": "linear"}, 300)
    assert [c.params["similarity"] for c in linear][:3] == [
        "sensing1(n=150)",
        "sensing1(n=50)",
        "sensing1(n=500)",
    ]  # without a width of its own, from 150 words


@pytest.mark.parametrize(
    ("at_the_rung", "search_budget", "stopped"),
    [
        (False, GENEROUS, "no larger basis fits its time budget"),
        (True, GENEROUS, None),
        (True, 1e-6, "no basis fits its time budget"),
    ],
)
def test_the_large_basis_search_at_the_rung_taken(at_the_rung, search_budget, stopped):
    # The ladder starts at its top (the fit part's largest class), so the rung taken is the top:
    # a larger basis cannot be searched there, other measures can (documents), within the time
    # budget (one fit at the rung's cost).
    X, y = _wine()
    asked = []

    def offered(per_class):
        asked.append(per_class)
        changed = {"similarity": "rbf(gamma=1)", "C": 3.0, "basis_per_class": per_class}
        return [Candidate("C = 3", changed)]

    result = climb_basis_ladder(
        BasisExpandingSVC(n_jobs=1),
        {"similarity": "rbf(gamma=1)", "C": 10.0},
        X,
        y,
        start=1000,
        weight=1.0,
        min_gain_se=1.0,
        budget=SelectionBudget(GENEROUS, 1),
        large_basis=offered,
        large_basis_budget=SelectionBudget(search_budget, 1),
        search_at_the_rung=at_the_rung,
    )
    assert len(result.path) == 1
    top = result.path[0]["basis_per_class"]
    searched = result.record()["large_basis"]
    assert searched["budget_s"] == search_budget
    if stopped is None:
        assert asked == [top]
        assert result.large_basis[0]["change"] == "C = 3"
        # its budget counted its fits (at least the candidate's: a gain would have confirmed
        # it with more), and the ladder's its rung alone
        fits = [*searched["candidates"], *searched["shrink"]]
        assert searched["budget_used_s"] >= sum(fit["cost_s"] for fit in fits) - 0.01
        assert result.large_basis_budget_used_s > 0
        assert result.budget_used_s == pytest.approx(result.path[0]["cost_s"], abs=1e-4)
        assert f"of {GENEROUS:g} CPU s a core" in describe_large_basis(searched)
        # a record written before budgets were recorded reads without them
        older = {key: searched[key] for key in searched if not key.startswith("budget")}
        assert "CPU s a core" not in describe_large_basis(older)
    else:
        assert asked == []
        assert result.large_basis_stopped == stopped
        assert result.large_basis == []
        assert searched["budget_used_s"] == 0
