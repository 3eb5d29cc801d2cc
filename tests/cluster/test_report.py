"""``report --cluster``: the cross-validation's fits of the report grid as tasks on a real Dask
cluster's workers (two processes), scoring every setting as one process does."""

from __future__ import annotations

import json
import re

import pytest

from training.cli.main import main
from training.evaluation.report import build_grid, run_report
from training.evaluation.report_data import ReportGrid

pytestmark = pytest.mark.slow


def _grid(dataset) -> ReportGrid:
    """Two measures at two basis sizes, three folds: 12 fold fits, each a second or less."""
    return build_grid(
        dataset, ["rbf(gamma=1)", "linear"], [2, 5], ["index"], ["none"], 2, 0, 1, folds=3
    )


def _fold_tasks(task_stream) -> int:
    """Fold fits run on the workers: joblib's Dask backend names each of its tasks
    ``batch_of_<function>_<calls>_calls-<id>``."""
    calls = [re.match(r"batch_of__setting_fold_correct_(\d+)_calls", t["key"]) for t in task_stream]
    return sum(int(match.group(1)) for match in calls if match)


def test_the_cluster_scores_every_setting_as_one_process_does(dask_cluster, digits):
    from distributed import Client, get_task_stream

    grid = _grid(digits)
    alone = run_report(digits, grid, verbose=False)
    watcher = Client(dask_cluster, set_as_default=False)  # only watches the tasks
    with watcher, get_task_stream(client=watcher) as stream:
        clustered = run_report(digits, grid, False, dask_cluster.scheduler_address)
    assert _fold_tasks(stream.data) == len(grid.fits()) * grid.folds == 12

    def scores(report):
        return [
            (r.configuration.label, r.basis_per_class, r.validation_accuracy, r.test_accuracy)
            for r in report.records
        ]

    assert scores(clustered) == scores(alone)
    assert len({r.validation_accuracy for r in alone.records}) > 1  # the settings differ


def test_report_cluster_from_the_command_line(dask_cluster, tmp_path, capsys):
    out = tmp_path / "report"
    args = ["report", "--configurations", "linear", "--basis-sizes", "2", "--strategies",
            "index", "--normalizations", "none", "--reference-size", "2", "--folds", "2",
            "--repeats", "1", "--out", str(out), "--quiet",
            "--cluster", dask_cluster.scheduler_address]  # fmt: skip
    assert main(args) == 0
    assert "best             linear, 2 per class" in capsys.readouterr().out
    records = json.loads((out / "results.json").read_text())["records"]
    assert [r["basis_per_class"] for r in records] == [2]


def test_report_names_an_unreachable_scheduler(capsys):
    args = ["report", "--configurations", "linear", "--basis-sizes", "2", "--folds", "2",
            "--repeats", "1", "--quiet", "--cluster", "tcp://127.0.0.1:9"]  # fmt: skip
    assert main(args) == 2
    assert "tcp://127.0.0.1:9" in capsys.readouterr().err
