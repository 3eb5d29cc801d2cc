"""Data sets: the embedded default (scikit-learn's digits), Debian's fortunes, a user's own files.

Every data set comes split into train and test, with labels as strings (the API's form of a
class) and an :class:`InputSpec` saying how to read the inputs.

Numeric data sets (digits, a ``.npz`` or ``.csv`` file) hold inputs flattened to (n, d) float64.

Text data sets hold raw documents for a bag-of-words model: their input spec is ``text`` and
``X_train``/``X_test`` are 1-d object arrays of Python ``str``, one document each.

- ``"fortunes"``: the quotes of Debian's ``fortunes`` and ``fortunes-min`` packages
  (``/usr/share/games/fortunes``), labelled by category file; categories with fewer than 100
  quotes are dropped (32 categories, about 14,700 quotes).
- A folder holding one sub-folder per class, every (non-hidden) file in a sub-folder one
  document of that class.
- A ``.jsonl`` file, one ``{"text": ..., "label": ...}`` object a line.

Files without their own test split are split with a stratified, seeded ``train_test_split``;
a test fraction of 0 keeps every item for training (digits too: all 1,797), and
:func:`with_test_data` takes the test split from another file instead. ``Dataset.source``
records how to load the same data and split again.
"""

from __future__ import annotations

import csv
import json
import re
import stat
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from service.model import SpecError
from service.model.inputs.spec import InputSpec

DIGITS = "digits"
DIGITS_TRAIN_SIZE = 1000

FORTUNES = "fortunes"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNES_MIN_QUOTES = 100
TEXT_SPEC = InputSpec("text", ())

# A line holding a single "%" (trailing blanks allowed) ends a quote in a fortune file.
_FORTUNE_SEPARATOR = re.compile(r"^%[^\S\n]*$", re.MULTILINE)
_FORTUNE_SKIPPED_SUFFIXES = (".dat", ".u8")


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
    path = Path(source)
    if not path.exists():
        raise DatasetError(
            f"{path}: no such file or folder (and not a known data set name: {DIGITS}, "
            f"{FORTUNES}); expected a .npz, .csv or .jsonl file, or a folder holding one "
            "sub-folder of text files per class"
        )
    if path.is_dir() or path.suffix == ".jsonl":
        _refuse_input_shape(path, input_shape)
        if path.is_dir():
            name = path.resolve().name or str(path)
            documents, labels = _read_text_folder(path)
        else:
            name = path.stem
            documents, labels = _read_jsonl(path)
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
        X, y, explicit_test = _read_npz(path)
    elif path.suffix == ".csv":
        X, y, explicit_test = *_read_csv(path, label_column), None
    else:
        raise DatasetError(
            f"{path}: unsupported file type {path.suffix!r}; use .npz or .csv (numbers), "
            ".jsonl (text documents), a folder holding one sub-folder of text files per class, "
            f"or the name {FORTUNES!r}"
        )
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
    if isinstance(test_source, dict):
        test = load_dataset(test_source)
    else:
        test = load_dataset(
            test_source, test_fraction=0.0, input_shape=input_shape, label_column=label_column
        )
    if test.input_spec.is_documents != dataset.input_spec.is_documents or (
        not dataset.input_spec.is_documents
        and test.input_spec.n_features != dataset.input_spec.n_features
    ):
        raise DatasetError(
            f"test data {test.name} has input {test.input_spec}, the training data "
            f"{dataset.name} {dataset.input_spec}"
        )
    X_test = np.concatenate([test.X_train, test.X_test])
    y_test = np.concatenate([test.y_train, test.y_test])
    if len(y_test) == 0:
        raise DatasetError(f"test data {test.name} holds no items")
    source = {**dataset.source, "test_data": test.source}
    return Dataset(
        dataset.name, dataset.input_spec, dataset.X_train, dataset.y_train, X_test, y_test, source
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
    files = _fortune_files(root)
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
        quotes = _read_fortune_file(file)
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


def _fortune_files(root: Path) -> list[Path]:
    """The category files in `root`, sorted by name; empty if `root` is not a folder."""
    try:
        entries = sorted(root.iterdir(), key=lambda entry: entry.name)
    except OSError:  # missing, not a folder, unreadable
        return []
    return [
        entry
        for entry in entries
        if entry.suffix not in _FORTUNE_SKIPPED_SUFFIXES and _is_regular_file(entry)
    ]


def _is_regular_file(path: Path) -> bool:
    """A regular file itself, not a symbolic link to one."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _read_fortune_file(path: Path) -> list[str]:
    """The non-empty, stripped quotes of one fortune file."""
    text = _read_text(path)
    quotes = (quote.strip() for quote in _FORTUNE_SEPARATOR.split(text))
    return [quote for quote in quotes if quote]


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DatasetError(f"{path}: cannot read ({error.strerror or error})") from None
    return data.decode("utf-8", errors="replace")


def _read_text_folder(path: Path) -> tuple[list[str], list[str]]:
    """Documents and labels of a folder holding one sub-folder of text files per class."""
    try:
        folders = sorted(
            (entry for entry in path.iterdir() if entry.is_dir() and not _hidden(entry)),
            key=lambda entry: entry.name,
        )
    except OSError as error:
        raise DatasetError(f"{path}: cannot list the folder ({error.strerror or error})") from None
    if not folders:
        raise DatasetError(
            f"{path}: no class sub-folders; a text data set folder holds one sub-folder per class, "
            "each holding text files (one document a file)"
        )
    documents: list[str] = []
    labels: list[str] = []
    for folder in folders:
        try:
            files = sorted(
                (entry for entry in folder.iterdir() if entry.is_file() and not _hidden(entry)),
                key=lambda entry: entry.name,
            )
        except OSError as error:
            raise DatasetError(
                f"{folder}: cannot list the folder ({error.strerror or error})"
            ) from None
        documents += [_read_text(file) for file in files]
        labels += [folder.name] * len(files)
    holding = sorted(set(labels))
    if len(holding) < 2:
        raise DatasetError(
            f"{path}: needs at least 2 class sub-folders holding documents, found "
            f"{len(holding)}{' (' + holding[0] + ')' if holding else ''} "
            f"among sub-folders {[folder.name for folder in folders]}"
        )
    return documents, labels


def _hidden(path: Path) -> bool:
    return path.name.startswith(".")


def _read_jsonl(path: Path) -> tuple[list[str], list[str]]:
    """Documents and labels of a JSON Lines file of ``{"text": str, "label": str or int}``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DatasetError(f"{path}: cannot read ({error.strerror or error})") from None
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
    documents: list[str] = []
    labels: list[str] = []
    # Split on "\n" only: JSON strings may hold U+2028 and other characters that
    # str.splitlines() would take for line ends.
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DatasetError(f"{where}: not valid UTF-8 ({error.reason})") from None
        if not line.strip():
            continue
        document, label = _parse_jsonl_record(where, line)
        documents.append(document)
        labels.append(label)
    if not documents:
        raise DatasetError(
            f'{path}: no documents; expected one {{"text": ..., "label": ...}} object a line'
        )
    return documents, labels


def _parse_jsonl_record(where: str, line: str) -> tuple[str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise DatasetError(
            f'{where}: expected a JSON object {{"text": ..., "label": ...}}, '
            f"got {_json_type(record)}"
        )
    missing = [key for key in ("text", "label") if key not in record]
    if missing:
        raise DatasetError(
            f"{where}: missing {' and '.join(repr(key) for key in missing)}; "
            f"found keys {sorted(record)}"
        )
    text, label = record["text"], record["label"]
    if not isinstance(text, str):
        raise DatasetError(f'{where}: "text" must be a string, got {_json_type(text)}')
    if isinstance(label, bool) or not isinstance(label, str | int):
        raise DatasetError(
            f'{where}: "label" must be a string or an integer, got {_json_type(label)}'
        )
    label = str(label)
    if not label.strip():
        raise DatasetError(f'{where}: "label" is empty')
    return text, label


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


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
