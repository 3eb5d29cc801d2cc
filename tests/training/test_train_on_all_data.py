"""Training on every item (--test-fraction 0), a separate test set (--test-data) and evaluate on a
whole data set (evaluate --data FILE --test-fraction 0), through the command line."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits

from service.model import Predictor
from training.cli.main import main
from training.data.datasets import load_dataset
from training.estimator.newton_cg import TOLERANCE, liblinear_tolerance
from training.estimator.solver import problem_signs
from training.estimator.squared_hinge import InMemorySquaredHinge


def _blobs(n_per_class: int, seed: int, dim: int = 6):
    rng = np.random.default_rng(0)  # the same centres for every file
    centres = rng.normal(size=(3, dim)) * 4
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1, 2], n_per_class)
    return centres[y] + rng.normal(size=(len(y), dim)), y


@pytest.fixture
def train_npz(tmp_path):
    X, y = _blobs(30, 1)
    path = tmp_path / "train.npz"
    np.savez(path, X=X, y=y)
    return path


@pytest.fixture
def test_csv(tmp_path):
    X, y = _blobs(10, 2)
    path = tmp_path / "held.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", *(f"f{i}" for i in range(X.shape[1]))])
        writer.writerows([label, *row] for label, row in zip(y, X.tolist(), strict=True))
    return path, X, y


def _fit(*args: str) -> list[str]:
    return ["fit", "--similarity", "rbf", "--basis-per-class", "4", "--quiet", *args]


def test_test_fraction_0_trains_on_every_item_and_says_so(train_npz, tmp_path, capsys):
    out = tmp_path / "all"
    assert main(_fit("--data", str(train_npz), "--out", str(out), "--test-fraction", "0")) == 0
    summary = capsys.readouterr().out
    assert "90 train, 0 test" in summary
    assert "test accuracy    none: no test split" in summary
    training = json.loads((out / "manifest.json").read_text())["training"]
    assert training["n_train"] == 90
    assert training["n_test"] == 0
    assert training["test_accuracy"] is None
    assert training["dataset"]["test_fraction"] == 0.0
    # The input normalisation was learned from all 90 items.
    predictor = Predictor.load(out)
    X, _ = _blobs(30, 1)
    np.testing.assert_allclose(predictor.inputs.mean, X.mean(axis=0), rtol=1e-12)
    centred_norm = np.linalg.norm(X - X.mean(axis=0), axis=1).mean()
    assert predictor.inputs.scale == pytest.approx(centred_norm, rel=1e-12)


def test_digits_with_test_fraction_0_trains_on_all_1797(tmp_path):
    dataset = load_dataset("digits", test_fraction=0.0)
    assert len(dataset.y_train) == 1797
    assert len(dataset.y_test) == 0
    assert load_dataset(dataset.source).X_train.shape == (1797, 64)  # recorded, reloaded
    assert len(load_dataset("digits").y_train) == 1000  # the fixed split otherwise


def test_test_data_scores_on_a_separate_file_in_another_format(
    train_npz, test_csv, tmp_path, capsys
):
    path, X_test, y_test = test_csv
    out = tmp_path / "m"
    assert main(_fit("--data", str(train_npz), "--test-data", str(path), "--out", str(out))) == 0
    assert "90 train, 30 test" in capsys.readouterr().out
    training = json.loads((out / "manifest.json").read_text())["training"]
    assert training["n_test"] == 30
    assert training["dataset"]["test_data"]["path"] == str(path)
    predictor = Predictor.load(out)
    expected = float((predictor.predict(X_test) == y_test.astype(str)).mean())
    assert training["test_accuracy"] == pytest.approx(expected)
    assert expected > 0.9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--test-fraction", "0.3"], "--test-data replaces the held-out split"),
        (["--label-column", "class"], "no label column 'class'"),
    ],
)
def test_test_data_errors_exit_2_with_a_message(
    train_npz, test_csv, tmp_path, capsys, args, message
):
    path, _, _ = test_csv
    out = tmp_path / "m"
    code = main(_fit("--data", str(train_npz), "--test-data", str(path), "--out", str(out), *args))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_test_data_of_another_width_is_refused(train_npz, tmp_path, capsys):
    X, y = _blobs(5, 3, dim=5)
    other = tmp_path / "narrow.npz"
    np.savez(other, X=X, y=y)
    code = main(
        _fit("--data", str(train_npz), "--test-data", str(other), "--out", str(tmp_path / "m"))
    )
    assert code == 2
    assert "test data narrow has input vector(5), the training data train vector(6)" in (
        capsys.readouterr().err
    )


def test_evaluate_scores_a_model_on_a_whole_data_set(train_npz, test_csv, tmp_path):
    path, X_test, y_test = test_csv
    out = tmp_path / "m"
    assert main(_fit("--data", str(train_npz), "--out", str(out), "--test-fraction", "0")) == 0
    numbers = tmp_path / "evaluation.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "evaluate",
            "--model",
            str(out),
            "--data",
            str(path),
            "--test-fraction",
            "0",
            "--json",
            str(numbers),
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "no baselines" in result.stderr
    evaluation = json.loads(numbers.read_text())
    assert (evaluation["n_train"], evaluation["n_test"]) == (0, 30)
    (model,) = evaluation["results"]  # the model alone: nothing to train baselines on
    predicted = Predictor.load(out).predict(X_test)
    assert model["accuracy"] == pytest.approx(float((predicted == y_test.astype(str)).mean()))


def test_evaluate_with_test_data_keeps_the_baselines(train_npz, test_csv, tmp_path, capsys):
    path, _, _ = test_csv
    out = tmp_path / "m"
    assert main(_fit("--data", str(train_npz), "--out", str(out), "--test-fraction", "0")) == 0
    capsys.readouterr()
    numbers = tmp_path / "evaluation.json"
    args = ["evaluate", "--model", str(out), "--test-data", str(path), "--repeats", "1"]
    assert main([*args, "--json", str(numbers)]) == 0
    evaluation = json.loads(numbers.read_text())
    assert (evaluation["n_train"], evaluation["n_test"]) == (90, 30)
    assert [r["method"] for r in evaluation["results"]][1:] == [
        "LinearSVC on inputs",
        "SVC(RBF, gamma=1) on inputs",
    ]


def test_evaluate_refuses_a_model_trained_on_everything_without_other_data(
    train_npz, tmp_path, capsys
):
    out = tmp_path / "m"
    assert main(_fit("--data", str(train_npz), "--out", str(out), "--test-fraction", "0")) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out)]) == 2
    assert "no test split" in capsys.readouterr().err


def test_fit_uses_the_cores_it_is_given_with_the_same_result(tmp_path):
    """``--jobs 1`` and ``--jobs 2`` fit the same model, as closely as the solver's stopping
    rule defines it. Each one-vs-rest problem's objective is 1-strongly convex (the
    regulariser), so a point whose gradient's norm is below the problem's stopping norm g (the
    tolerance's share of the norm at zero) lies within g of the optimum, and two such points
    within 2g of each other. Summation orders differ with the threads (the expansion's BLAS and
    numba sums, so the features in their last bits, and the solver's path with them), which
    moves the optimum itself by far less than that; exact agreement is not promised (an rtol
    of 1e-9 failed on a fresh clone, by up to 8e-8)."""
    X, y = load_digits(return_X_y=True)
    data = tmp_path / "digits.npz"
    np.savez(data, X=X[:400], y=y[:400])
    models = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert main(_fit("--data", str(data), "--out", str(out), "--jobs", jobs)) == 0
        models.append(Predictor.load(out))
    one, two = models
    training = load_dataset(str(data))  # the split fit made: seeded, a quarter held out
    assert one.metadata["training"]["n_train"] == len(training.y_train)
    features = one.features(training.X_train)
    codes = np.searchsorted(np.asarray(one.classes), training.y_train)
    problems = np.arange(len(one.classes))
    signs = problem_signs(codes, problems)
    _, gradient = InMemorySquaredHinge(features, signs, C=1.0).value_and_gradient(
        np.zeros((features.shape[1] + 1, len(problems))), problems
    )
    stop = liblinear_tolerance((signs > 0).sum(axis=0), len(codes), TOLERANCE)
    bound = 2 * stop * np.linalg.norm(gradient, axis=0)
    distance = np.linalg.norm(
        np.column_stack([one.coef - two.coef, one.intercept - two.intercept]), axis=1
    )
    assert (distance <= bound).all(), (distance, bound)
    # What a user sees: scores within what that distance allows (Cauchy-Schwarz, with the
    # bias), and the same class wherever the best two are further apart than that.
    held_out = X[400:]
    scores, other = one.decision_function(held_out), two.decision_function(held_out)
    reach = np.sqrt((one.features(held_out) ** 2).sum(axis=1) + 1)[:, None] * bound[None, :]
    assert (np.abs(scores - other) <= reach + 1e-12).all()
    top = np.sort(scores, axis=1)
    clear = top[:, -1] - top[:, -2] > 2 * reach.max(axis=1)
    np.testing.assert_array_equal(scores[clear].argmax(axis=1), other[clear].argmax(axis=1))
