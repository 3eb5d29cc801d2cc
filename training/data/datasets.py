"""Data sets: the embedded default (scikit-learn's digits), Debian's fortunes, a user's own files.

Every data set comes split into train and test, with labels as strings (the API's form of a
class) and an :class:`InputSpec` saying how to read the inputs.

Numeric data sets (digits, a ``.npz`` or ``.csv`` file) hold inputs flattened to (n, d) float64.

Text data sets hold raw documents for a bag-of-words model: their input spec is ``text`` and
``X_train``/``X_test`` are 1-d object arrays of Python ``str``, one document each.

- ``"fortunes"``: the quotes of Debian's ``fortunes`` and ``fortunes-min`` packages
  (``/usr/share/games/fortunes``), labelled by category file; categories with fewer than 100
  quotes are dropped (32 categories, about 14,700 quotes).
- ``"segment"``, ``"phishing"``, ``"mnist5k"``: real data sets that packages of the dev extra
  ship as files (:mod:`training.data.packaged`), never tuned on: held back for the default's
  comparison with a tuned kernel SVM.
- A folder holding one sub-folder per class, every (non-hidden) file in a sub-folder one
  document of that class.
- A ``.jsonl`` file, one ``{"text": ..., "label": ...}`` object a line.

Files without their own test split are split with a stratified, seeded ``train_test_split``;
a test fraction of 0 keeps every item for training (digits too: all 1,797), and
:func:`with_test_data` takes the test split from another file instead. ``Dataset.source``
records how to load the same data and split again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from service.model.inputs.spec import InputSpec
from training.data.packaged import PACKAGED_SETS, PackagedDataError
from training.data.readers import (
    DatasetError,
    file_input_spec,
    fortune_files,
    read_csv,
    read_fortune_file,
    read_jsonl,
    read_npz,
    read_text_folder,
)

DIGITS = "digits"
DIGITS_TRAIN_SIZE = 1000

FORTUNES = "fortunes"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES_MIN_QUOTES = 100
TEXT_SPEC = InputSpec("text", ())


@dataclass
class Dataset:
    """A labelled data set with a fixed train/test split.

    Attributes
    ----------
    name : str
    input_spec : InputSpec
    X_train : ndarray of shape (n_train, d)
        float64; for a ``text`` input spec, shape (n_train,) of dtype object holding ``str``.
    y_train : ndarray of shape (n_train,), str
    X_test : ndarray of shape (n_test, d)
        Like ``X_train``.
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
        ``"digits"``, ``"fortunes"``, a path to a ``.npz``, ``.csv`` or ``.jsonl`` file, a path
        to a folder of class sub-folders, or a recorded ``Dataset.source``.
    test_fraction : float, default=0.25
        Held-out fraction for files without their own test split (stratified, seeded); 0
        keeps every item for training (an empty test split), digits included.
    seed : int, default=0
    input_shape : str, optional
        ``grid(H, W, C)`` to read flat file rows as grids (numeric data sets only).
    label_column : str, default="label"
        CSV column holding the class.

    Raises
    ------
    DatasetError
    """
    if isinstance(source, dict):
        recorded = dict(source)
        test_data = recorded.pop("test_data", None)
        path = recorded.pop("path", DIGITS)
        if path == FORTUNES:
            dataset = _load_recorded_fortunes(recorded)
        else:
            dataset = load_dataset(path, **recorded)
        return dataset if test_data is None else with_test_data(dataset, test_data)
    if source == DIGITS:
        _check_test_fraction(test_fraction)
        return load_digits_dataset(every_item=test_fraction == 0)
    if source == FORTUNES:
        _refuse_input_shape(FORTUNES, input_shape)
        return load_fortunes_dataset(test_fraction=test_fraction, seed=seed)
    if source in PACKAGED_SETS:
        _refuse_input_shape(source, input_shape)
        return load_packaged_dataset(source, test_fraction=test_fraction, seed=seed)
    path = Path(source)
    if not path.exists():
        raise DatasetError(
            f"{path}: no such file or folder (and not a known data set name: "
            f"{', '.join([DIGITS, FORTUNES, *PACKAGED_SETS])}); expected a .npz, .csv or "
            ".jsonl file, or a folder holding one sub-folder of text files per class"
        )
    if path.is_dir() or path.suffix == ".jsonl":
        _refuse_input_shape(path, input_shape)
        if path.is_dir():
            name = path.resolve().name or str(path)
            documents, labels = read_text_folder(path)
        else:
            name = path.stem
            documents, labels = read_jsonl(path)
        return _split_text(
            name,
            path,
            documents,
            labels,
            test_fraction=test_fraction,
            seed=seed,
            recorded={"path": str(path)},
        )
    if path.suffix == ".npz":
        X, y, explicit_test = read_npz(path)
    elif path.suffix == ".csv":
        X, y, explicit_test = *read_csv(path, label_column), None
    else:
        raise DatasetError(
            f"{path}: unsupported file type {path.suffix!r}; use .npz or .csv (numbers), "
            ".jsonl (text documents), a folder holding one sub-folder of text files per class, "
            f"or the name {FORTUNES!r}"
        )
    spec = file_input_spec(path, X, input_shape)
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
    _check_test_fraction(test_fraction)
    try:
        X_train, X_test, y_train, y_test = _split(X, y, test_fraction, seed)
    except ValueError as error:
        raise DatasetError(f"{path}: cannot make a stratified split: {error}") from None
    recorded |= {"test_fraction": test_fraction, "seed": seed}
    return Dataset(path.stem, spec, X_train, y_train, X_test, y_test, source=recorded)


def load_digits_dataset(every_item: bool = False) -> Dataset:
    """scikit-learn's 1,797 8x8 digits as ``grid(8, 8, 1)``: first 1,000 train, 797 test; or
    with ``every_item`` all 1,797 train and none test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = digits.data.astype(np.float64)
    y = digits.target.astype(str)
    n = len(y) if every_item else DIGITS_TRAIN_SIZE
    spec = InputSpec("grid", (8, 8, 1))
    source = {"path": DIGITS, "test_fraction": 0.0} if every_item else {"path": DIGITS}
    return Dataset(DIGITS, spec, X[:n], y[:n], X[n:], y[n:], source=source)


def load_packaged_dataset(name: str, *, test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """A data set an installed package ships (:data:`training.data.packaged.PACKAGED_SETS`), split
    stratified and seeded.

    Raises
    ------
    DatasetError
        The package is not installed, or its file is not as expected.
    """
    packaged = PACKAGED_SETS[name]
    _check_test_fraction(test_fraction)
    try:
        X, y = packaged.load()
    except PackagedDataError as error:
        raise DatasetError(str(error)) from None
    X_train, X_test, y_train, y_test = _split(X, y, test_fraction, seed)
    source = {"path": name, "test_fraction": test_fraction, "seed": seed}
    return Dataset(name, packaged.input_spec, X_train, y_train, X_test, y_test, source=source)


def with_test_data(
    dataset: Dataset,
    test_source: str | dict[str, Any],
    *,
    input_shape: str | None = None,
    label_column: str = "label",
) -> Dataset:
    """``dataset`` with every item of another data set as its test split.

    Parameters
    ----------
    dataset : Dataset
        Its training split is kept, its test split replaced.
    test_source : str or dict
        A data set as :func:`load_dataset` takes it; all of its items (a file's own test
        split included) become the test split.
    input_shape, label_column
        How to read the test file, as :func:`load_dataset` takes them.

    Returns
    -------
    Dataset
        Its ``source`` records the test data under ``test_data``.

    Raises
    ------
    DatasetError
        The test data cannot be loaded, or its inputs differ from the training inputs.
    """
    test = load_test_set(test_source, input_shape=input_shape, label_column=label_column)
    if test.input_spec.is_documents != dataset.input_spec.is_documents or (
        not dataset.input_spec.is_documents
        and test.input_spec.n_features != dataset.input_spec.n_features
    ):
        raise DatasetError(
            f"test data {test.name} has input {test.input_spec}, the training data "
            f"{dataset.name} {dataset.input_spec}"
        )
    if len(test.y_test) == 0:
        raise DatasetError(f"test data {test.name} holds no items")
    source = {**dataset.source, "test_data": test.source}
    return Dataset(
        dataset.name,
        dataset.input_spec,
        dataset.X_train,
        dataset.y_train,
        test.X_test,
        test.y_test,
        source,
    )


def load_test_set(
    test_source: str | dict[str, Any],
    *,
    input_shape: str | None = None,
    label_column: str = "label",
) -> Dataset:
    """Every item of a data set as a test split, and no training split.

    Parameters
    ----------
    test_source : str or dict
        A data set as :func:`load_dataset` takes it (a file's own test split included).
    input_shape, label_column
        How to read a file, as :func:`load_dataset` takes them.

    Raises
    ------
    DatasetError
    """
    if isinstance(test_source, dict):
        return as_test_set(load_dataset(test_source))
    return as_test_set(
        load_dataset(
            test_source, test_fraction=0.0, input_shape=input_shape, label_column=label_column
        )
    )


def as_test_set(dataset: Dataset) -> Dataset:
    """Every item of ``dataset`` as its test split, and no training split (to score a model on
    a whole data set)."""
    X = np.concatenate([dataset.X_train, dataset.X_test])
    y = np.concatenate([dataset.y_train, dataset.y_test])
    return Dataset(dataset.name, dataset.input_spec, X[:0], y[:0], X, y, dict(dataset.source))


def _split(X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int):
    """A stratified, seeded split; with a test fraction of 0 every item trains."""
    if test_fraction == 0:
        return X, X[:0], y, y[:0]
    return train_test_split(X, y, test_size=test_fraction, random_state=seed, stratify=y)


def _check_test_fraction(test_fraction: float) -> None:
    if not 0.0 <= test_fraction < 1.0:
        raise DatasetError(
            f"test fraction must be at least 0 (0: train on every item) and below 1, "
            f"got {test_fraction}"
        )


# -- text data sets -----------------------------------------------------------------------------


def load_fortunes_dataset(
    root: str | Path = FORTUNES_DIR,
    *,
    min_quotes: int = FORTUNES_MIN_QUOTES,
    test_fraction: float = 0.25,
    seed: int = 0,
) -> Dataset:
    """The quotes of Debian's ``fortunes`` and ``fortunes-min`` packages, labelled by category.

    Every regular file in `root` is a category (its name is the class); quotes in it are
    separated by lines holding a single ``%``. The index files (``*.dat``), their UTF-8 aliases
    (``*.u8``, symbolic links), sub-folders such as ``off/`` and anything else that is not a
    regular file are skipped. Bytes are decoded as UTF-8 (undecodable bytes replaced), each quote
    is stripped and empty quotes are dropped.

    Parameters
    ----------
    root : str or Path, default=FORTUNES_DIR
        The folder of fortune files, ``/usr/share/games/fortunes``.
    min_quotes : int, default=100
        Categories with fewer quotes are dropped (on Debian: 32 categories, 14,691 quotes; the
        largest class, ``people``, is 8.5 % of them).
    test_fraction : float, default=0.25
        Held-out fraction, stratified by category.
    seed : int, default=0
        Seed of the split.

    Returns
    -------
    Dataset
        Named ``"fortunes"``, input spec ``text``.

    Raises
    ------
    DatasetError
        If the folder is missing or holds no fortune files (the message says how to install
        them), if fewer than 2 categories have `min_quotes` quotes, or if the split is impossible.
    """
    root = Path(root)
    if isinstance(min_quotes, bool) or not isinstance(min_quotes, int) or min_quotes < 1:
        raise DatasetError(f"min_quotes must be a positive integer, got {min_quotes!r}")
    _check_test_fraction(test_fraction)
    files = fortune_files(root)
    if not files:
        problem = "holds no fortune files" if root.is_dir() else "does not exist"
        raise DatasetError(
            f"{root}: the folder {problem}; the {FORTUNES!r} data set needs the Debian packages "
            "fortunes and fortunes-min: install them with `apt-get install fortunes fortunes-min` "
            f"(looked in {root})"
        )
    documents: list[str] = []
    labels: list[str] = []
    counts: dict[str, int] = {}
    for file in files:
        quotes = read_fortune_file(file)
        counts[file.name] = len(quotes)
        if len(quotes) >= min_quotes:
            documents += quotes
            labels += [file.name] * len(quotes)
    kept = sorted(name for name, n in counts.items() if n >= min_quotes)
    if len(kept) < 2:
        per_category = ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))
        raise DatasetError(
            f"{root}: fewer than 2 categories have at least {min_quotes} quotes ({len(kept)} do); "
            f"lower min_quotes. Quotes per category: {per_category}"
        )
    recorded: dict[str, Any] = {"path": FORTUNES, "min_quotes": min_quotes}
    if root != FORTUNES_DIR:
        recorded["root"] = str(root)
    return _split_text(
        FORTUNES,
        root,
        documents,
        labels,
        test_fraction=test_fraction,
        seed=seed,
        recorded=recorded,
    )


def _load_recorded_fortunes(recorded: dict[str, Any]) -> Dataset:
    options = {"root", "min_quotes", "test_fraction", "seed", "input_shape", "label_column"}
    unknown = sorted(set(recorded) - options)
    if unknown:
        raise DatasetError(f"recorded {FORTUNES!r} source has unknown settings {unknown}")
    _refuse_input_shape(FORTUNES, recorded.pop("input_shape", None))
    recorded.pop("label_column", None)
    return load_fortunes_dataset(**recorded)


def _refuse_input_shape(where: str | Path, input_shape: str | None) -> None:
    if input_shape is not None:
        raise DatasetError(
            f"{where}: a text data set takes no input shape (got {input_shape!r}); "
            "its input kind is text"
        )


def _split_text(
    name: str,
    where: Path,
    documents: Iterable[str],
    labels: Iterable[str],
    *,
    test_fraction: float,
    seed: int,
    recorded: dict[str, Any],
) -> Dataset:
    """A text data set with a stratified, seeded split; `where` names the data in errors."""
    _check_test_fraction(test_fraction)
    documents = list(documents)
    X = np.empty(len(documents), dtype=object)
    X[:] = documents
    y = np.asarray(list(labels), dtype=str)
    try:
        X_train, X_test, y_train, y_test = _split(X, y, test_fraction, seed)
    except ValueError as error:
        fewest = _fewest(y)
        raise DatasetError(
            f"{where}: cannot make a stratified split of {len(y)} documents in "
            f"{len(set(y.tolist()))} classes with test fraction {test_fraction} "
            f"(smallest class: {fewest}): {error}"
        ) from None
    recorded = recorded | {"test_fraction": test_fraction, "seed": seed}
    return Dataset(name, TEXT_SPEC, X_train, y_train, X_test, y_test, source=recorded)


def _fewest(y: np.ndarray) -> str:
    classes, counts = np.unique(y, return_counts=True)
    at = int(np.argmin(counts))
    return f"{str(classes[at])!r} with {counts[at]} document{'s' if counts[at] != 1 else ''}"
