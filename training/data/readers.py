"""Reading a user's data files, refusing what would hurt: ``.npz`` archives (no pickles, no
archive that inflates past :data:`MAX_NPZ_INFLATION` times its size), ``.csv`` tables, ``.jsonl``
documents, folders of text files per class, and Debian's fortune files. Each reader gives plain
arrays or lists; :mod:`training.data.datasets` makes data sets of them. Every refusal is a
:class:`DatasetError` naming the file.
"""

from __future__ import annotations

import csv
import json
import math
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from service.model import SpecError
from service.model.artifact import read_npy_header
from service.model.inputs.spec import InputSpec

# A line holding a single "%" (trailing blanks allowed) ends a quote in a fortune file.
_FORTUNE_SEPARATOR = re.compile(r"^%[^\S\n]*$", re.MULTILINE)


_FORTUNE_SKIPPED_SUFFIXES = (".dat", ".u8")


class DatasetError(ValueError):
    """A data set cannot be loaded; the message names the file and the problem."""


# A compressed member of an .npz larger than NPZ_INFLATION_FLOOR bytes that inflates to more
# than this many times its stored size is refused: deflate reaches about 1,000 on runs of one
# byte (a "zip bomb"), real arrays stay far below.
MAX_NPZ_INFLATION = 200


NPZ_INFLATION_FLOOR = 16 * 1024 * 1024


def read_npz(path: Path):
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path}: not a readable .npz archive (not a zip file)")
    try:
        _check_npz_members(path)
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise DatasetError(f"{path}: not a readable .npz archive ({error})") from None
    except ValueError as error:
        raise DatasetError(f"{path}: cannot read its arrays ({error})") from None
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


def _check_npz_members(path: Path) -> None:
    """Check every array of an .npz before any is read: what its header claims (shape, dtype)
    must be what its member holds, it may not need pickle, and a compressed member may not
    inflate beyond :data:`MAX_NPZ_INFLATION` times its size. Nothing is allocated from a
    header's claim."""
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            where = f"{path}: {info.filename}"
            stored = max(info.compress_size, 1)
            if info.file_size > max(NPZ_INFLATION_FLOOR, MAX_NPZ_INFLATION * stored):
                raise DatasetError(
                    f"{where} inflates from {info.compress_size:,} to {info.file_size:,} bytes, "
                    f"more than {MAX_NPZ_INFLATION} times: refused as a decompression bomb (if "
                    "the data is real, save it uncompressed with numpy.savez)"
                )
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                try:
                    shape, _, dtype = read_npy_header(member)
                except ValueError as error:
                    raise DatasetError(f"{where}: not a readable .npy array ({error})") from None
                header_bytes = member.tell()
            if dtype.hasobject:
                raise DatasetError(f"{where} holds Python objects, which need pickle: refused")
            claimed = math.prod(shape) * dtype.itemsize
            if header_bytes + claimed != info.file_size:
                raise DatasetError(
                    f"{where}: its header claims shape {shape} of {dtype} ({claimed:,} bytes), "
                    f"the file holds {info.file_size - header_bytes:,}"
                )


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


def read_csv(path: Path, label_column: str):
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


def file_input_spec(path: Path, X: np.ndarray, input_shape: str | None) -> InputSpec:
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


def fortune_files(root: Path) -> list[Path]:
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


def read_fortune_file(path: Path) -> list[str]:
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


def read_text_folder(path: Path) -> tuple[list[str], list[str]]:
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


def read_jsonl(path: Path) -> tuple[list[str], list[str]]:
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
