"""The memory budget for the training features (training/selection/memory.py, issue 34 item 2):
its arithmetic against hand-computed numbers, the available memory against psutil's reading,
``fit --memory-budget`` through the real command line, and a selection whose budget bounds the
basis it grows for the whole split."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import psutil
import pytest
from sklearn.datasets import load_digits

from training import BasisExpandingSVC, ForwardSelectionCV
from training.cli.main import main
from training.selection.grown_basis import GrownBasis, grown_basis_per_class, split_basis
from training.selection.memory import (
    MEMORY_SHARE,
    available_memory_bytes,
    basis_items,
    basis_per_class_holding,
    basis_per_class_within,
    cgroup_headroom_bytes,
    default_allowance,
    default_memory_budget,
    describe_bytes,
    feature_bytes,
    features_within,
    parse_bytes,
    square_matrices,
)
from training.selection.space import (
    DENSE_RULES,
    DOCUMENT_RULES,
    held_square_matrices,
)

GIB = 2**30


def test_feature_bytes_count_the_features_and_three_square_matrices():
    # 1,000 items x 100 features, and three 100 x 100 matrices, of 8 bytes.
    assert feature_bytes(1000, 100) == 8 * (100_000 + 30_000) == 1_040_000
    assert feature_bytes(60_000, 8_000) == 8 * (480_000_000 + 192_000_000)


def test_only_nystroem_holds_three_square_matrices():
    assert square_matrices("nystroem(square)") == square_matrices("nystroem(clip)") == 3
    # The others keep the basis Gram matrix alone (the eigenvalue report reads it).
    assert square_matrices("besvm") == square_matrices("zscore") == square_matrices("none") == 1
    # 1,000 items x 100 features and one 100 x 100 matrix, of 8 bytes.
    assert feature_bytes(1000, 100, squares=1) == 8 * (100_000 + 10_000)
    # F^2 + 1,000 F <= 110,000 at F = 100, not at 101 (111,201).
    assert features_within(1000, 880_000, squares=1) == 100
    assert features_within(1000, 879_999, squares=1) == 99
    assert features_within(1000, 8 * 1000 * 50, squares=0) == 50
    with pytest.raises(ValueError, match="at least one item"):
        features_within(0, 10**9, squares=0)  # every count of features would fit


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"similarity": "rbf(gamma=1)"}, 3),  # auto: kernels take nystroem(square)
        ({"similarity": "rbf(gamma=1) + linear", "normalization": "auto"}, 3),
        ({"similarity": "rbf(gamma=1)", "normalization": "besvm"}, 1),
        ({"similarity": "rigid(1)", "normalization": "auto"}, 1),  # indefinite: besvm
        ({"similarity": "linear", "normalization": "nystroem(clip)"}, 3),
        ({"similarity": "linear", "normalization": "zscore"}, 1),
    ],
)
def test_a_configuration_holds_its_normalisations_square_matrices(params, expected):
    assert held_square_matrices(params) == expected


def test_a_besvm_basis_grows_past_nystroems_within_one_budget():
    # Documents (besvm): 60,000 items with 3e9 bytes hold F^2 + 60,000 F <= 3.75e8, F = 5,707
    # (5,708 would need 375,061,264), where nystroem's three squares hold 5,000 (below).
    besvm = DOCUMENT_RULES.grown_feature_limits(60_000, 3 * 10**9, 1)
    assert besvm == {"the memory budget": 5707}
    assert DOCUMENT_RULES.grown_feature_limits(60_000, 3 * 10**9, 3) == {"the memory budget": 5000}


@pytest.mark.parametrize(
    ("n_items", "budget", "expected"),
    [
        (1000, 1_040_000, 100),  # exactly 100 features' bytes
        (1000, 1_039_999, 99),  # a byte short of them
        (1000, 8 * (1000 * 99 + 3 * 99**2), 99),
        (10**6, 8 * 10**6 * 1000 + 8 * 3 * 1000**2, 1000),
        (1000, 7, 0),  # not one feature
    ],
)
def test_features_within_is_the_largest_count_that_fits(n_items, budget, expected):
    assert features_within(n_items, budget) == expected


@pytest.mark.parametrize(
    ("n_train", "n_classes", "weight", "budget"),
    [(1797, 10, 1.0, GIB // 64), (60_000, 10, 1.0, 4 * GIB), (5000, 2, 9.0, 25 * 10**6)],
)
def test_the_basis_within_a_budget_is_the_largest_that_fits(n_train, n_classes, weight, budget):
    class_size = n_train // n_classes
    per_class = basis_per_class_within([class_size] * n_classes, weight, budget)
    n_train = class_size * n_classes

    def needed(per_class):
        features = per_class * n_classes * weight
        return 8 * (n_train * features + 3 * features**2)

    assert per_class < class_size  # not every item: the budget decides
    assert needed(per_class) <= budget
    assert needed(per_class + 1) > budget


def test_the_basis_within_a_budget_by_hand():
    # 1,000 items, 10 classes: 100 features fit 1,040,000 bytes: 10 a class of an rbf, 5 of a
    # pair of measures, and never less than 1.
    balanced = [100] * 10
    assert basis_per_class_within(balanced, 1.0, 1_040_000) == 10
    assert basis_per_class_within(balanced, 2.0, 1_040_000) == 5
    assert basis_per_class_within(balanced, 1.0, 100) == 1


@pytest.mark.parametrize("weight", [1.0, 2.0, 9.0])
@pytest.mark.parametrize("budget", [10**5, 4 * 10**6, 3 * 10**7, 10**9])
def test_unbalanced_classes_hold_the_basis_their_items_give(weight, budget):
    """A class smaller than the basis per class gives every item it has, not that many: the
    largest basis per class is the largest whose real basis fits (by brute force over every
    size). Fortunes (32 classes of 77 to 938 quotes) was held at 707 a class where its every
    quote fitted: the bound counted 32 x 707 = 22,624 basis items, and 707 a class are 10,368."""
    counts = np.array([938, 527, 300, 120, 77, 20, 5])
    n_items = int(counts.sum())

    def fits(per_class):
        features = np.minimum(per_class, counts).sum() * weight
        return 8 * (n_items * features + 3 * features**2) <= budget

    expected = max([1, *(k for k in range(1, counts.max() + 1) if fits(k))])
    assert basis_per_class_within(counts, weight, budget) == expected
    if budget == 3 * 10**7 and weight == 1.0:  # between the counts, not above the largest
        assert 77 < expected < counts.max()
        # counted as if every class gave that many, the bound was smaller
        assert features_within(n_items, budget) // (len(counts) * weight) < expected


def test_a_basis_per_class_holds_each_class_up_to_its_count():
    assert basis_items(20, [10, 20, 30, 40]) == 70  # 10 + 20 + 20 + 20
    assert basis_items(19, [10, 20, 30, 40]) == 67
    assert basis_items(1000, [10, 20, 30, 40]) == 100  # every item
    assert basis_items(1, np.array([[3], [5]])) == 2
    # the holding size is the largest k whose items fit
    for items in range(1, 101):
        k = basis_per_class_holding(items, [10, 20, 30, 40])
        assert basis_items(k, [10, 20, 30, 40]) <= max(items, 4)
        assert k == 40 or basis_items(k + 1, [10, 20, 30, 40]) > items


def test_the_basis_per_class_a_count_of_items_holds():
    assert basis_per_class_holding(70, [10, 20, 30, 40]) == 20  # 10 + 20 + 20 + 20
    assert basis_per_class_holding(69, [10, 20, 30, 40]) == 19  # 10 + 19 x 3 = 67
    assert basis_per_class_holding(100, [10, 20, 30, 40]) == 40  # every item
    assert basis_per_class_holding(10**6, [10, 20, 30, 40]) == 40
    assert basis_per_class_holding(0.5, [10, 20]) == 1  # never below one
    # Where k reaches a class's count, that class is whole and the others may give more.
    assert basis_per_class_holding(5, [1, 1, 4]) == 3
    assert basis_per_class_holding(20, [1] * 10 + [100]) == 10
    assert basis_per_class_holding(2495, [77] * 31 + [938]) == 108
    with pytest.raises(ValueError, match="finite"):
        basis_per_class_holding(float("nan"), [10])


def test_available_memory_is_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000 kB\nMemFree:  1024 kB\nMemAvailable:  2048 kB\n")
    assert available_memory_bytes(meminfo) == 2048 * 1024
    # Without MemAvailable, the platform's free pages.
    meminfo.write_text("MemTotal:  8000 kB\n")
    assert available_memory_bytes(meminfo) == pytest.approx(
        psutil.virtual_memory().free, abs=GIB // 2
    )
    # This machine's, as psutil reads it (memory moves between the two readings).
    assert available_memory_bytes() == pytest.approx(psutil.virtual_memory().available, abs=GIB)
    assert default_memory_budget(8 * GIB) == MEMORY_SHARE * 8 * GIB


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * GIB),
        ("500MiB", 500 * 2**20),
        ("8GB", 8 * 10**9),
        ("8g", 8 * GIB),
        (" 1.5 gib ", 3 * GIB // 2),
        ("4000000000", 4_000_000_000),
        ("64KiB", 65_536),
    ],
)
def test_sizes_parse(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "8 parsecs", "-1GiB", "0", "", "GiB", "1e9"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match=r"not a size|at least one byte"):
        parse_bytes(text)


def test_describe_bytes():
    assert describe_bytes(8 * GIB) == "8.0 GiB"
    assert describe_bytes(1536 * 2**20) == "1.5 GiB"
    assert describe_bytes(100) == "100 B"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots", "argument --memory-budget: 'lots' is not a size"),
        ("0", "argument --memory-budget: '0': a memory budget must be at least one byte"),
        ("-5MiB", "argument --memory-budget: '-5MiB' is not a size"),
    ],
)
def test_fit_refuses_a_bad_memory_budget(text, message, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "fit",
            f"--memory-budget={text}",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "e.g. 8GiB" in result.stderr or "at least one byte" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_fit_help_says_what_the_default_budget_allows():
    result = subprocess.run(
        [sys.executable, "-m", "training", "fit", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    text = " ".join(result.stdout.split())
    found = re.search(
        r"25% of the memory available at the start: on this machine now ([\d.]+) GiB, which holds "
        r"([\d,]+) basis items a class at 10,000 training items( \(every item\))?, "
        r"([\d,]+) at 100,000( \(every item\))?, ([\d,]+) at 1,000,000( \(every item\))? "
        r"\(10 classes, an rbf under nystroem; more under besvm\)",
        text,
    )
    assert found, text
    # The figures are the module's for the budget shown (rounded to a tenth of a GiB).
    budget = float(found.group(1)) * GIB
    groups = found.groups()[1:]
    for n_items, shown, every in zip((10**4, 10**5, 10**6), groups[::2], groups[1::2], strict=True):
        # F features of n items take 8 (n F + 3 F^2) bytes: F within the budget, by hand
        features = (-n_items + math.sqrt(n_items**2 + 12 * budget / 8)) / 6
        per_class = min(features / 10, n_items / 10)  # no more than every item of a class
        assert int(shown.replace(",", "")) == pytest.approx(per_class, rel=0.05)
        assert (every is not None) == (int(shown.replace(",", "")) == n_items // 10)
    assert default_allowance(budget_bytes=8 * GIB).startswith("8.0 GiB, which holds ")


TEN_OF_6000 = [6000] * 10


def test_the_grown_basis_is_bounded_by_the_budget_and_the_share():
    # Folds chose 25 a class of 2,000 items; the split has 60,000 (10 classes of 6,000): in
    # proportion 750 a class. A fifth of the items is 12,000 features (1,200 a class).
    assert DENSE_RULES.grown_feature_limits(60_000, 64 * GIB, 3)["the share of the items"] == 12_000
    roomy = grown_basis_per_class(
        25, 2000, TEN_OF_6000, 1.0, DENSE_RULES.grown_feature_limits(60_000, 64 * GIB, 3)
    )
    assert roomy == GrownBasis(750, "in proportion to the items")
    # 5,000 features of 60,000 items take 8 * (3e8 + 7.5e7) = 3e9 bytes: 500 a class.
    tight = grown_basis_per_class(
        25, 2000, TEN_OF_6000, 1.0, DENSE_RULES.grown_feature_limits(60_000, 3 * 10**9, 3)
    )
    assert tight == GrownBasis(500, "the memory budget")
    # Documents grow in proportion past the folds' cap (MAX_DOCUMENT_FEATURES), with no share
    # of the items to keep to: only the budget bounds them.
    limits = DOCUMENT_RULES.grown_feature_limits(60_000, 64 * GIB, 1)
    assert set(limits) == {"the memory budget"}
    documents = grown_basis_per_class(100, 2000, TEN_OF_6000, 1.0, limits)
    assert documents == GrownBasis(3000, "in proportion to the items")  # 30,000 features
    small = DOCUMENT_RULES.grown_feature_limits(60_000, 3 * 10**9, 1)
    assert grown_basis_per_class(25, 2000, TEN_OF_6000, 1.0, small).bound == ("the memory budget")
    # A budget bounds the final fit even below the size the folds chose (250 a class): 2,000
    # features of 60,000 items (8 * (1.2e8 + 1.2e7) bytes) hold 200 a class of 10 classes.
    below = DENSE_RULES.grown_feature_limits(60_000, 8 * (60_000 * 2000 + 3 * 2000**2), 3)
    assert grown_basis_per_class(250, 2000, TEN_OF_6000, 1.0, below) == GrownBasis(
        200, "the memory budget"
    )


def test_the_splits_basis_grows_on_a_sample_and_keeps_the_folds_otherwise():
    chosen = {"similarity": "rbf(gamma=1)", "basis_per_class": 25}
    roomy = {"rules": DENSE_RULES, "memory_budget": 64 * GIB, "weight": 1.0, "squares": 3}
    ten_of_6000 = {"fold_largest": 200, "fold_items": 2000, "class_counts": TEN_OF_6000}
    # selected on a sample of the split: grown in proportion (25 of 2,000 to 60,000 items)
    grown, bound = split_basis(chosen, n_items=3000, **ten_of_6000, **roomy)
    assert (grown["basis_per_class"], bound) == (750, "in proportion to the items")
    assert chosen["basis_per_class"] == 25  # a copy
    # selected on every item: the folds' size, nothing bounding it
    assert split_basis(chosen, n_items=60_000, **ten_of_6000, **roomy) == (chosen, None)
    # the folds chose every item of theirs: every item of each class, within the feature cap
    # (1,000 features hold 30 a class of ten classes of 30)
    small = {"fold_largest": 20, "fold_items": 200, "class_counts": [30] * 10}
    every, bound = split_basis({**chosen, "basis_per_class": 20}, n_items=300, **small, **roomy)
    assert (every["basis_per_class"], bound) == (30, None)
    # a memory budget below the folds' size bounds it: 2,000 features of 60,000 items
    tight = {**roomy, "memory_budget": 8 * (60_000 * 2000 + 3 * 2000**2)}
    bounded = {**chosen, "basis_per_class": 250}
    within, bound = split_basis(bounded, n_items=60_000, **ten_of_6000, **tight)
    assert (within["basis_per_class"], bound) == (200, "the memory budget")


def _digits_selection(memory_budget):
    X, y = load_digits(return_X_y=True)
    selection = ForwardSelectionCV(
        BasisExpandingSVC(n_jobs=1),
        budget=4.0,
        n_jobs=1,
        max_items=400,
        refit=False,
        memory_budget=memory_budget,
    )
    return selection.fit(X.astype(np.float64), y.astype(str))


@pytest.mark.slow
def test_a_tiny_budget_grows_a_smaller_basis_and_the_record_names_it():
    # 3 bases a class of digits' 1,797 items: 8 * (1,797 * 30 + 3 * 30^2) bytes.
    tiny = 8 * (1797 * 30 + 3 * 30**2)
    small = _digits_selection(tiny)
    large = _digits_selection(4 * GIB)
    assert small.best_params_["basis_per_class"] <= 3
    assert large.best_params_["basis_per_class"] > small.best_params_["basis_per_class"]
    record = json.loads(json.dumps(small.record()))  # plain JSON, for the manifest
    assert record["memory_budget"]["bytes"] == tiny
    assert record["memory_budget"]["rule"] == "given"
    ladder = record["basis_ladder"]
    assert ladder["memory_bound_per_class"] == 3
    assert all(rung["basis_per_class"] <= 3 for rung in ladder["path"])
    # The budget bounds the grown basis even below the size the folds chose.
    assert record["memory_budget"]["grown_basis_bound"] == "the memory budget"
    assert f"bounded by the memory budget of {describe_bytes(tiny)}" in small.describe()
    assert large.record()["memory_budget"]["bytes"] == 4 * GIB


def test_the_default_budget_is_a_share_of_what_is_available(capsys, tmp_path):
    X, y = load_digits(return_X_y=True)
    selection = ForwardSelectionCV(
        BasisExpandingSVC(n_jobs=1), budget=0.5, n_jobs=1, repeats=1, refit=False
    ).fit(X[:300].astype(np.float64), y[:300].astype(str))
    recorded = selection.record()["memory_budget"]
    assert recorded["rule"] == "25% of the memory available at the start"  # MEMORY_SHARE
    assert recorded["bytes"] == pytest.approx(
        MEMORY_SHARE * psutil.virtual_memory().available, rel=0.2
    )
    # Every item was cross-validated: nothing grew.
    assert recorded["grown_basis_bound"] is None


@pytest.mark.slow
def test_fit_records_the_memory_budget_given(tmp_path, capsys):
    out = tmp_path / "m"
    args = ["fit", "--out", str(out), "--budget", "2", "--memory-budget", "500MiB", "--quiet"]
    assert main(args) == 0
    selection = json.loads((out / "manifest.json").read_text())["training"]["selection"]
    assert selection["memory_budget"]["bytes"] == 500 * 2**20
    assert selection["memory_budget"]["rule"] == "given"


def test_a_containers_memory_limit_bounds_what_is_available(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  64000000 kB\nMemAvailable:  60000000 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{4 * GIB}\n")
    (v2 / "memory.current").write_text(f"{GIB}\n")
    # compose's mem_limit of 4g, 1 GiB of it in use: 3 GiB, not the host's 57
    assert cgroup_headroom_bytes(v2) == 3 * GIB
    assert available_memory_bytes(meminfo, v2) == 3 * GIB
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_headroom_bytes(v2) is None
    assert available_memory_bytes(meminfo, v2) == 60000000 * 1024
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{3 * GIB}\n")
    assert available_memory_bytes(meminfo, v1) == 0  # over its limit already
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
    assert cgroup_headroom_bytes(v1) is None
    assert cgroup_headroom_bytes(tmp_path / "absent") is None
