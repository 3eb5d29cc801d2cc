"""BasisExpandingSVC on a real Dask cluster (two worker processes): the same model as in one
process, from arrays, from shards, inside a Client context and from the command line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from dask.utils import key_split
from sklearn.datasets import load_digits, make_classification

from service.model import Predictor
from training import BasisExpandingSVC
from training.cli.main import main
from training.cluster.rows import MIN_PIECE_ROWS, row_pieces
from training.cluster.shards import open_shards, write_shards

PARAMS = {"similarity": "rbf(gamma=1)", "basis_per_class": 8}


@pytest.fixture(scope="module")
def digits_arrays():
    X, y = load_digits(return_X_y=True)
    return X[:900], y[:900], X[1000:1300]


@pytest.fixture(scope="module")
def one_process(digits_arrays):
    X, y, _ = digits_arrays
    return BasisExpandingSVC(**PARAMS, n_jobs=1).fit(X, y)


def _assert_same_model(model, reference, X_test):
    """The same basis and normalisation; weights within the solver's tolerance of each other
    (the one-process solver's own tests derive it: here the blocks are summed in another order)
    and the same predictions."""
    np.testing.assert_array_equal(model.classes_.astype(str), reference.classes_.astype(str))
    # The same items; the input normaliser's mean, summed shard by shard, may differ in the
    # last bit.
    np.testing.assert_allclose(
        model.predictor_.inputs.basis_items, reference.predictor_.inputs.basis_items, atol=1e-12
    )
    np.testing.assert_allclose(model.predictor_.coef, reference.predictor_.coef, atol=1e-6)
    np.testing.assert_array_equal(
        model.predict(X_test).astype(str), reference.predict(X_test).astype(str)
    )


def test_arrays_fitted_on_the_cluster_give_the_one_process_model(
    dask_cluster, digits_arrays, one_process
):
    X, y, X_test = digits_arrays
    model = BasisExpandingSVC(**PARAMS, cluster=dask_cluster.scheduler_address).fit(X, y)
    _assert_same_model(model, one_process, X_test)
    assert model.n_iter_ > 1
    np.testing.assert_array_equal(model.classes_, one_process.classes_)  # labels keep their type


def test_shards_fitted_on_the_cluster_give_the_one_process_model(
    dask_cluster, digits_arrays, one_process, tmp_path
):
    X, y, X_test = digits_arrays
    data = write_shards(X, y, tmp_path / "shards", format="parquet", rows_per_shard=200)
    model = BasisExpandingSVC(**PARAMS, cluster=dask_cluster.scheduler_address).fit(data)
    _assert_same_model(model, one_process, X_test)


def test_a_fit_inside_a_client_context_runs_on_that_cluster(dask_cluster, digits_arrays):
    from distributed import Client

    X, y, X_test = digits_arrays
    with Client(dask_cluster) as client:
        before = sum(client.run(lambda dask_worker: dask_worker.state.executed_count).values())
        model = BasisExpandingSVC(**PARAMS, normalization="besvm").fit(X, y)
        after = sum(client.run(lambda dask_worker: dask_worker.state.executed_count).values())
    assert after > before  # the workers did the work
    reference = BasisExpandingSVC(**PARAMS, normalization="besvm", n_jobs=1).fit(X, y)
    np.testing.assert_allclose(model.predictor_.feature_offset, reference.predictor_.feature_offset)
    np.testing.assert_allclose(model.predictor_.feature_scale, reference.predictor_.feature_scale)
    _assert_same_model(model, reference, X_test)


def test_a_bof_transform_in_memory_trains_in_this_process_with_a_warning(dask_cluster):
    """Its visual words are learned from every item in one process: with the data in memory,
    the fit runs here, says so, and is the one-process model."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(0.0, 1.0, size=(40, 32 * 32)), np.repeat([0, 1], 20)
    params = {
        "similarity": "sensing0",
        "input_transform": "bof(patch=8, step=4, words=16, levels=1, single=1)",
        "basis_per_class": 3,
        "input_shape": "grid(32, 32, 1)",
    }
    model = BasisExpandingSVC(**params, cluster=dask_cluster.scheduler_address)
    with pytest.warns(UserWarning, match=r"bof\(.*visual words.*trained in this process"):
        model.fit(X, y)
    reference = BasisExpandingSVC(**params).fit(X, y)
    np.testing.assert_array_equal(model.predictor_.coef, reference.predictor_.coef)


def test_a_bof_transform_on_shards_is_refused_naming_it(dask_cluster, tmp_path):
    rng = np.random.default_rng(0)
    data = write_shards(
        rng.uniform(0.0, 1.0, size=(40, 32 * 32)), np.repeat([0, 1], 20), tmp_path / "s"
    )
    model = BasisExpandingSVC(
        similarity="sensing0",
        input_transform="bof(patch=8, step=4, words=16, levels=1, single=1)",
        input_shape="grid(32, 32, 1)",
        cluster=dask_cluster.scheduler_address,
    )
    with pytest.raises(ValueError, match=r"bof\(.*visual words.*sharded data cannot train"):
        model.fit(data)


def test_fit_from_the_command_line_on_shards_writes_the_model(
    dask_cluster, digits_arrays, one_process, tmp_path, capsys
):
    X, y, X_test = digits_arrays
    np.savez(tmp_path / "digits.npz", X=X, y=y)
    shards = tmp_path / "shards"
    assert (
        main(
            ["shard", "--data", str(tmp_path / "digits.npz"), "--out", str(shards), "--rows", "300"]
        )
        == 0
    )
    assert len(open_shards(shards).shards) == 3
    status = main(
        [
            "fit",
            "--data",
            str(shards),
            "--similarity",
            PARAMS["similarity"],
            "--basis-per-class",
            "8",
            "--cluster",
            dask_cluster.scheduler_address,
            "--out",
            str(tmp_path / "model"),
        ]
    )
    assert status == 0
    printed = capsys.readouterr()
    assert "3 shards, 900 items" in printed.out
    # The cluster fit's progress lines reach the command line (they were logged to no handler).
    assert "cluster fit: features on 80 basis items" in printed.err
    served = Predictor.load(tmp_path / "model")
    np.testing.assert_array_equal(served.predict(X_test), one_process.predict(X_test).astype(str))

    # The shards are never loaded whole: evaluate scores the model on --test-data alone (it
    # passed the recorded shards to the file reader, a TypeError).
    X_all, y_all = load_digits(return_X_y=True)
    np.savez(tmp_path / "test.npz", X=X_all[1000:1300], y=y_all[1000:1300])
    evaluate = ["evaluate", "--model", str(tmp_path / "model")]
    assert main([*evaluate, "--test-data", str(tmp_path / "test.npz"), "--repeats", "1"]) == 0
    printed = capsys.readouterr()
    accuracy = (served.predict(X_all[1000:1300]) == y_all[1000:1300].astype(str)).mean()
    assert f"{100 * accuracy:.2f}" in printed.out
    assert "no training split" in printed.err
    assert main(evaluate) == 2
    assert "pass --test-data FILE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("n_rows", "n_pieces"),
    [
        ([50_000], 4),
        ([2_000], 4),
        ([1_500], 4),
        ([2_001], 8),
        ([50_000, 50_000, 50_000], 4),
        ([20_000, 20_000, 5_000], 8),
        ([300, 20_000], 8),
    ],
)
def test_row_pieces_cover_every_row_once_in_order(n_rows, n_pieces):
    pieces = row_pieces(n_rows, n_pieces)
    for part, rows in enumerate(n_rows):
        own = [(start, stop) for p, start, stop in pieces if p == part]
        assert own[0][0] == 0
        assert own[-1][1] == rows
        assert all(a[1] == b[0] for a, b in itertools.pairwise(own))
    sizes = np.array([stop - start for _, start, stop in pieces])
    assert len(pieces) >= min(n_pieces, sum(rows // MIN_PIECE_ROWS or 1 for rows in n_rows))
    for part, rows in enumerate(n_rows):
        own = sizes[[p == part for p, _, _ in pieces]]
        assert own.min() >= min(MIN_PIECE_ROWS, rows)
    assert [p for p, _, _ in pieces] == sorted(p for p, _, _ in pieces)


def test_one_large_shard_is_read_and_expanded_on_every_worker(dask_cluster, tmp_path):
    """A shard of all the items is cut into row pieces: both workers compute features."""
    from distributed import Client, get_task_stream

    X, y = make_classification(n_samples=4_000, n_features=8, n_classes=3, n_informative=4,
                               random_state=0)  # fmt: skip
    data = write_shards(X, y, tmp_path / "shards", rows_per_shard=4_000)
    assert len(data.shards) == 1
    with Client(dask_cluster) as client, get_task_stream(client) as stream:
        model = BasisExpandingSVC(**PARAMS).fit(data)
    workers = {task["worker"] for task in stream.data if key_split(task["key"]) == "feature_block"}
    assert len(workers) == 2
    reference = BasisExpandingSVC(**PARAMS, n_jobs=1).fit(X, y)
    _assert_same_model(model, reference, X[:500])
