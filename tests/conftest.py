"""Shared fixtures: the digits data set and a default model trained once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.model import Predictor
from training.datasets import Dataset, load_digits_dataset
from training.fit import FitConfig, fit_besvm


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_digits_dataset()


@pytest.fixture(scope="session")
def digits_fit(digits: Dataset):
    """The default configuration, trained on the fixed digits split."""
    return fit_besvm(digits, FitConfig(), name="digits")


@pytest.fixture(scope="session")
def digits_model_dir(digits_fit, tmp_path_factory) -> Path:
    """The default digits model written as an artifact (read-only for tests: copy to modify)."""
    path = tmp_path_factory.mktemp("artifacts") / "digits"
    digits_fit.predictor.save(path)
    return path


@pytest.fixture(scope="session")
def digits_predictor(digits_model_dir: Path) -> Predictor:
    return Predictor.load(digits_model_dir)
