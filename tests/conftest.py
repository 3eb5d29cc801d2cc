"""Shared fixtures: the digits data set and a default model trained once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.model import Predictor
from service.model.inputs.spec import InputSpec
from training.datasets import Dataset, load_digits_dataset
from training.estimator import fit_dataset


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

    from training.cli import main

    path = tmp_path_factory.mktemp("artifacts") / "digits-search"
    shutil.copytree(digits_model_dir, path)
    assert main(["dictionary", "--model", str(path), "--quiet"]) == 0
    assert main(["index", "--model", str(path), "--quiet"]) == 0
    return path
