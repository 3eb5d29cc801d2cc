"""The evaluation report on a small grid: files, numbers that agree with each other, errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from training.cli.main import main
from training.evaluation.report import build_grid, run_report
from training.evaluation.report_data import ReportGrid


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    code = main(
        [
            "report",
            "--configurations",
            "rbf; rbf + rigid(1); hog(4, 6): rigid(1)",
            "--basis-sizes",
            "2,3",
            "--strategies",
            "index,kmedoids",
            "--normalizations",
            "besvm; nystroem(flip)",
            "--reference-size",
            "2",
            "--repeats",
            "1",
            "--folds",
            "2",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    return out


def test_report_writes_markdown_plots_and_numbers(small_report):
    names = {p.name for p in small_report.iterdir()}
    assert names == {
        "README.md",
        "results.json",
        "basis_size.png",
        "parameters.png",
        "normalizations.png",
        "eigen.png",
    }
    for png in small_report.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (small_report / "README.md").read_text()
    for figure in ("basis_size.png", "parameters.png", "normalizations.png", "eigen.png"):
        assert f"]({figure})" in markdown
    assert "python -m training report --configurations" in markdown


def test_report_numbers_agree_with_each_other(small_report):
    results = json.loads((small_report / "results.json").read_text())
    records = results["records"]
    # 3 configurations: sizes 2 and 3, plus kmedoids and nystroem(flip) at size 2.
    assert len(records) == 3 * 4
    keys = {
        (
            r["configuration"]["similarities"],
            r["basis_per_class"],
            r["basis_strategy"],
            r["normalization"],
        )
        for r in records
    }
    assert len(keys) == len(records)
    best = max(records, key=lambda r: (r["validation_accuracy"], -r["n_parameters"]))
    assert results["best"] == best
    markdown = (small_report / "README.md").read_text()
    for record in records:
        assert f"{100 * record['test_accuracy']:.2f}%" in markdown
        assert 0.0 < record["test_accuracy"] <= 1.0
    methods = [b["method"] for b in results["baselines"]]
    assert methods[:2] == ["LinearSVC", "SVC(RBF, gamma=1)"]
    assert "Nystroem(RBF, 20) + LinearSVC" in methods  # 2 per class x 10 classes
    # An rbf basis Gram matrix is PSD; rigid(1) between digits is not.
    pixels = [r for r in records if r["configuration"]["transform"] == "pixels"]
    assert all(r["diagnostics"]["rbf(gamma=1)"]["ngrat"] == 0.0 for r in pixels)
    with_rigid = [r["diagnostics"]["rigid(h=1)"] for r in pixels if "rigid" in str(r)]
    assert with_rigid
    assert all(d["ngrat"] > 0.0 for d in with_rigid)


def test_report_grid_fits_each_distinct_setting_once(digits):
    grid = build_grid(
        digits,
        ["rbf", "rbf(gamma=1)", "linear"],
        [5, 5, 2],
        ["index", "random"],
        ["besvm", "nystroem"],
        reference_size=5,
        seed=0,
        repeats=1,
    )
    assert [c.similarities for c in grid.configurations] == ["rbf(gamma=1)", "linear"]
    assert grid.normalizations == ("besvm", "nystroem(clip)")
    fits = grid.fits()
    assert len(fits) == len(set(fits)) == 2 * (2 + 1 + 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--configurations", "rigid(1)", "--data", "npz"], "no such file"),
        (["--configurations", "hog(2): rbf + sift"], "unknown similarity"),
        (["--basis-sizes", "5,x"], "must be integers"),
        (["--strategies", "best"], "unknown basis strategy"),
        (["--normalizations", "l2"], "unknown normalization"),
        (["--folds", "1"], "at least 2 folds"),
    ],
)
def test_bad_report_arguments_exit_2_with_a_message(args, message, tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "r"), "--quiet", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_grid_measures_are_refused_on_vector_data(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "v.npz", X=rng.normal(size=(40, 4)), y=np.repeat([0, 1], 20))
    code = main(
        [
            "report",
            "--data",
            str(tmp_path / "v.npz"),
            "--configurations",
            "rigid(1)",
            "--out",
            str(tmp_path / "r"),
            "--quiet",
        ]
    )
    assert code == 2
    assert "not a grid" in capsys.readouterr().err


def test_run_report_is_usable_as_a_library(digits):
    grid = ReportGrid(
        configurations=build_grid(
            digits, ["linear"], [1], ["index"], ["none"], 1, 0, 1
        ).configurations,
        basis_sizes=(1,),
        strategies=("index",),
        normalizations=("none",),
        reference_size=1,
        repeats=1,
    )
    report = run_report(digits, grid, verbose=False)
    assert len(report.records) == 1
    assert report.best().n_basis == 10


def test_plots_do_not_import_the_report_module():
    # plots reads the report's data types from training.evaluation.report_data: no import cycle
    # with report.
    code = (
        "import sys, training.evaluation.plots; "
        "assert 'training.evaluation.report' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_configurations_settle_their_transforms_as_fit_does(digits):
    """One rule for which transforms a model computes (the input kind's settle_transforms):
    measures that all name transforms of their own make the first one the model's, so no
    space is computed that no measure reads; otherwise the default (pixels) is the model's."""
    from training.estimator.estimator import BasisExpandingSVC
    from training.evaluation.report import parse_configuration

    own = parse_configuration("hog(2): rbf + hog(4): rbf", digits)
    assert own.transform == "hog(cell_size=2, orientations=9)"
    fitted = BasisExpandingSVC(
        similarity="hog(2): rbf + hog(4): rbf", basis_per_class=2, input_shape="grid(8, 8, 1)"
    ).fit(digits.X_train[:100], digits.y_train[:100])
    assert str(fitted.predictor_.transform) == own.transform
    assert parse_configuration("rbf + hog(4): rbf", digits).transform == "pixels"
    assert parse_configuration("hog(4, 6): rigid(1)", digits).transform == (
        "hog(cell_size=4, orientations=6)"
    )
