"""Shared fixtures: the digits data set and a default model trained once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.model import Predictor
from service.model.inputs.spec import InputSpec
from training.data.datasets import Dataset, load_digits_dataset
from training.fitting import fit_dataset


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_digits_dataset()


@pytest.fixture(scope="session")
def digits_fit(digits: Dataset):
    """The default configuration, trained on the fixed digits split."""
    return fit_dataset(digits, "digits")


@pytest.fixture(scope="session")
def digits_model_dir(digits_fit, tmp_path_factory) -> Path:
    """The default digits model written as an artifact (read-only for tests: copy to modify)."""
    path = tmp_path_factory.mktemp("artifacts") / "digits"
    digits_fit.predictor.save(path)
    return path


@pytest.fixture(scope="session")
def digits_predictor(digits_model_dir: Path) -> Predictor:
    return Predictor.load(digits_model_dir)


TOPICS = {
    "space": "rocket orbit planet moon launch star galaxy telescope astronaut comet",
    "food": "bread cheese butter apple soup recipe kitchen oven dinner pepper",
    "law": "court judge lawyer trial verdict appeal contract witness jury statute",
}


def _corpus(n_per_class: int, seed: int):
    rng = np.random.default_rng(seed)
    shared = ["the", "of", "people", "time", "world", "thing", "way", "day"]
    texts, labels = [], []
    for label, words in TOPICS.items():
        own = words.split()
        for _ in range(n_per_class):
            length = int(rng.integers(3, 25))
            pool = own * 2 + shared
            texts.append(" ".join(rng.choice(pool, size=length)).capitalize() + ".")
            labels.append(label)
    return np.array(texts, dtype=object), np.array(labels)


@pytest.fixture(scope="session")
def text_dataset() -> Dataset:
    """A small synthetic three-topic text corpus (for round trips and errors, not accuracy)."""
    X_train, y_train = _corpus(40, 0)
    X_test, y_test = _corpus(15, 1)
    return Dataset("topics", InputSpec("text", ()), X_train, y_train, X_test, y_test)


@pytest.fixture(scope="session")
def text_fit(text_dataset):
    config = dict(similarity="sensing1(n=150) + linear", basis_per_class=8, min_df=1)
    return fit_dataset(text_dataset, "topics", **config)


@pytest.fixture(scope="session")
def text_model_dir(text_fit, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("artifacts") / "topics"
    text_fit.predictor.save(path)
    return path


@pytest.fixture(scope="session")
def search_model_dir(digits_model_dir, tmp_path_factory) -> Path:
    """A copy of the digits model with its default US-SVM search model (64 atoms, 10 non-zeros
    per class) and a catalogue of the test split, built by the command line as ``make train``
    does (read-only for tests)."""
    import shutil

    from training.cli.main import main

    path = tmp_path_factory.mktemp("artifacts") / "digits-search"
    shutil.copytree(digits_model_dir, path)
    assert main(["dictionary", "--model", str(path), "--quiet"]) == 0
    assert main(["index", "--model", str(path), "--quiet"]) == 0
    return path


# -- images as bags of visual words (the bof transform) -----------------------------------------

GLYPH_SIDE = 32
GLYPH_BOF = "bof(patch=8, step=4, words=24, levels=1)"


@pytest.fixture(scope="session")
def glyphs() -> Dataset:
    """Letters A-J of the first 14 installed fonts that draw them all (Debian's font packages:
    make glyph-fonts), 32 x 32: 8 training and 6 test fonts per letter (real images, small
    enough for a fast fit)."""
    from training.data.glyphs import Glyphs, font_files, render_font, split_glyphs

    rows, names = [], []
    for path in font_files():
        images = render_font(path, size=GLYPH_SIDE, margin=2)
        if images is not None and not any(np.array_equal(images, row) for row in rows):
            rows.append(images)
            names.append(path.name)
        if len(rows) == 14:
            break
    assert len(rows) == 14, "too few fonts: install them with make glyph-fonts"
    arrays = split_glyphs(Glyphs(np.stack(rows), names, 0), 8, 6)
    spec = InputSpec("grid", (GLYPH_SIDE, GLYPH_SIDE, 1))

    def flat(X):
        return X.reshape(len(X), -1).astype(np.float64)

    return Dataset(
        "glyphs",
        spec,
        flat(arrays["X"]),
        arrays["y"],
        flat(arrays["X_test"]),
        arrays["y_test"],
        source={"path": "glyphs"},
    )


@pytest.fixture(scope="session")
def bof_fit(glyphs: Dataset):
    """Bags of visual words on a pyramid (sensing1 per cell) beside pixels (rbf), one basis."""
    return fit_dataset(
        glyphs,
        "glyphs",
        similarity=f"{GLYPH_BOF}: sensing1(n=50) + pixels: rbf",
        basis_per_class=4,
    )


@pytest.fixture(scope="session")
def bof_model_dir(bof_fit, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("artifacts") / "glyphs"
    bof_fit.predictor.save(path)
    return path
