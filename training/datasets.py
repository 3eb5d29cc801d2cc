"""Data sets: the embedded default (scikit-learn's digits) and a user's own ``.npz`` or CSV.

Every data set comes split into train and test, with labels as strings (the API's form of a
class) and inputs flattened to (n, d) float64 with an :class:`InputSpec` saying how to read them.
"""

from __future__ import annotations

import csv
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from service.model import InputSpec, SpecError

DIGITS = "digits"
DIGITS_TRAIN_SIZE = 1000


class DatasetError(ValueError):
    """A data set cannot be loaded; the message names the file and the problem."""


@dataclass
class Dataset:
    """A labelled data set with a fixed train/test split.

    Attributes
    ----------
    name : str
    input_spec : InputSpec
    X_train : ndarray of shape (n_train, d)
    y_train : ndarray of shape (n_train,), str
    X_test : ndarray of shape (n_test, d)
    y_test : ndarray of shape (n_test,), str
    source : dict
        How to load the same data and split again (recorded in the manifest).
    """

    name: str
    input_spec: InputSpec
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def classes(self) -> list[str]:
        return sorted(set(self.y_train.tolist()))


def load_dataset(
    source: str | dict[str, Any],
    *,
    test_fraction: float = 0.25,
    seed: int = 0,
    input_shape: str | None = None,
    label_column: str = "label",
) -> Dataset:
    """Load a data set by name or path, split into train and test.

    Parameters
    ----------
    source : str or dict
        ``"digits"``, a path to a ``.npz`` or ``.csv`` file, or a recorded ``Dataset.source``.
    test_fraction : float, default=0.25
        Held-out fraction for files without their own test split (stratified, seeded).
    seed : int, default=0
    input_shape : str, optional
        ``grid(H, W, C)`` to read flat file rows as grids.
    label_column : str, default="label"
        CSV column holding the class.

    Raises
    ------
    DatasetError
    """
    if isinstance(source, dict):
        recorded = dict(source)
        path = recorded.pop("path", DIGITS)
        return load_dataset(path, **recorded)
    if source == DIGITS:
        return load_digits_dataset()
    path = Path(source)
    if not path.exists():
        raise DatasetError(f"{path}: no such file (and not a known data set name: {DIGITS})")
    if path.suffix == ".npz":
        X, y, explicit_test = _read_npz(path)
    elif path.suffix == ".csv":
        X, y, explicit_test = *_read_csv(path, label_column), None
    else:
        raise DatasetError(f"{path}: unsupported file type {path.suffix!r}; use .npz or .csv")
    spec = _input_spec(path, X, input_shape)
    X = X.reshape(len(X), -1)
    recorded = {"path": str(path), "input_shape": input_shape, "label_column": label_column}
    if explicit_test is not None:
        X_test, y_test = explicit_test
        X_test = X_test.reshape(len(X_test), -1)
        if X_test.shape[1] != X.shape[1]:
            raise DatasetError(
                f"{path}: X_test rows have {X_test.shape[1]} values, X rows have {X.shape[1]}"
            )
        return Dataset(path.stem, spec, X, y, X_test, y_test, source=recorded)
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test fraction must be between 0 and 1, got {test_fraction}")
    try:
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=test_fraction, random_state=seed, stratify=y
        )
    except ValueError as error:
        raise DatasetError(f"{path}: cannot make a stratified split: {error}") from None
    recorded |= {"test_fraction": test_fraction, "seed": seed}
    return Dataset(path.stem, spec, X_train, y_train, X_test, y_test, source=recorded)


def load_digits_dataset() -> Dataset:
    """scikit-learn's 1,797 8x8 digits as ``grid(8, 8, 1)``: first 1,000 train, 797 test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = digits.data.astype(np.float64)
    y = digits.target.astype(str)
    n = DIGITS_TRAIN_SIZE
    spec = InputSpec("grid", (8, 8, 1))
    return Dataset(DIGITS, spec, X[:n], y[:n], X[n:], y[n:], source={"path": DIGITS})


def _read_npz(path: Path):
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path}: not a readable .npz archive (not a zip file)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise DatasetError(f"{path}: not a readable .npz archive ({error})") from None
    except ValueError as error:
        raise DatasetError(
            f"{path}: holds object arrays, which need pickle: refused ({error})"
        ) from None
    missing = [key for key in ("X", "y") if key not in arrays]
    if missing:
        raise DatasetError(
            f"{path}: missing array(s) {missing}; expected X (n, ...), y (n,), optional ids, "
            f"optional X_test and y_test; found {sorted(arrays)}"
        )
    X, y = _check_xy(path, arrays["X"], arrays["y"], "X", "y")
    if ("X_test" in arrays) != ("y_test" in arrays):
        raise DatasetError(f"{path}: X_test and y_test must be given together")
    explicit_test = None
    if "X_test" in arrays:
        explicit_test = _check_xy(path, arrays["X_test"], arrays["y_test"], "X_test", "y_test")
    return X, y, explicit_test


def _check_xy(path: Path, X: np.ndarray, y: np.ndarray, x_name: str, y_name: str):
    if X.dtype.kind not in "iuf":
        raise DatasetError(f"{path}: {x_name} must be numeric, got dtype {X.dtype}")
    if X.ndim < 2:
        raise DatasetError(f"{path}: {x_name} must have one row per item, got shape {X.shape}")
    if y.ndim != 1 or len(y) != len(X):
        raise DatasetError(
            f"{path}: {y_name} must have shape ({len(X)},) to match {x_name}, got {y.shape}"
        )
    if len(X) == 0:
        raise DatasetError(f"{path}: {x_name} is empty")
    X = X.astype(np.float64)
    if not np.isfinite(X).all():
        row = int(np.flatnonzero(~np.isfinite(X.reshape(len(X), -1)).all(axis=1))[0])
        raise DatasetError(f"{path}: {x_name} row {row} contains NaN or infinity")
    return X, y.astype(str)


def _read_csv(path: Path, label_column: str):
    try:
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DatasetError(f"{path}: cannot read as CSV ({error})") from None
    if len(rows) < 2:
        raise DatasetError(f"{path}: needs a header row and at least one data row")
    header = [name.strip() for name in rows[0]]
    if label_column not in header:
        raise DatasetError(
            f"{path}: no label column {label_column!r} in header {header}; "
            "name it with --label-column"
        )
    label_at = header.index(label_column)
    skip = {label_at} | ({header.index("id")} if "id" in header else set())
    feature_at = [i for i in range(len(header)) if i not in skip]
    if not feature_at:
        raise DatasetError(f"{path}: no feature columns besides {label_column!r}")
    X = np.empty((len(rows) - 1, len(feature_at)))
    labels = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DatasetError(f"{path}:{line}: {len(row)} fields, header has {len(header)}")
        try:
            X[line - 2] = [float(row[i]) for i in feature_at]
        except ValueError:
            bad = next(i for i in feature_at if not _is_number(row[i]))
            raise DatasetError(
                f"{path}:{line}: column {header[bad]!r} is not a number: {row[bad]!r}"
            ) from None
        labels.append(row[label_at].strip())
    return _check_xy(path, X, np.asarray(labels), "features", label_column)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _input_spec(path: Path, X: np.ndarray, input_shape: str | None) -> InputSpec:
    try:
        natural = InputSpec.for_array(X)
        if input_shape is None:
            return natural
        spec = InputSpec.parse(input_shape)
    except SpecError as error:
        raise DatasetError(f"{path}: {error}") from None
    if spec.n_features != natural.n_features:
        raise DatasetError(
            f"{path}: input shape {spec} needs {spec.n_features} values per item, "
            f"the file has {natural.n_features}"
        )
    return spec
