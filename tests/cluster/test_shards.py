"""Sharded data sets: the three layouts written and read back, the driver reading headers only,
and shards that disagree refused with the shard named."""

from __future__ import annotations

import numpy as np
import pytest

from training.cli.main import main
from training.cluster.shards import ShardError, is_sharded, open_shards, read_shard, write_shards


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(250, 7))
    y = rng.choice(["cat", "dog", "emu"], size=250)
    return X, y


def _read_all(data):
    parts = [read_shard(shard) for shard in data.shards]
    return np.vstack([X for X, _ in parts]), np.concatenate([y for _, y in parts])


@pytest.mark.parametrize("layout", ["npz", "npy-stack", "parquet"])
def test_each_layout_is_read_back_as_written(arrays, tmp_path, layout):
    X, y = arrays
    data = write_shards(X, y, tmp_path / "data", format=layout, rows_per_shard=100)
    assert data.format == layout
    assert [shard.n_rows for shard in data.shards] == [100, 100, 50]
    assert (data.n_samples, data.n_features) == (250, 7)
    assert is_sharded(tmp_path / "data")
    X_back, y_back = _read_all(open_shards(tmp_path / "data"))
    np.testing.assert_array_equal(X_back, X)
    np.testing.assert_array_equal(y_back, y)


@pytest.mark.parametrize("layout", ["npz", "npy-stack", "parquet"])
def test_a_range_of_a_shards_rows_is_read_alone(arrays, tmp_path, layout):
    X, y = arrays
    (shard,) = write_shards(X, y, tmp_path / "data", format=layout, rows_per_shard=250).shards
    part, labels = read_shard(shard, 40, 97)
    np.testing.assert_array_equal(part, X[40:97])
    np.testing.assert_array_equal(labels, y[40:97])
    assert part.flags.c_contiguous
    assert part.flags.owndata


@pytest.mark.parametrize(("start", "stop"), [(-1, 10), (10, 5), (0, 251)])
def test_a_range_outside_the_shard_is_refused(arrays, tmp_path, start, stop):
    X, y = arrays
    (shard,) = write_shards(X, y, tmp_path / "data", rows_per_shard=250).shards
    with pytest.raises(ValueError, match=f"rows {start} to {stop} of 250"):
        read_shard(shard, start, stop)


def test_a_bad_row_is_named_by_its_place_in_the_shard_when_a_range_is_read(arrays, tmp_path):
    X, y = arrays
    X = X.copy()
    X[120, 3] = np.nan
    (shard,) = write_shards(X, y, tmp_path / "data", rows_per_shard=250).shards
    np.testing.assert_array_equal(read_shard(shard, 0, 120)[0], X[:120])
    with pytest.raises(ShardError, match=r"0\.npz: row 120 contains NaN"):
        read_shard(shard, 100, 200)


def test_an_npy_stack_written_by_dask_itself_is_read_without_its_pickled_info(arrays, tmp_path):
    import dask.array as da

    X, y = arrays
    (tmp_path / "data").mkdir()
    da.to_npy_stack(tmp_path / "data" / "X", da.from_array(X, chunks=(60, 7)))
    da.to_npy_stack(tmp_path / "data" / "y", da.from_array(y.astype("U3"), chunks=60))
    (tmp_path / "data" / "X" / "info").write_bytes(b"not a pickle: never read")
    data = open_shards(tmp_path / "data")
    assert len(data.shards) == 5
    X_back, y_back = _read_all(data)
    np.testing.assert_array_equal(X_back, X)
    np.testing.assert_array_equal(y_back, y)


def test_shards_are_taken_in_the_order_of_their_numbers(arrays, tmp_path):
    X, y = arrays
    root = tmp_path / "data"
    root.mkdir()
    for index in (10, 2, 1):
        np.savez(root / f"{index}.npz", X=X[:index], y=y[:index])
    assert [shard.n_rows for shard in open_shards(root).shards] == [1, 2, 10]


@pytest.mark.parametrize("layout", ["npz", "parquet"])
def test_a_shard_of_another_width_is_refused_by_name(arrays, tmp_path, layout):
    X, y = arrays
    write_shards(X[:100], y[:100], tmp_path / "a", format=layout, rows_per_shard=100)
    write_shards(X[:100, :5], y[:100], tmp_path / "b", format=layout, rows_per_shard=100)
    suffix = "npz" if layout == "npz" else "parquet"
    (tmp_path / "b" / f"0.{suffix}").rename(tmp_path / "a" / f"1.{suffix}")
    with pytest.raises(
        ShardError, match=rf"1\.{suffix}: rows of 5 numbers, but .*0\.{suffix} has 7"
    ):
        open_shards(tmp_path / "a")


def test_a_shard_whose_labels_are_of_another_kind_is_refused_by_name(arrays, tmp_path):
    X, y = arrays
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "0.npz", X=X[:10], y=y[:10])
    np.savez(root / "1.npz", X=X[10:20], y=np.arange(10))
    with pytest.raises(ShardError, match=r"1\.npz: labels are integers, but .*0\.npz's are text"):
        open_shards(root)


def test_a_shard_whose_x_and_y_disagree_is_refused_by_name(arrays, tmp_path):
    X, y = arrays
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "0.npz", X=X[:10], y=y[:9])
    with pytest.raises(ShardError, match=r"0\.npz: y must have shape \(10,\)"):
        open_shards(root)


def test_a_directory_of_nothing_sharded_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ShardError, match="not a sharded data set"):
        open_shards(tmp_path)


def test_the_shard_command_writes_shards_from_one_npz(arrays, tmp_path, capsys):
    X, y = arrays
    np.savez(tmp_path / "one.npz", X=X, y=y)
    assert (
        main(
            [
                "shard",
                "--data",
                str(tmp_path / "one.npz"),
                "--out",
                str(tmp_path / "s"),
                "--rows",
                "100",
                "--format",
                "parquet",
            ]
        )
        == 0
    )
    assert "3 shards, 250 items of 7 numbers" in capsys.readouterr().out
    X_back, y_back = _read_all(open_shards(tmp_path / "s"))
    np.testing.assert_array_equal(X_back, X)
    np.testing.assert_array_equal(y_back, y)
    # A second time into the same directory: refused, exit 2, nothing overwritten.
    assert main(["shard", "--data", str(tmp_path / "one.npz"), "--out", str(tmp_path / "s")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
