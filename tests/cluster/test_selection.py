"""Model selection on a real Dask cluster (two worker processes): the fold fits as tasks on the
workers, the same choice as in one process, the refit the distributed fit; sharded data searched
on a stratified sample of its shards and fitted on all of them; the error paths."""

from __future__ import annotations

import json
import re
import socket
import time

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_wine

from service.model import Predictor
from tests.cluster.conftest import start_local_cluster
from training import BasisExpandingSVC, ForwardSelectionCV
from training.cli.main import main
from training.cluster.connection import ClusterError
from training.cluster.rows import draw_sample
from training.cluster.shards import open_shards, write_shards

# Never reached on these sets (every stage runs: see `stopped_`), so that both searches score
# the same candidates; a budget that cut either would stop them at different candidates.
GENEROUS_BUDGET_S = 600.0


def _without_times(path: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "elapsed_s"} for entry in path]


def _fold_fits(task_stream) -> int:
    """Fold fits run on the workers: joblib's Dask backend names each of its tasks
    ``batch_of_<function>_<calls>_calls-<id>``, the function here the scorer's ``_indexed``."""
    calls = [re.match(r"batch_of__indexed_(\d+)_calls", task["key"]) for task in task_stream]
    return sum(int(match.group(1)) for match in calls if match)


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory):
    X, y = load_digits(return_X_y=True)
    root = tmp_path_factory.mktemp("digits") / "shards"
    return write_shards(X[:900], y[:900], root, rows_per_shard=300), X[1000:1400], y[1000:1400]


def test_selection_on_the_cluster_chooses_what_one_process_chooses(dask_cluster, dask_client):
    """The same seed gives the same folds, the same candidates and the same fits (one numba
    thread each, here and on a worker), so the same path and choice; the budget is generous
    enough that it cuts neither search (otherwise the one that ran faster would have scored
    more candidates). One shuffle of the folds keeps the test short on 2 loaded cores."""
    from distributed import get_task_stream

    X, y = load_wine(return_X_y=True)
    search = {"budget": GENEROUS_BUDGET_S, "repeats": 1}
    alone = ForwardSelectionCV(BasisExpandingSVC(n_jobs=1), **search, n_jobs=1).fit(X, y)
    with get_task_stream(client=dask_client) as stream:
        clustered = ForwardSelectionCV(
            BasisExpandingSVC(cluster=dask_cluster.scheduler_address), **search
        ).fit(X, y)
    assert alone.stopped_ == clustered.stopped_ == "every stage done"
    assert clustered.best_params_ == alone.best_params_
    assert _without_times(clustered.path_) == _without_times(alone.path_)
    assert clustered.best_score_ == alone.best_score_
    assert clustered.n_fits_ == alone.n_fits_ > 20
    # Every fold fit ran on the workers, and so did the refit (the distributed fit's tasks).
    assert _fold_fits(stream.data) == clustered.n_fits_
    assert any(task["key"].startswith("_feature_block") for task in stream.data)
    model, reference = clustered.best_estimator_, alone.best_estimator_
    assert model.cluster == dask_cluster.scheduler_address  # the parameters stay as given
    # The distributed fit sums the shards in another order: weights within the solver's
    # tolerance (tests/cluster/test_distributed_fit.py), the same predictions.
    np.testing.assert_allclose(model.predictor_.coef, reference.predictor_.coef, atol=1e-6)
    np.testing.assert_array_equal(model.predict(X), reference.predict(X))


def test_auto_inside_a_client_context_selects_on_that_cluster(dask_cluster):
    """ForwardSelectionCV(BasisExpandingSVC()) in ``with Client(...)``: the selection's fits are
    the workers' (their executed tasks grow by at least the fold fits), and the artifact records
    the selection."""
    from distributed import Client

    X, y = load_wine(return_X_y=True)
    with Client(dask_cluster) as client:
        executed = lambda: sum(  # noqa: E731
            client.run(lambda dask_worker: dask_worker.state.executed_count).values()
        )
        before = executed()
        selection = ForwardSelectionCV(BasisExpandingSVC(), budget=8).fit(X, y)
        after = executed()
    assert after - before > 0
    assert selection.n_fits_ > 0
    training = selection.to_predictor().metadata["training"]
    assert training["selection"]["chosen"] == selection.best_params_
    assert selection.score(X, y) > 0.85


def test_a_stratified_sample_is_drawn_from_the_shards(dask_client, tmp_path):
    X, y = load_digits(return_X_y=True)
    labels = y.astype(str)
    data = write_shards(X, labels, tmp_path / "shards", rows_per_shard=250)
    rows, drawn, counts = draw_sample(dask_client, data, 300, random_state=3)
    classes, expected = np.unique(labels, return_counts=True)
    np.testing.assert_array_equal(counts, expected)
    drawn_classes, drawn_counts = np.unique(drawn, return_counts=True)
    np.testing.assert_array_equal(drawn_classes, classes)
    np.testing.assert_allclose(drawn_counts, expected * 300 / len(labels), atol=0.5 + 1e-9)
    # Items of the data set, with their own labels, each drawn once.
    where = {row.tobytes(): i for i, row in enumerate(X)}
    positions = [where[row.tobytes()] for row in rows]
    np.testing.assert_array_equal(labels[positions], drawn)
    assert len(set(positions)) == len(positions)
    again, _, _ = draw_sample(dask_client, data, 300, random_state=3)
    np.testing.assert_array_equal(again, rows)  # the seed decides
    other, _, _ = draw_sample(dask_client, data, 300, random_state=4)
    assert not np.array_equal(other, rows)


def test_sharded_data_is_searched_on_a_sample_and_fitted_on_every_shard(
    dask_cluster, digits_shards
):
    data, X_test, y_test = digits_shards
    selection = ForwardSelectionCV(
        BasisExpandingSVC(cluster=dask_cluster.scheduler_address), budget=10, max_items=300
    ).fit(data)
    assert selection.n_items_ <= 300  # the search saw a sample of the 900 items
    model = selection.best_estimator_
    assert model.predictor_.metadata["training"]["n_train"] == 900  # the fit saw them all
    chosen = selection.best_params_
    assert {k: model.get_params()[k] for k in chosen} == chosen
    # The basis grows with the whole set where the search was on a sample.
    assert chosen["basis_per_class"] >= selection.searched_basis_per_class_
    # Shards keep labels as text (every layout can store them so).
    assert (model.predict(X_test).astype(str) == y_test.astype(str)).mean() > 0.9
    # C is chosen again on every shard: a path of distributed fits, each warm-started from the
    # one before, scored on the items held out of every shard; the model is the best C's.
    path = selection.C_path_
    assert len(path) >= 3
    assert [entry["C"] for entry in path] == sorted(entry["C"] for entry in path)
    best = max(path, key=lambda entry: entry["held_out_accuracy"])
    assert chosen["C"] == model.C == best["C"]
    assert all(0 < entry["held_out_accuracy"] <= 1 for entry in path)
    assert selection.record()["C_path_on_shards"] == path
    assert "C on every shard (held-out accuracy): " in selection.describe()


def test_fit_auto_on_shards_from_the_command_line(dask_cluster, tmp_path, capsys):
    X, y = load_wine(return_X_y=True)
    np.savez(tmp_path / "wine.npz", X=X, y=y)
    assert main(["shard", "--data", str(tmp_path / "wine.npz"), "--out", str(tmp_path / "s")]) == 0
    argv = ["fit", "--data", str(tmp_path / "s"), "--budget", "6", "--out", str(tmp_path / "m")]
    status = main([*argv, "--cluster", dask_cluster.scheduler_address, "--quiet"])
    assert status == 0  # --similarity auto, the default
    out = capsys.readouterr().out
    assert "selection path (CV accuracy on a stratified sample of the shards)" in out
    assert "chosen: " in out
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    selection = manifest["training"]["selection"]
    assert selection["n_items"] == 178
    config = manifest["training"]["config"]
    assert {k: config[k] for k in selection["chosen"]} == selection["chosen"]
    served = Predictor.load(tmp_path / "m")
    assert (served.predict(X) == y.astype(str)).mean() > 0.85
    assert open_shards(tmp_path / "s").n_samples == 178


def test_documents_select_on_the_cluster_and_train_here_with_a_warning(dask_cluster, text_dataset):
    texts, labels = list(text_dataset.X_train), text_dataset.y_train
    estimator = BasisExpandingSVC(min_df=1, cluster=dask_cluster.scheduler_address)
    selection = ForwardSelectionCV(estimator, budget=5)
    with pytest.warns(UserWarning, match="documents train in one process.*in this process"):
        selection.fit(texts, labels)
    assert selection.n_fits_ > 0
    assert selection.best_estimator_.predictor_.vocabulary is not None


def test_labels_given_with_shards_are_refused(dask_cluster, digits_shards):
    data, _, _ = digits_shards
    auto = ForwardSelectionCV(BasisExpandingSVC(cluster=dask_cluster.scheduler_address))
    with pytest.raises(ValueError, match="sharded data holds its labels: pass no y"):
        auto.fit(data, np.zeros(data.n_samples))


def test_an_unreachable_scheduler_is_one_error_naming_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    X, y = load_wine(return_X_y=True)
    with pytest.raises(ClusterError, match=f"no Dask scheduler answered at {address}"):
        ForwardSelectionCV(BasisExpandingSVC(cluster=address)).fit(X, y)


def test_shards_without_a_cluster_are_searched_and_fitted_in_this_process(tmp_path):
    """No cluster named: the sample is read by worker threads of this process, the fold fits
    run here, and the fit on every shard too."""
    X, y = load_wine(return_X_y=True)
    data = write_shards(X, y, tmp_path / "shards", rows_per_shard=60)
    selection = ForwardSelectionCV(BasisExpandingSVC(), budget=3).fit(data)
    assert selection.n_items_ == 178
    assert selection.best_estimator_.predictor_.metadata["training"]["n_train"] == 178
    assert (selection.predict(X).astype(str) == y.astype(str)).mean() > 0.85


def _process_cpu() -> float:
    return time.process_time()


def test_fold_fits_sharing_a_worker_are_counted_their_own_cpu_time_not_each_others():
    """A worker of two threads runs two fold fits at once. Each is counted by its own thread's
    clock, so the selection's CPU seconds are at most what the worker process spent, and most
    of it; counted by the process's clock, each fit also counted the other's work (about 1.6
    times what the worker spent)."""
    from distributed import Client

    X, y = load_wine(return_X_y=True)
    with (
        start_local_cluster(n_workers=1, threads_per_worker=2) as cluster,
        Client(cluster) as client,
    ):

        def worker_cpu() -> float:
            return sum(client.run(_process_cpu).values())

        before = worker_cpu()
        search = ForwardSelectionCV(
            BasisExpandingSVC(cluster=cluster.scheduler_address),
            budget=GENEROUS_BUDGET_S,
            repeats=1,
            refit=False,
        ).fit(X, y)
        spent = worker_cpu() - before
    assert search.stopped_ == "every stage done"
    assert search.n_fits_ > 20
    # the rest is the worker's own (tasks received, results sent): about a sixth here
    assert spent / 2 <= search.cpu_seconds_ <= spent
