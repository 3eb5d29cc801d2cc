"""The large-basis search (issue 34 item 5): the configurations it offers
(training/selection/space.py), its search at the top of the basis ladder on the whole split
(training/selection/basis_ladder.py) and its stage on the folds of a small set
(training/selection/stages.py)."""

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_wine
from sklearn.model_selection import train_test_split

from service.model.inputs.dense import GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION
from service.model.similarity import parse_specs
from training import BasisExpandingSVC, ForwardSelectionCV
from training.selection import basis_ladder
from training.selection import stages as stages_module
from training.selection.basis_ladder import climb_basis_ladder, describe_large_basis
from training.selection.budget import SelectionBudget
from training.selection.folds import FOLD_MAX_ITER
from training.selection.holdout import HoldOut
from training.selection.space import (
    DENSE_RULES,
    DOCUMENT_RULES,
    LARGE_BASIS_C,
    LARGE_BASIS_NORMALIZATIONS,
    RBF_SCALE,
    Candidate,
    large_basis_candidates,
    neighbour_candidates,
)

GENEROUS = 600.0

PARAMS = {
    "similarity": "rbf(gamma=1)",
    "input_transform": None,
    "input_normalization": GLOBAL_NORMALIZATION,
    "basis_per_class": 25,
    "basis_strategy": "index",
    "normalization": "auto",
    "C": 1.0,
}


def test_the_large_basis_is_offered_at_every_coarse_width_input_normalisation_and_large_C():
    candidates = large_basis_candidates(PARAMS, DENSE_RULES, 400)
    params = [c.params for c in candidates]
    assert len(params) == len(RBF_SCALE.coarse) * 2 * len(LARGE_BASIS_C)
    assert {p["similarity"] for p in params} == {RBF_SCALE.measure(g) for g in RBF_SCALE.coarse}
    assert {p["input_normalization"] for p in params} == {
        GLOBAL_NORMALIZATION,
        PER_FEATURE_NORMALIZATION,
    }
    assert {p["C"] for p in params} == set(LARGE_BASIS_C)
    assert all(p["normalization"] == "besvm" and p["basis_per_class"] == 400 for p in params)
    assert len({json.dumps(p, sort_keys=True) for p in params}) == len(params)
    # The most promising first: one coarse step narrower, the chosen input normalisation, the
    # larger C; then the same width under the other input normalisation.
    assert params[0] == {
        **PARAMS,
        "similarity": "rbf(gamma=4)",
        "normalization": "besvm",
        "basis_per_class": 400,
        "C": 100.0,
    }
    assert params[1]["C"] == 10.0
    assert params[2]["input_normalization"] == PER_FEATURE_NORMALIZATION
    # the widest and the narrowest, four and two coarse steps from gamma = 4, come last
    assert {p["similarity"] for p in params[-4:]} == {"rbf(gamma=0.0625)"}


def test_a_small_sets_large_basis_is_offered_under_the_kernels_own_map_first_for_kernels():
    besvm = large_basis_candidates(PARAMS, DENSE_RULES, 50)
    both = large_basis_candidates(PARAMS, DENSE_RULES, 50, LARGE_BASIS_NORMALIZATIONS)
    assert LARGE_BASIS_NORMALIZATIONS == ("nystroem(clip)", "besvm")
    assert len(both) == 2 * len(besvm)
    # the same candidates under each, in the same order, the kernel's own map first
    clip = [c.params for c in both if c.params["normalization"] == "nystroem(clip)"]
    assert [c.params for c in both if c.params["normalization"] == "besvm"] == [
        c.params for c in besvm
    ]
    assert clip == [{**c.params, "normalization": "nystroem(clip)"} for c in besvm]
    assert both[0].params == clip[0]
    assert both[1].params == besvm[0].params
    # an indefinite measure: besvm alone, offered once (auto is besvm there)
    rigid = {**PARAMS, "similarity": "rbf(gamma=1) + rigid(1)"}
    offered = large_basis_candidates(rigid, DENSE_RULES, 50, (*LARGE_BASIS_NORMALIZATIONS, "auto"))
    assert {c.params["normalization"] for c in offered} == {"besvm"}
    assert len(offered) == len(besvm)
    # kernels: auto (nystroem(square) there) is a third normalisation
    three = large_basis_candidates(PARAMS, DENSE_RULES, 50, (*LARGE_BASIS_NORMALIZATIONS, "auto"))
    assert [c.params["normalization"] for c in three[:3]] == ["nystroem(clip)", "besvm", "auto"]


def test_the_kernels_own_map_at_every_item_is_the_kernel_svm():
    """nystroem(clip) with every training item as the basis: the linear SVM on K^(-1/2) k(x)
    is the kernel SVM (squared hinge, regularised bias), computed here by scikit-learn's
    LinearSVC on the kernel's square root."""
    from scipy.spatial.distance import cdist
    from sklearn.svm import LinearSVC

    X, y = load_wine(return_X_y=True)
    X_train, X_test, y_train, _ = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    gamma, C = 0.5, 10.0
    model = BasisExpandingSVC(
        similarity=f"rbf(gamma={gamma})",
        input_normalization=PER_FEATURE_NORMALIZATION,
        normalization="nystroem(clip)",
        basis_per_class=len(y_train),
        C=C,
        n_jobs=1,
    ).fit(X_train, y_train)
    assert model.expansion_.basis_.shape[0] == len(y_train)

    # the per-feature input normalisation by hand: z-scores over their mean norm
    mean, std = X_train.mean(axis=0), X_train.std(axis=0)
    z = (X_train - mean) / std
    norm = np.linalg.norm(z, axis=1).mean()
    train, test = z / norm, (X_test - mean) / std / norm
    K = np.exp(-gamma * cdist(train, train, "sqeuclidean"))
    eigenvalues, vectors = np.linalg.eigh(K)
    keep = eigenvalues > 1e-10 * eigenvalues.max()
    inverse_root = (vectors[:, keep] / np.sqrt(eigenvalues[keep])) @ vectors[:, keep].T
    reference = LinearSVC(C=C, loss="squared_hinge", tol=1e-12, max_iter=200_000)
    reference.fit(K @ inverse_root, y_train)
    expected = reference.decision_function(
        np.exp(-gamma * cdist(test, train, "sqeuclidean")) @ inverse_root
    )
    np.testing.assert_allclose(model.decision_function(X_test), expected, atol=2e-3)


def test_a_measure_without_a_width_is_offered_the_kernel_and_documents_other_measures():
    linear = large_basis_candidates({**PARAMS, "similarity": "linear"}, DENSE_RULES, 50)
    assert {c.params["similarity"] for c in linear} == {
        RBF_SCALE.measure(g) for g in RBF_SCALE.coarse
    }
    both = large_basis_candidates(PARAMS, DENSE_RULES, 50, ("besvm", "auto"))
    assert len(both) == 2 * len(linear)
    # a second measure keeps its place; only the first scaled one moves
    joined_params = {**PARAMS, "similarity": "rbf(gamma=1) + linear"}
    joined = large_basis_candidates(joined_params, DENSE_RULES, 9)
    assert {c.params["similarity"] for c in joined} == {
        f"{RBF_SCALE.measure(g)} + linear" for g in RBF_SCALE.coarse
    }
    # asked for (the ladder's search), the scaled measure alone too, before the joined ones at
    # each width
    joined = large_basis_candidates(joined_params, DENSE_RULES, 9, alone=True)
    assert {c.params["similarity"] for c in joined} == {
        f"{RBF_SCALE.measure(g)}{extra}" for g in RBF_SCALE.coarse for extra in ("", " + linear")
    }
    assert len(joined) == 2 * len(linear)
    assert [c.params["similarity"] for c in joined[:2]] == ["rbf(gamma=4)", "rbf(gamma=4) + linear"]
    assert [(c.params["C"], c.params["input_normalization"]) for c in joined[:2]] == [
        (100.0, GLOBAL_NORMALIZATION)
    ] * 2
    # documents: the other document measures alone, at the size asked (document_measures_at)
    documents = {**PARAMS, "similarity": "sensing1(n=150)", "normalization": "besvm"}
    offered = large_basis_candidates(documents, DOCUMENT_RULES, 50)
    assert [c.params["similarity"] for c in offered][:2] == ["linear", "sensing1(n=50)"]
    assert {c.params["basis_per_class"] for c in offered} == {50}
    assert "sensing1(n=150)" not in {c.params["similarity"] for c in offered}
    # word counts (bof) are never input-normalised
    bof = large_basis_candidates(
        {**PARAMS, "input_transform": "bof", "similarity": "sensing1(n=150)"}, DENSE_RULES, 50
    )
    assert {c.params["input_normalization"] for c in bof} == {GLOBAL_NORMALIZATION}


def test_the_neighbours_move_the_width_and_C_one_step_either_way():
    neighbours = [c.params for c in neighbour_candidates(PARAMS)]
    assert len(neighbours) == 8
    assert {(p["similarity"], p["C"]) for p in neighbours} == {
        (f"rbf(gamma={g:g})", C) for g in (0.5, 1.0, 2.0) for C in (0.3, 1.0, 3.0)
    } - {("rbf(gamma=1)", 1.0)}
    linear = [c.params for c in neighbour_candidates({**PARAMS, "similarity": "linear"})]
    assert [p["C"] for p in linear] == [0.3, 3.0]


def _digits():
    X, y = load_digits(return_X_y=True)
    return X.astype(np.float64), y.astype(str)


def _climb(X, y, params, start, *, budget, large_budget, min_gain_se=1.0, offered=None, **rule):
    """The ladder from ``start`` and the large-basis search after it (``offered``: the
    candidates at a size, by default all of :func:`large_basis_candidates`; ``rule``: the
    ladder's ``work`` and ``prefer``)."""
    offered = offered or (lambda per_class: large_basis_candidates(params, DENSE_RULES, per_class))
    if not isinstance(large_budget, SelectionBudget):
        large_budget = SelectionBudget(large_budget, 1)
    return climb_basis_ladder(
        BasisExpandingSVC(n_jobs=1),
        params,
        X,
        y,
        start=start,
        weight=1.0,
        min_gain_se=min_gain_se,
        budget=SelectionBudget(budget, 1),
        large_basis=offered,
        large_basis_budget=large_budget,
        **rule,
    )


@pytest.mark.slow
def test_the_large_basis_search_takes_a_configuration_that_gains_on_the_hold_out():
    X, y = _digits()
    # a poor start (two images a class, a C far too small) that the ladder has no time to grow;
    # prediction work grows with the basis, so a smaller basis as accurate is the cheaper choice
    params = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    result = _climb(
        X,
        y,
        params,
        2,
        budget=0.01,
        large_budget=GENEROUS,
        work=lambda p: float(p["basis_per_class"]),
        prefer="cost",
    )
    assert len(result.path) == 1
    record = result.record()["large_basis"]
    assert record["chosen"] == result.params
    assert result.params["normalization"] == "besvm"
    _check_the_shrink(X, y, result, record)
    taken = [entry for entry in record["candidates"] if entry["taken"]]
    assert taken
    first_rung = result.path[0]["held_out_accuracy"]
    assert taken[0]["held_out_accuracy"] > first_rung + taken[0]["standard_error"]
    assert taken[0]["gain"] == pytest.approx(taken[0]["held_out_accuracy"] - first_rung)
    # each candidate's held-out accuracy is that of the model fitted without the hold-out
    X_fit, X_held, y_fit, y_held = train_test_split(
        X, y, test_size=result.holdout_items, stratify=y, random_state=0
    )
    fit_largest = int(np.unique(y_fit, return_counts=True)[1].max())
    # (the second differs from the first in C alone, and is fitted on the first's expansion)
    offered = large_basis_candidates(params, DENSE_RULES, fit_largest)[:2]
    assert {k: v for k, v in offered[0].params.items() if k != "C"} == {
        k: v for k, v in offered[1].params.items() if k != "C"
    }
    for candidate, entry in zip(offered, record["candidates"][:2], strict=True):
        assert entry["change"] == candidate.change
        model = BasisExpandingSVC(n_jobs=1, **candidate.params)
        expected = float(np.mean(model.fit(X_fit, y_fit).predict(X_held) == y_held))
        assert entry["held_out_accuracy"] == pytest.approx(expected, abs=1e-12)
    assert json.loads(json.dumps(result.record())) == result.record()


def _check_the_shrink(X, y, result, record):
    """The configuration taken at the top (every item of the fit part's largest class), then
    halved while the smaller was at least as accurate on the hold-out, the first that was not
    ending it; the kept one's held-out accuracy is a model's fitted without the hold-out."""
    taken_in_search = [entry for entry in record["candidates"] if entry["taken"]]
    chosen = taken_in_search[-1]  # after the refinements
    X_fit, X_held, y_fit, y_held = train_test_split(
        X, y, test_size=result.holdout_items, stratify=y, random_state=0
    )
    top = int(np.unique(y_fit, return_counts=True)[1].max())  # the fit part's largest class
    assert taken_in_search[0]["change"].endswith(f"{top} bases per class")
    shrink = record["shrink"]
    assert shrink, "a configuration taken at the top, with time left: a halving is tried"
    assert [entry["basis_per_class"] for entry in shrink] == [
        top // 2**k for k in range(1, len(shrink) + 1)
    ]
    assert all(entry["taken"] for entry in shrink[:-1])
    if not shrink[-1]["taken"]:
        assert record["shrink_stopped"] == "the larger kept by the selection's rule"
    kept = chosen["held_out_accuracy"]
    for entry in shrink:
        assert entry["taken"] == (entry["held_out_accuracy"] >= kept)
        if entry["taken"]:
            kept = entry["held_out_accuracy"]
    taken = [entry for entry in shrink if entry["taken"]]
    if taken:
        assert not result.every_item
        assert result.basis_per_class == result.params["basis_per_class"]
        assert result.basis_per_class == taken[-1]["basis_per_class"]
    else:
        # every item of the fit part's largest class: the final fit takes the split's
        assert result.params["basis_per_class"] == top
        assert result.every_item
        assert result.basis_per_class == int(np.unique(y, return_counts=True)[1].max())
    model = BasisExpandingSVC(n_jobs=1, **result.params).fit(X_fit, y_fit)
    assert float(np.mean(model.predict(X_held) == y_held)) == pytest.approx(kept, abs=1e-12)


@pytest.mark.slow
def test_the_large_basis_search_keeps_within_its_time_budget():
    X, y = _digits()
    params = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    result = _climb(X, y, params, 2, budget=0.01, large_budget=1e-6)
    assert result.params is None
    assert result.record()["large_basis"]["stopped"] == "no larger basis fits its time budget"
    assert result.basis_per_class == 2
    # without the search, no record of it
    plain = climb_basis_ladder(
        BasisExpandingSVC(n_jobs=1),
        params,
        X,
        y,
        start=2,
        weight=1.0,
        min_gain_se=1.0,
        budget=SelectionBudget(0.01, 1),
    )
    assert "large_basis" not in plain.record()


@pytest.mark.slow
def test_a_small_set_searches_the_large_basis_on_its_folds(monkeypatch):
    offered = []  # the candidates the stage scores, as large_basis_candidates made them

    def recorded(*args, **kwargs):
        candidates = large_basis_candidates(*args, **kwargs)
        offered.extend(candidates)
        return candidates

    monkeypatch.setattr(stages_module, "large_basis_candidates", recorded)
    X, y = load_wine(return_X_y=True)
    selection = ForwardSelectionCV(
        BasisExpandingSVC(n_jobs=1), budget=GENEROUS, n_jobs=1, repeats=1, refit=False
    ).fit(X, y.astype(str))
    stages = [stage for stage in selection.stages_ if stage["stage"] == "large basis"]
    assert len(stages) == 1
    # two normalisations x five widths x two input normalisations x two C
    # (wine's search ends at linear, which has no width: no candidate is the current one)
    assert selection.path_[-1]["similarity"] == "linear" or stages[0]["taken"]
    assert stages[0]["candidates"] == 40
    assert stages[0]["scored"] + stages[0]["raced_out"] == stages[0]["candidates"]
    assert selection.ladder_ is None
    # under the kernel's own map and the paper's normalisation, not auto's nystroem(square)
    assert {c.params["normalization"] for c in offered} == set(LARGE_BASIS_NORMALIZATIONS)


def test_the_folds_of_the_fit_part_score_every_item_once_with_the_hold_out():
    X, y = _digits()
    holdout = HoldOut(X, y, 0)
    folds = holdout.folds_of_the_fit_part()
    assert len(folds) == 4  # a fifth held out, the rest in four parts of the same size
    held = np.concatenate([holdout.held, *[part for _, part in folds]])
    assert np.array_equal(np.sort(held), np.arange(len(y)))
    for fit, part in folds:
        assert np.array_equal(np.sort(np.concatenate([fit, part])), np.arange(len(y)))
        assert abs(len(part) - len(holdout.held)) <= 10
        # stratified: each class's share of the part within an item of its share of the split
        for label in np.unique(y):
            share = np.mean(y == label) * len(part)
            assert abs(np.sum(y[part] == label) - share) <= 1.5


@pytest.mark.slow
def test_a_gain_within_the_hold_outs_noise_is_tested_on_every_item():
    X, y = _digits()
    params = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    # No gain passes a rule of a thousand standard errors: the best candidate of the hold-out
    # is fitted again on the rest of the split, beside the ladder's choice, and not taken.
    result = _climb(
        X,
        y,
        params,
        2,
        budget=0.01,
        large_budget=GENEROUS,
        min_gain_se=1000.0,
        offered=lambda per_class: large_basis_candidates(params, DENSE_RULES, per_class)[:2],
    )
    confirmation = result.record()["large_basis"]["confirmation"]
    assert result.params is None
    assert confirmation["items"] == len(y)
    assert not confirmation["taken"]
    scored = result.record()["large_basis"]["candidates"]
    best = max(scored, key=lambda entry: entry["held_out_accuracy"])
    assert confirmation["change"] == best["change"]
    # over every item the gain is measured with about half the hold-out's standard error
    assert confirmation["gain"] > 0
    assert confirmation["standard_error"] < 0.7 * best["standard_error"]


def test_a_width_that_another_measure_has_already_is_not_offered():
    # Two rbf measures: moving the first onto the second's width would name one measure twice,
    # which no model may hold (the fit refuses it; found by a selection on a sample).
    two = {**PARAMS, "similarity": "rbf(gamma=0.25) + rbf(gamma=1)"}
    for candidates in (
        large_basis_candidates(two, DENSE_RULES, 50),
        neighbour_candidates({**two, "similarity": "rbf(gamma=0.5) + rbf(gamma=1)"}),
    ):
        for candidate in candidates:
            specs = parse_specs(candidate.params["similarity"])
            assert len({spec.measure_name for spec in specs}) == len(specs)
    offered = {
        c.params["similarity"] for c in large_basis_candidates(two, DENSE_RULES, 50, alone=True)
    }
    assert "rbf(gamma=1) + rbf(gamma=1)" not in offered
    # every coarse width alone, and joined at every width but the second measure's
    assert offered == {RBF_SCALE.measure(g) for g in RBF_SCALE.coarse} | {
        f"{RBF_SCALE.measure(g)} + rbf(gamma=1)" for g in RBF_SCALE.coarse if g != 1
    }
    BasisExpandingSVC(n_jobs=1, **{**two, "basis_per_class": 5}).fit(*_digits())


@pytest.mark.slow
def test_a_running_search_stops_when_its_time_budget_is_spent():
    X, y = _digits()
    params = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    budget = SelectionBudget(3.0, 1)
    result = _climb(X, y, params, 2, budget=0.01, large_budget=budget)
    scored = result.record()["large_basis"]["candidates"]
    assert result.large_basis_stopped == "time budget spent"
    assert 1 <= len(scored) < len(large_basis_candidates(params, DENSE_RULES, 10))
    # no fit starts that the budget's rest would not cover at the cost of the one before; the
    # first round keeps a share back for the confirmation
    assert budget.used_s <= budget.seconds + max(entry["seconds"] for entry in scored)


@pytest.mark.slow
def test_the_candidate_taken_is_marked_when_a_later_fit_is_cut_short():
    """A round that ends in a fit the budget cut short marks the candidate it took, not the
    one cut short (which followed it in the record)."""
    X, y = _digits()
    poor = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    cheap = {**PARAMS, "C": 10.0, "basis_per_class": 10}
    # three measures' eigendecompositions at 1,430 basis items: seconds, past the budget
    costly = {
        **PARAMS,
        "similarity": "rbf(gamma=1) + rbf(gamma=4) + linear",
        "normalization": "nystroem(square)",
        "C": 1000.0,
        "basis_per_class": 143,
    }
    result = _climb(
        X,
        y,
        poor,
        2,
        budget=0.01,
        large_budget=1.0,
        offered=lambda _: [Candidate("cheap", cheap), Candidate("costly", costly)],
    )
    record = result.record()["large_basis"]["candidates"]
    assert [entry["change"] for entry in record] == ["cheap", "costly"]
    assert record[1].get("truncated")
    assert [entry["taken"] for entry in record] == [True, False]
    assert result.params["C"] == cheap["C"]


@pytest.mark.slow
def test_the_first_candidate_has_the_whole_budget_and_the_reserve_holds_after_it(monkeypatch):
    """The first round keeps a share of its budget back to confirm a gain within the hold-out's
    noise, from its second fit on: a first fit the reserve cut short would learn nothing and
    end the search. Here the reserve is the whole budget."""
    monkeypatch.setattr(basis_ladder, "CONFIRMATION_SHARE", 1.0)
    X, y = _digits()
    poor = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    cheap = {**PARAMS, "C": 10.0, "basis_per_class": 10}
    result = _climb(
        X,
        y,
        poor,
        2,
        budget=0.01,
        large_budget=GENEROUS,
        offered=lambda _: [Candidate("first", cheap), Candidate("second", {**cheap, "C": 1.0})],
    )
    record = result.record()["large_basis"]
    assert [entry["change"] for entry in record["candidates"]] == ["first"]
    assert not record["candidates"][0].get("truncated")
    assert record["candidates"][0]["taken"]
    assert record["stopped"] == "time budget spent"
    assert result.params["C"] == cheap["C"]


@pytest.mark.slow
def test_an_unconverged_candidate_is_never_taken_and_the_search_goes_on(monkeypatch):
    """A candidate whose solver reaches the search's Newton-step cap unconverged is recorded,
    not taken (its final fit would take as many steps), and the search scores the next one."""
    X, y = _digits()
    poor = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    cheap = {**PARAMS, "C": 10.0, "basis_per_class": 10}  # exact Newton: 10 steps here
    # a basis too wide for exact Newton, near-identity features at a large C: 220 steps here
    stalls = {
        **PARAMS,
        "similarity": "rbf(gamma=16)",
        "normalization": "besvm",
        "C": 100.0,
        "basis_per_class": 143,
    }
    monkeypatch.setattr(basis_ladder, "LARGE_BASIS_MAX_ITER", 20)
    result = _climb(
        X,
        y,
        poor,
        2,
        budget=GENEROUS,
        large_budget=GENEROUS,
        offered=lambda _: [Candidate("stalls", stalls), Candidate("cheap", cheap)],
    )
    record = result.record()["large_basis"]
    entries = record["candidates"]
    assert [entry["change"] for entry in entries[:2]] == ["stalls", "cheap"]
    assert entries[0].get("unconverged")
    assert not entries[0]["taken"]
    assert not entries[1].get("unconverged")
    assert entries[1]["taken"]
    assert result.params["C"] == cheap["C"]
    assert not any(entry.get("unconverged") and entry["taken"] for entry in entries)
    unconverged = sum(1 for entry in entries if entry.get("unconverged"))
    assert f"({unconverged} unconverged)" in describe_large_basis(record)


def test_a_fit_stopped_at_its_step_cap_before_its_tolerance_is_unconverged():
    X, y = _digits()
    holdout = HoldOut(X, y, 0)
    budget = SelectionBudget(GENEROUS, 1)
    params = {**PARAMS, "C": 10.0, "basis_per_class": 10}
    finished = holdout.score(BasisExpandingSVC(n_jobs=1), params, budget)
    steps = finished.model.n_iter_
    assert 2 < steps < FOLD_MAX_ITER
    assert not finished.unconverged
    capped = holdout.score(BasisExpandingSVC(n_jobs=1), params, budget, max_iter=2)
    assert capped.model.n_iter_ == 2
    assert capped.unconverged
    assert not capped.truncated
    # converged at its last allowed step: finished, not unconverged
    exact = holdout.score(BasisExpandingSVC(n_jobs=1), params, budget, max_iter=steps)
    assert exact.model.n_iter_ == steps
    assert not exact.unconverged


def test_the_hold_out_fits_a_configurations_other_C_on_its_kept_expansion():
    X, y = _digits()
    holdout = HoldOut(X, y, 0)
    budget = SelectionBudget(GENEROUS, 1)
    params = {**PARAMS, "C": 10.0, "basis_per_class": 10}
    estimator = BasisExpandingSVC(n_jobs=1)
    first = holdout.score(estimator, params, budget)
    assert first.expanded
    assert holdout.holds(estimator, {**params, "C": 1.0})
    assert not holdout.holds(estimator, {**params, "basis_per_class": 11})
    again = holdout.score(estimator, {**params, "C": 1.0}, budget)
    assert not again.expanded
    assert again.own_cost == pytest.approx(again.cost + holdout.expansion_cost)
    # the model of a fit of its own at that C, scored on the same hold-out
    fresh = BasisExpandingSVC(n_jobs=1, **{**params, "C": 1.0})
    fresh.fit(X[holdout.fit], y[holdout.fit])
    np.testing.assert_array_equal(
        again.correct[0], fresh.predict(X[holdout.held]) == y[holdout.held]
    )
    np.testing.assert_allclose(
        again.model.decision_function(X[:50]), fresh.decision_function(X[:50]), atol=1e-9
    )
    # another configuration, or other positions, expand again
    assert holdout.score(estimator, {**params, "similarity": "rbf(gamma=4)"}, budget).expanded
    assert holdout.score(estimator, params, budget, holdout.fit[:-1], holdout.held).expanded


@pytest.mark.slow
def test_a_pair_of_normalisations_far_behind_is_not_tried_at_the_other_widths():
    X, y = _digits()
    # One pixel a thousand times the others: under global input normalisation it is all an
    # rbf sees; per feature, it is one of 64.
    X[:, 20] *= 1000.0
    params = {**PARAMS, "C": 0.01, "basis_per_class": 2}
    result = _climb(X, y, params, 2, budget=0.01, large_budget=GENEROUS)
    scored = result.record()["large_basis"]["candidates"]
    first_round = scored[: len(scored) - sum(1 for e in scored if e["taken"]) + 1]
    global_inputs = [e for e in first_round if ", global," in e["change"]]
    per_feature = [e for e in first_round if ", per-feature," in e["change"]]
    assert len(global_inputs) == 2  # the first width's two C, then dropped
    assert len(per_feature) > 2
    assert max(e["held_out_accuracy"] for e in global_inputs) < min(
        e["held_out_accuracy"] for e in per_feature[:2]
    )


def test_more_hold_outs_leave_a_class_too_small_to_split_in_every_fit_part():
    X, y = _digits()
    keep = np.concatenate([np.flatnonzero(~np.isin(y, ["8", "9"])), np.flatnonzero(y == "8")[:3]])
    keep = np.concatenate([keep, np.flatnonzero(y == "9")[:1]])
    X, y = X[keep], y[keep]
    holdout = HoldOut(X, y, 0)
    folds = holdout.folds_of_the_fit_part()
    assert len(folds) == 4
    tiny = np.flatnonzero(np.isin(y, ["8", "9"]))
    for fit, part in folds:
        assert np.isin(tiny, fit).all()  # always fitted on
        assert not np.isin(tiny, part).any()
    held = np.concatenate([holdout.held, *[part for _, part in folds]])
    assert len(held) == len(np.unique(held))
    assert np.array_equal(np.sort(np.union1d(held, tiny)), np.arange(len(y)))
