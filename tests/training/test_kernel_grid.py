"""The kernel SVM's grid after the basis ladder (training/selection/kernel_grid.py): the
ladder's choice and the kernel's map at every item, cross-validated on the whole split. Its
accuracies and gains are scikit-learn's cross-validation of the same configurations; it is
skipped where it does not apply and bounded by its budget. The selection's record of it:
tests/training/test_basis_ladder.py."""

import json
import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from service.model.inputs.spec import InputSpec
from service.model.similarity import parse_spec, split_specs
from training import BasisExpandingSVC
from training.selection.folds import FOLD_MAX_ITER, RACE_CHUNK
from training.selection.kernel_grid import (
    KERNEL_GRID_CANDIDATES,
    KERNEL_GRID_FOLDS,
    kernel_grid_candidates,
    search_kernel_grid,
)
from training.selection.sites import ThisMachine
from training.selection.space import DENSE_RULES, RBF_SCALE, prediction_work

pytestmark = pytest.mark.slow

GENEROUS = 600.0

# A weak choice for the grid to beat: a few basis items a class and a small C.
WEAK = {
    "similarity": "rbf(gamma=1)",
    "input_transform": None,
    "input_normalization": "global",
    "basis_per_class": 3,
    "basis_strategy": "index",
    "normalization": "besvm",
    "C": 0.01,
}


def _breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return X, y.astype(str)


def _estimator(n_features: int) -> BasisExpandingSVC:
    return BasisExpandingSVC(n_jobs=1, input_shape=str(InputSpec("vector", (n_features,))))


def _search(X, y, params, *, budget=GENEROUS, memory_budget=2**34, jobs=1, **kw):
    spec = InputSpec("vector", (X.shape[1],))
    return search_kernel_grid(
        _estimator(X.shape[1]),
        params,
        X,
        y,
        rules=DENSE_RULES,
        site=ThisMachine(),
        jobs=jobs,
        threads=1,
        budget_s=budget,
        memory_budget=memory_budget,
        min_gain_se=kw.pop("min_gain_se", 1.0),
        prefer=kw.pop("prefer", "cost"),
        work=lambda p: prediction_work(p, spec, len(np.unique(y))),
        **kw,
    )


def _cv_correct(X, y, params) -> np.ndarray:
    """Which items scikit-learn's 5-fold cross-validation predicts right under ``params``."""
    folds = StratifiedKFold(KERNEL_GRID_FOLDS, shuffle=True, random_state=0)
    # as the selection's fold fits, capped at FOLD_MAX_ITER steps
    model = clone(_estimator(X.shape[1])).set_params(**params, max_iter=FOLD_MAX_ITER)
    return cross_val_predict(model, X, y, cv=folds) == y


def test_the_kernels_map_at_every_item_replaces_a_weak_choice_by_cross_validation():
    X, y = _breast_cancer()
    result = _search(X, y, WEAK)
    chosen = result.params
    assert chosen is not None
    assert chosen["normalization"] == "nystroem(clip)"
    # every item of the largest class: with every item the basis, the kernel SVM
    assert chosen["basis_per_class"] == np.unique(y, return_counts=True)[1].max()
    start, taken = result.path
    # The accuracies and the gain are scikit-learn's cross-validation of the same two
    # configurations on the same folds (its own fold generator), item by item.
    weak, best = _cv_correct(X, y, WEAK), _cv_correct(X, y, chosen)
    assert start["cv_accuracy"] == pytest.approx(weak.mean(), abs=1e-12)
    assert taken["cv_accuracy"] == pytest.approx(best.mean(), abs=1e-12)
    differences = best.astype(float) - weak
    assert taken["gain"] == pytest.approx(differences.mean(), abs=1e-12)
    error = differences.std(ddof=1) / math.sqrt(len(y))
    assert taken["standard_error"] == pytest.approx(error, rel=1e-9)
    assert taken["gain"] > error  # the selection's rule: beyond one standard error
    record = json.loads(json.dumps(result.record()))
    assert record["compared_with"] == WEAK
    assert record["chosen"] == chosen
    assert record["stages"][0]["candidates"] == KERNEL_GRID_CANDIDATES
    # one job of one thread: the budget counted every CPU second of its fits, within it
    assert 0 < record["budget_used_s"] == pytest.approx(record["cpu_seconds"], abs=0.01)
    assert record["budget_used_s"] < record["budget_s"]


def test_a_gain_within_the_noise_is_taken_only_when_accuracy_is_preferred():
    X, y = _breast_cancer()
    # no gain exceeds a million standard errors: the costlier kernel SVM wins only within the
    # noise, which prefer="cost" refuses and prefer="accuracy" takes
    kept = _search(X, y, WEAK, min_gain_se=1e6, prefer="cost")
    assert kept.params is None
    assert len(kept.path) == 1
    assert kept.stopped == "every candidate scored or raced out"
    taken = _search(X, y, WEAK, min_gain_se=1e6, prefer="accuracy")
    assert taken.params is not None
    assert taken.path[-1]["why"] == "more accurate, within the noise"


def test_candidates_are_the_kernels_map_of_positive_definite_measures_only():
    candidates = kernel_grid_candidates(WEAK, DENSE_RULES, 100)
    assert len(candidates) == KERNEL_GRID_CANDIDATES
    for candidate in candidates:
        assert candidate.params["normalization"] == "nystroem(clip)"
        assert candidate.params["basis_per_class"] == 100

    # An indefinite measure's clipped map is no kernel's: a joined one leaves its kernels alone,
    # in either order, and a choice with no kernel of a width gets the starting rbf's.
    def offered(similarity):
        return kernel_grid_candidates({**WEAK, "similarity": similarity}, DENSE_RULES, 100)

    for similarity in ("rigid(1)", "deformable(1, 1)", "linear", "rbf(gamma=1) + rigid(1)"):
        assert offered(similarity)
        for candidate in offered(similarity):
            specs = [parse_spec(text) for text in split_specs(candidate.params["similarity"])]
            assert all(spec.kind.positive_definite for spec in specs)
    assert offered("rigid(1) + rbf(gamma=4)") == offered("rbf(gamma=4)")
    # a joined kernel's scaled measure alone: an SVC's grid is of one kernel
    assert offered("rbf(gamma=4) + linear") == offered("rbf(gamma=4)")
    assert offered("rbf(gamma=4) + rigid(1)") == offered("rbf(gamma=4)")
    assert offered("rigid(1)") == offered("rbf(gamma=1)")


def test_the_first_racing_chunk_spans_the_widths_and_both_input_normalisations():
    # spambase, seed 0, on 2 cores: the ladder chose a narrow rbf joined to linear, and the
    # kernel's map at every item needs rbf(gamma=0.25) on per-feature inputs (fold 1: 94.35%
    # at C = 10, 93.77% at C = 100, where rbf(gamma=16) scores 82%)
    narrow = {**WEAK, "similarity": "rbf(gamma=16) + linear", "input_normalization": "per-feature"}
    candidates = kernel_grid_candidates(narrow, DENSE_RULES, 100)
    settings = [
        (c.params["similarity"], c.params["input_normalization"], c.params["C"]) for c in candidates
    ]
    assert len(set(settings)) == len(settings) == KERNEL_GRID_CANDIDATES
    chunk = settings[:RACE_CHUNK]
    assert ("rbf(gamma=0.25)", "per-feature", 10.0) in chunk
    assert {s for s, _, _ in chunk} == {f"rbf(gamma={g:g})" for g in RBF_SCALE.coarse}
    assert {i for _, i, _ in chunk} == {"global", "per-feature"}
    # the nearest width first (one coarse step narrower than 16 is past the grid: 16), the
    # chosen input normalisation first at each width, C small before large
    assert settings[0] == ("rbf(gamma=16)", "per-feature", 10.0)
    assert settings[1] == ("rbf(gamma=16)", "global", 10.0)
    assert settings[len(RBF_SCALE.coarse) * 2] == ("rbf(gamma=16)", "per-feature", 100.0)


def test_where_every_items_features_exceed_the_memory_budget_it_is_skipped():
    X, y = _breast_cancer()
    result = _search(X, y, WEAK, memory_budget=10**6)
    assert result.params is None
    assert "exceed the memory budget" in result.stopped
    assert result.path == []


def test_the_memory_budget_bounds_the_final_fit_and_the_fits_side_by_side():
    X, y = _breast_cancer()
    n, folds = len(y), KERNEL_GRID_FOLDS
    # Every item of the split is a basis item: n x n features and 3 n x n matrices, 8 bytes
    # a number. A budget that holds a fold fit (4/5 of the items) but not the final fit on the
    # whole split offers nothing.
    final = 8 * (n * n + 3 * n * n)
    fold = 8 * 4 * math.ceil(n * (folds - 1) / folds) ** 2  # the largest fold's training part
    assert fold < final - 1
    skipped = _search(X, y, WEAK, memory_budget=final - 1)
    assert "exceed the memory budget" in skipped.stopped
    # One that holds the final fit holds one fold fit at a time, whatever the jobs asked for.
    one_at_a_time = _search(X, y, WEAK, memory_budget=final, jobs=4, budget=1e-6)
    assert one_at_a_time.jobs == final // fold == 1
    assert _search(X, y, WEAK, memory_budget=3 * fold, jobs=4, budget=1e-6).jobs == 3
    assert _search(X, y, WEAK, memory_budget=4 * final, jobs=4, budget=1e-6).jobs == 4


def test_its_budget_stops_it_and_keeps_the_choice():
    X, y = _breast_cancer()
    result = _search(X, y, WEAK, budget=1e-6)
    assert result.params is None
    assert result.stopped.startswith("budget of")
    assert result.stages[0]["cut"]
